"""Selection on small hand-made catalogs: matching rules, ranking, reasons, summaries."""

from __future__ import annotations

from typing import Any

import pytest

from providers.core.catalog import AttachableGpu, Catalog, GpuSpec, InstanceType
from providers.core.errors import InvalidRequest, NoMatch
from providers.core.request import InstanceRequest
from providers.core.selection import select

GIB = 1024


def it(name: str, vcpus: int, memory_gib: float, **extra: Any) -> InstanceType:
    gpu = extra.pop("gpu", None)
    if gpu is not None:
        model, count, memory_mib, *fraction = gpu
        extra["gpu"] = GpuSpec(
            model=model, count=count, memory_mib=memory_mib, fraction=fraction[0] if fraction else 1
        )
    return InstanceType(name=name, vcpus=vcpus, memory_mib=int(memory_gib * GIB), **extra)


def catalog(*types: InstanceType, cloud: str = "aws") -> Catalog:
    return Catalog(cloud=cloud, region="test-1", types=types)  # type: ignore[arg-type]


def req(**fields: Any) -> InstanceRequest:
    return InstanceRequest(**fields)


def names(c: Catalog, r: InstanceRequest) -> list[str]:
    return [cand.name for cand in select(c, r).candidates]


def test_caa_counter_example_full_scan() -> None:
    # CAA sorts by (GPUs, memory, vCPUs) and binary-searches a non-monotonic predicate: it finds
    # nothing here; a full scan finds c5.2xlarge.
    c = catalog(
        it("r5.xlarge", 4, 32),
        it("c5.2xlarge", 8, 16),
        it("x2iedn.xlarge", 4, 128),
    )
    selection = select(c, req(vcpus=8, memory_mib=8 * GIB))
    assert selection.selected.name == "c5.2xlarge"
    assert {r.name for r in selection.rejections} == {"r5.xlarge", "x2iedn.xlarge"}
    assert all("vCPUs" in r.reason for r in selection.rejections)


def test_price_ascending_estimates_for_unpriced_types_ties_by_name() -> None:
    # An unpriced type ranks by an estimate from its vCPUs and memory (providers.core.estimates:
    # 2 vCPUs and 4 GiB ~ $0.08/h), not after every priced type; names break ties.
    c = catalog(
        it("b.big", 16, 64, price_per_hour=0.5),
        it("a.small", 4, 16, price_per_hour=0.9),
        it("z.tiny", 2, 4),
        it("y.tiny", 2, 4),
        it("c.same", 16, 64, price_per_hour=0.5),
    )
    assert names(c, req()) == ["y.tiny", "z.tiny", "b.big", "c.same", "a.small"]
    candidates = select(c, req()).candidates
    assert candidates[0].price_estimated and "estimate" in candidates[0].reasons[1]
    assert "cheapest" in candidates[0].reasons[1]
    assert not candidates[2].price_estimated


def test_unpriced_types_rank_by_what_their_gpus_cost() -> None:
    # Public list prices: one H100 costs far more than one T4 (AWS p5.4xlarge $6.88/h vs
    # g4dn.xlarge $0.526/h), so unpriced T4 types beat a priced 8x H100 one; among them a
    # 32-vCPU host costs more than a second T4 (32 x $0.0315 + 128 GiB x $0.0042 > $0.33).
    c = catalog(
        it("g.2x", 8, 32, gpu=("t4", 2, 16384)),
        it("g.1x-big", 32, 128, gpu=("t4", 1, 16384)),
        it("g.1x", 4, 16, gpu=("t4", 1, 16384)),
        it("h.8x", 192, 2048, gpu=("h100-80gb", 8, 81920), price_per_hour=55.04),
    )
    assert names(c, req(gpus=1)) == ["g.1x", "g.2x", "g.1x-big", "h.8x"]
    first = select(c, req(gpus=1)).selected
    assert first.reasons[1].startswith("cheapest of 4 at ~$")


