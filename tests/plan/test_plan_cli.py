"""`peerpods plan` on the bundled examples: the real decision, table and JSON, on three clouds."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from adaptor.cli.main import main
from providers.core.contract import (
    DEFAULT_GPU_MODEL,
    DEFAULT_GPUS,
    DEVICES,
    VM_RESOURCE,
    ContainerPlan,
    decode_gpu_model,
)
from providers.core.gpus import GPU_MODELS
from providers.core.mig import profiles_for
from providers.core.snapshots import load_catalog

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "config" / "examples"
ALL_EXAMPLES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def plan_json(capsys: pytest.CaptureFixture[str], example: str, *argv: str) -> dict[str, Any]:
    code, out, err = plan(capsys, str(EXAMPLES / example), "--output", "json", *argv)
    assert code == 0, err
    assert not err
    data: dict[str, Any] = json.loads(out)
    assert data["ok"] and data["failure"] is None and data["peer_pod"]
    return data


def chosen(data: dict[str, Any]) -> dict[str, Any]:
    first: dict[str, Any] = data["selection"]["candidates"][0]
    assert first["name"] == data["selected"]
    return first


def devices_of(data: dict[str, Any]) -> dict[str, list[str]]:
    return {c["name"]: c["cdi"] for c in data["containers"]}


def original_pod(example: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / example).read_text()) if d]
    return next(d for d in docs if d["kind"] == "Pod")


def test_every_example_is_covered() -> None:
    assert ALL_EXAMPLES == [
        "dra-pod.yaml",
        "gpu-pod.yaml",
        "mig-pod.yaml",
        "rdma-training-pod.yaml",
    ]


@pytest.mark.parametrize("example", ["dra-pod.yaml", "gpu-pod.yaml", "mig-pod.yaml"])
@pytest.mark.parametrize("provider", ["aws", "azure", "gcp"])
def test_patch_and_annotations_are_what_the_adaptor_reads(
    capsys: pytest.CaptureFixture[str], example: str, provider: str
) -> None:
    data = plan_json(capsys, example, "--provider", provider)
    pod = original_pod(example)
    mutated = jsonpatch.apply_patch(copy.deepcopy(pod), data["patch"])
    annotations = mutated["metadata"]["annotations"]
    assert annotations == data["annotations"]
    # the node-level resources are gone, the VM resource is on the first container
    first = dict(mutated["spec"]["containers"][0]["resources"]["limits"])
    quota = {
        k: first.pop(k) for k in ("kata.peerpods.io/gpu", "kata.peerpods.io/mig") if k in first
    }
    assert first == {VM_RESOURCE: "1"}
    assert "resourceClaims" not in mutated["spec"]
    text = json.dumps(mutated["spec"])
    assert "nvidia.com/gpu" not in text and "nvidia.com/mig-" not in text
    # the contract decodes to the intent the plan selected with
    gpu = decode_gpu_model(
        annotations.get(DEFAULT_GPU_MODEL, ""), int(annotations.get(DEFAULT_GPUS, "0"))
    )
    assert gpu.model_dump(mode="json") == data["intent"]["gpu"]
    # what namespace quotas count: the whole GPUs and MIG devices the pod asked for
    assert quota.get("kata.peerpods.io/gpu") == (str(gpu.gpus) if gpu.gpus else None)
    mig = sum(gpu.mig.values())
    assert quota.get("kata.peerpods.io/mig") == (str(mig) if mig else None)
    container_plan = ContainerPlan.decode(annotations[DEVICES])
    assert container_plan.model_dump(mode="json") == data["container_plan"]
    # the selected type is the cheapest candidate (where prices are known)
    prices = [c["price_per_hour"] for c in data["selection"]["candidates"]]
    if prices[0] is not None:
        assert prices[0] == min(p for p in prices if p is not None)
    assert data["provider"] == provider


def test_gpu_pod_one_gpu_for_the_cuda_container(capsys: pytest.CaptureFixture[str]) -> None:
    data = plan_json(capsys, "gpu-pod.yaml")
    first = chosen(data)
    assert first["gpus"] == 1 and first["price_per_hour"] is not None
    assert data["annotations"][DEFAULT_GPUS] == "1"
    assert devices_of(data) == {"cuda": ["peerpods.io/gpu=gpu0"], "log-shipper": []}
    assert data["mig_layout"] == []
    # 4 + 0.25 vCPUs rounded up; 16Gi + 128Mi
    assert data["intent"]["vcpus"] == 5 and data["intent"]["memory_mib"] == 16 * 1024 + 128


@pytest.mark.parametrize("provider", ["aws", "azure", "gcp"])
def test_mig_pod_lays_out_two_1g10gb_and_one_3g40gb(
    capsys: pytest.CaptureFixture[str], provider: str
) -> None:
    data = plan_json(capsys, "mig-pod.yaml", "--provider", provider)
    first = chosen(data)
    model = first["gpu_model"]
    assert {"1g.10gb", "3g.40gb"} <= set(profiles_for(model)), model
    layout = data["mig_layout"]
    assert sorted(m["profile"] for m in layout) == ["1g.10gb", "1g.10gb", "3g.40gb"]
    assert {m["gpu"] for m in layout} == {0}  # they fit one GPU together
    spans = sorted(
        (m["start"], m["start"] + profiles_for(model)[m["profile"]].memory_slots) for m in layout
    )
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
    by_name = {m["name"]: m["profile"] for m in layout}
    devices = devices_of(data)
    assert [by_name[n] for n in devices["small-model"]] == ["1g.10gb", "1g.10gb"]
    assert [by_name[n] for n in devices["large-model"]] == ["3g.40gb"]
    assert len(set(devices["small-model"]) | set(devices["large-model"])) == 3
    assert data["annotations"][DEFAULT_GPU_MODEL] == "v1:mig=1g.10gb:2,3g.40gb:1"
    assert DEFAULT_GPUS not in data["annotations"]  # no whole GPU is asked for


@pytest.mark.parametrize("provider", ["aws", "azure", "gcp"])
def test_dra_pod_one_big_gpu_shared_by_both_containers(
    capsys: pytest.CaptureFixture[str], provider: str
) -> None:
    data = plan_json(capsys, "dra-pod.yaml", "--provider", provider)
    first = chosen(data)
    info = GPU_MODELS[first["gpu_model"]]
    assert "H100" in info.product_name or "H200" in info.product_name
    assert first["gpu_memory_mib"] >= 40 * 1024
    assert data["intent"]["gpu"]["gpus"] == 1
    devices = devices_of(data)
    assert devices["trainer"] == devices["profiler"] == ["peerpods.io/gpu=gpu0"]
    assert data["devices"]["gpus"] == ["peerpods.io/gpu=gpu0"]
    # every candidate honours the claim's selectors
    for candidate in data["selection"]["candidates"]:
        name = GPU_MODELS[candidate["gpu_model"]].product_name
        assert "H100" in name or "H200" in name


@pytest.mark.parametrize(("provider", "rdma"), [("aws", "efa"), ("azure", "infiniband")])
def test_rdma_pod_eight_h100_with_rdma(
    capsys: pytest.CaptureFixture[str], provider: str, rdma: str
) -> None:
    data = plan_json(capsys, "rdma-training-pod.yaml", "--provider", provider)
    first = chosen(data)
    assert first["gpus"] == 8 and first["rdma"] == rdma
    assert "H100" in GPU_MODELS[first["gpu_model"]].product_name
    devices = devices_of(data)
    assert devices["fetch-dataset"] == []
    trainer = devices["trainer"]
    assert sorted(n for n in trainer if n.startswith("peerpods.io/gpu=")) == [
        f"peerpods.io/gpu=gpu{i}" for i in range(8)
    ]
    assert [n for n in trainer if n.startswith("rdma.")] == ["rdma.peerpods.io/hca=0"]
    assert [c["init"] for c in data["containers"]] == [True, False]


def test_rdma_pod_on_gcp_is_denied_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    example = str(EXAMPLES / "rdma-training-pod.yaml")
    code, out, err = plan(capsys, example, "--provider", "gcp")
    assert code == 1
    assert err.count("\n") == 1 and "RDMA" in err and err.startswith("peerpods plan: denied (403)")
    assert "Traceback" not in out + err
    code, out, err = plan(capsys, example, "--provider", "gcp", "--output", "json")
    assert code == 1
    data = json.loads(out)
    assert not data["ok"] and data["failure"]["stage"] == "admission"
    assert data["failure"]["code"] == 403 and "RDMA" in data["failure"]["message"]
    assert data["selection"] is None and data["containers"] == []


@pytest.mark.parametrize("example", ALL_EXAMPLES)
def test_table_shows_the_same_decision_as_json(
    capsys: pytest.CaptureFixture[str], example: str
) -> None:
    provider = "azure" if example.startswith("rdma") else "aws"
    data = plan_json(capsys, example, "--provider", provider)
    code, out, err = plan(capsys, str(EXAMPLES / example), "--provider", provider)
    assert code == 0 and not err
    lines = out.splitlines()
    name = data["pod"]["name"]
    assert lines[0].startswith(f"pod {data['pod']['namespace']}/{name}  ({provider} ")
    assert f"selected: {data['selected']}  ({provider}" in out
    for key, value in data["annotations"].items():
        assert f"  {key}: {value}" in lines
    section = lines[lines.index("CDI devices per container:") + 2 :]
    rows = {row.split()[0]: row for row in section}
    for container in data["containers"]:
        row = rows[container["name"]]
        for device in container["cdi"] or ["-"]:
            assert device in row
    if data["mig_layout"]:
        assert "MIG layout:" in lines
        for m in data["mig_layout"]:
            assert any(
                line.split() == [str(m["gpu"]), str(m["start"]), m["profile"], m["name"]]
                for line in lines
            )


def test_the_catalog_is_the_one_named(capsys: pytest.CaptureFixture[str]) -> None:
    data = plan_json(capsys, "gpu-pod.yaml", "--provider", "aws", "--region", "us-west-2")
    assert data["region"] == "us-west-2"
    catalog = load_catalog("aws", "us-west-2")
    names = {t.name for t in catalog.types}
    assert all(c["name"] in names for c in data["selection"]["candidates"])