H100 = ("h100-80gb", 8, 81920)
C = catalog(
    it("m.large", 2, 8, price_per_hour=0.1),
    it("m.arm", 2, 8, arch="arm64", price_per_hour=0.05),
    it("p5.48xlarge", 192, 2048, gpu=H100, rdma="efa", price_per_hour=55.0),
    it("p5.4xlarge", 16, 256, gpu=("h100-80gb", 1, 81920), price_per_hour=6.88),
    it("p4d.24xlarge", 96, 1152, gpu=("a100-40gb", 8, 40960), rdma="efa", price_per_hour=21.9),
    it("p4de.24xlarge", 96, 1152, gpu=("a100-80gb", 8, 81920), rdma="efa", price_per_hour=27.4),
    it("g6.xlarge", 4, 16, gpu=("l4", 1, 22888), price_per_hour=0.80),
    it("g6f.large", 2, 8, gpu=("l4", 1, 2861, 0.125), price_per_hour=0.20),
    it("g5g.xlarge", 4, 8, arch="arm64", gpu=("t4g", 1, 16384), price_per_hour=0.42),
    it("g4dn.xlarge", 4, 16, gpu=("t4", 1, 16384), price_per_hour=0.53),
)


@pytest.mark.parametrize(
    ("request_fields", "expected"),
    [
        ({"gpus": 1, "gpu_models": ("h100",)}, "p5.4xlarge"),
        ({"gpus": 8, "gpu_models": ("h100",)}, "p5.48xlarge"),
        ({"gpus": 1, "gpu_models": ("a100-80gb",)}, "p4de.24xlarge"),
        ({"gpus": 1, "gpu_models": ("a100",)}, "p4d.24xlarge"),
        ({"gpus": 1, "gpu_models": ("NVIDIA L4",)}, "g6.xlarge"),
        ({"gpus": 1, "gpu_models": ("l4",), "fractional": True}, "g6f.large"),
        ({"gpus": 1, "gpu_models": ("t4", "l4")}, "g4dn.xlarge"),
        ({"gpus": 1, "gpu_memory_mib": 20 * GIB}, "g6.xlarge"),
        # L4 is sold as 24 GB; AWS reports 22888 MiB for it (DescribeInstanceTypes): short of
        # 23Gi and 24Gi, so the next GPU with that much memory
        ({"gpus": 1, "gpu_memory_mib": 22888}, "g6.xlarge"),
        ({"gpus": 1, "gpu_memory_mib": 23 * GIB}, "p5.4xlarge"),
        ({"gpus": 1, "gpu_memory_mib": 24 * GIB}, "p5.4xlarge"),
        ({"gpus": 1, "gpu_memory_mib": 40 * GIB}, "p5.4xlarge"),
        ({"gpus": 1, "rdma": True}, "p4d.24xlarge"),
        ({"mig": {"1g.10gb": 2}}, "p5.4xlarge"),
        ({"mig": {"1g.10gb": 8}}, "p4d.24xlarge"),  # 2-slot on a 40 GB part: 2 GPUs of 8
        ({"mig": {"1g.10gb": 8}, "gpu_models": ("h100",)}, "p5.48xlarge"),
        ({"mig": {"3g.40gb": 1, "4g.40gb": 1}}, "p5.4xlarge"),
        ({"mig": {"3g.40gb": 2, "1g.10gb": 1}}, "p4de.24xlarge"),  # 2 GPUs: not a p5.4xlarge
        ({"gpus": 1, "arch": "arm64"}, "g5g.xlarge"),
        ({"vcpus": 2}, "m.large"),  # never the cheaper arm64 type for an x86_64 image
        ({"vcpus": 2, "arch": "arm64"}, "m.arm"),
        ({}, "m.large"),  # no GPU asked: GPU types are not candidates
    ],
)
def test_common_asks(request_fields: dict[str, Any], expected: str) -> None:
    selection = select(C, req(**request_fields))
    assert selection.selected.name == expected
    assert selection.selected.reasons[0].startswith("fits: ")


def test_mig_layout_and_gpus_used() -> None:
    chosen = select(C, req(mig={"3g.40gb": 2, "1g.10gb": 1})).selected
    assert chosen.mig_layout is not None
    assert chosen.gpus_used == 2 == chosen.mig_layout.gpus_used
    assert sorted(p.profile for p in chosen.mig_layout.placements) == [
        "1g.10gb",
        "3g.40gb",
        "3g.40gb",
    ]
    # whole GPUs plus MIG devices on the others
    mixed = select(C, req(gpus=7, mig={"1g.10gb": 7}, gpu_models=("h100",))).selected
    assert mixed.name == "p5.48xlarge" and mixed.gpus_used == 8


def test_fractional_only_when_allowed_and_only_for_one_gpu() -> None:
    assert "g6f.large" not in names(C, req(gpus=1, gpu_models=("l4",)))
    assert "g6f.large" in names(C, req(gpus=1, gpu_models=("l4",), fractional=True))
    selection = select(C, req(gpus=2, gpu_models=("l4",), fractional=True))
    with pytest.raises(NoMatch):
        _ = selection.selected
    rejected = {r.name: r.reason for r in selection.rejections}
    assert "cannot serve 2 GPUs" in rejected["g6f.large"]
    assert (
        "fractional GPUs not allowed"
        in {r.name: r.reason for r in select(C, req(gpus=1, gpu_models=("l4",))).rejections}[
            "g6f.large"
        ]
    )


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"gpus": 16, "gpu_models": ("h100",)}, "16 h100-80gb GPUs exceed the largest type, 8"),
        ({"mig": {"9g.99gb": 1}}, "no type offers MIG profile 9g.99gb"),
        ({"gpus": 1, "gpu_models": ("b200",)}, "no type offers GPU model b200"),
        ({"gpus": 1, "gpu_memory_mib": 200 * GIB}, "no GPU has 200 GiB"),
        ({"gpus": 1, "gpu_models": ("t4g",)}, "not for x86_64 images"),
        ({"gpus": 1, "gpu_models": ("l4",), "rdma": True}, "no matching type has RDMA"),
        ({"vcpus": 512}, "512 vCPUs exceed the largest matching type, 2"),
        ({"gpus": 1, "gpu_models": ("h100",), "vcpus": 400}, "exceed the largest matching type"),
        ({"memory_mib": 4096 * GIB, "gpus": 1}, "memory exceeds the largest matching type"),
        ({"gpus": 1, "gpu_models": ("h100",), "deny": ("p5.*",)}, "allow/deny lists"),
        ({"gpus": 1, "gpu_models": ("h100",), "allow": ("g6.*",)}, "allow/deny lists"),
        ({"mig": {"1g.10gb": 57}}, "MIG devices 1g.10gb=57 need more"),
    ],
)
def test_impossible_requests_summarise(request_fields: dict[str, Any], message: str) -> None:
    selection = select(C, req(**request_fields))
    assert selection.candidates == []
    with pytest.raises(NoMatch) as info:
        _ = selection.selected
    assert message in str(info.value), str(info.value)
    assert info.value.reasons, "the reasons list the rejections"
    assert len(selection.rejections) == len(C.types)
    assert all(r.reason for r in selection.rejections)


def test_unknown_model_is_invalid_not_no_match() -> None:
    with pytest.raises(InvalidRequest, match="unknown GPU model"):
        select(C, req(gpus=1, gpu_models=("h900",)))


def test_allow_deny_globs() -> None:
    r = req(gpus=1, gpu_models=("h100",))
    assert names(C, r.model_copy(update={"deny": ("p5.4x*",)})) == ["p5.48xlarge"]
    assert names(C, r.model_copy(update={"allow": ("p5.48*", "g6.*")})) == ["p5.48xlarge"]
    assert names(C, req(allow=("m.*",), arch="arm64")) == ["m.arm"]


def test_explicit_instance_type() -> None:
    assert names(C, req(instance_type="p4d.24xlarge", gpus=1)) == ["p4d.24xlarge"]
    with pytest.raises(NoMatch, match="not in the aws test-1 catalog"):
        select(C, req(instance_type="p9.huge"))
    refused = select(C, req(instance_type="p4d.24xlarge", allow=("p5.*",)))
    with pytest.raises(NoMatch, match="allow/deny"):
        _ = refused.selected
    assert refused.rejections[0].reason == "not in the allow list"
    too_small = select(C, req(instance_type="g6.xlarge", gpus=2))
    with pytest.raises(NoMatch, match="exceed"):
        _ = too_small.selected


def test_zone_offerings() -> None:
    c = catalog(
        it("a.1", 4, 16, zones=("z-1a", "z-1b"), price_per_hour=0.3),
        it("b.1", 4, 16, zones=("z-1b",), price_per_hour=0.1),
        it("c.1", 4, 16, price_per_hour=0.01),  # no zones where others have some: not offered
    )
    assert names(c, req()) == ["b.1", "a.1"]
    assert names(c, req(zone="z-1a")) == ["a.1"]
    rejected = {r.name: r.reason for r in select(c, req(zone="z-1a")).rejections}
    assert rejected == {"b.1": "not offered in zone z-1a", "c.1": "not offered in this region"}
    with pytest.raises(NoMatch, match="offered in zone z-1c"):
        _ = select(c, req(zone="z-1c")).selected
    # a catalog without any zones: region-wide, the zone cannot be checked
    assert names(catalog(it("x.1", 1, 1)), req(zone="anything")) == ["x.1"]


def test_gcp_n1_attachable_gpus() -> None:
    t4 = AttachableGpu(model="t4", memory_mib=16384, counts=(1, 2, 4))
    v100 = AttachableGpu(model="v100", memory_mib=16384, counts=(1, 2, 4, 8), zones=("z-a",))
    c = catalog(
        it("n1-standard-4", 4, 15, attachable_gpus=(t4, v100), zones=("z-a", "z-b")),
        it("n1-standard-8", 8, 30, attachable_gpus=(t4,), zones=("z-a", "z-b")),
        it("g2-standard-4", 4, 16, gpu=("l4", 1, 24576), zones=("z-a", "z-b")),
        cloud="gcp",
    )
    chosen = select(c, req(gpus=3, gpu_models=("t4",))).selected
    assert (chosen.name, chosen.attach_gpus, chosen.gpus) == ("n1-standard-4", 4, 4)
    assert "attach 4 x t4" in chosen.reasons[0]
    v = select(c, req(gpus=8, gpu_models=("v100",))).selected
    assert (v.name, v.attach_gpus) == ("n1-standard-4", 8)
    with pytest.raises(NoMatch, match="16 v100 GPUs exceed the largest type, 8"):
        _ = select(c, req(gpus=16, gpu_models=("v100",))).selected
    with pytest.raises(NoMatch, match="offered in zone z-b"):
        _ = select(c, req(gpus=1, gpu_models=("v100",), zone="z-b")).selected
    # no GPU asked: N1 types serve with nothing attached
    plain = select(c, req(vcpus=4)).selected
    assert plain.name == "n1-standard-4" and plain.attach_gpus == 0
    # an unpriced attachment never outranks a bundled type by accident: smallest fit first
    assert names(c, req(gpus=1))[0] in {"n1-standard-4", "g2-standard-4"}


def test_candidates_and_rejections_partition_the_catalog() -> None:
    for fields in ({}, {"gpus": 1}, {"mig": {"1g.10gb": 3}}, {"vcpus": 16, "rdma": True}):
        selection = select(C, req(**fields))
        chosen = {c.name for c in selection.candidates}
        rejected = {r.name for r in selection.rejections}
        assert not chosen & rejected
        assert chosen | rejected == {t.name for t in C.types}
        assert selection.count == len(chosen)


def test_top_builds_only_what_is_asked() -> None:
    selection = select(C, req(gpus=1))
    top = selection.top(2)
    assert "candidates" not in selection.__dict__
    assert top == selection.candidates[:2] and len(top) == 2
    assert selection.top(100) == selection.candidates
    assert select(C, req(gpus=99)).top(3) == []


def test_failure_summary_does_not_depend_on_what_was_built() -> None:
    for fields in (
        {"gpus": 16, "gpu_models": ("h100",)},
        {"mig": {"9g.99gb": 1}},
        {"vcpus": 512},
        {"gpus": 1, "gpu_models": ("h100",), "deny": ("p5.*",)},
    ):
        fresh = select(C, req(**fields))
        with pytest.raises(NoMatch) as before:
            _ = fresh.selected
        built = select(C, req(**fields))
        _ = built.rejections
        with pytest.raises(NoMatch) as after:
            _ = built.selected
        assert str(before.value) == str(after.value) == fresh.summary()
