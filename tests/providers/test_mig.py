"""The MIG packer: NVIDIA's MIG placement rules (docs/gpus.md), and agreement with a brute-force
search."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from providers.core.gpus import GPU_MODELS
from providers.core.mig import (
    MIG_PROFILES,
    MigPlacement,
    geometry,
    min_gpus,
    pack,
    place_one_gpu,
    profiles_for,
)


def _valid_layout(
    model: str, wanted: Mapping[str, int], layout_gpus: int, placements: Sequence[MigPlacement]
) -> None:
    specs = profiles_for(model)
    found = geometry(model)
    assert found is not None
    slots, compute = found
    counts: dict[str, int] = {}
    for gpu in range(layout_gpus):
        mine = [p for p in placements if p.gpu == gpu]
        assert mine, "a GPU counted as used carries nothing"
        used: set[int] = set()
        for p in mine:
            spec = specs[p.profile]
            assert p.start in spec.starts
            span = set(range(p.start, p.start + spec.memory_slots))
            assert max(span) < slots
            assert not used & span, f"overlap on GPU {gpu}"
            used |= span
        assert sum(specs[p.profile].compute_slices for p in mine) <= compute
        assert sum(1 for p in mine if specs[p.profile].media_extensions) <= 1
    for p in placements:
        counts[p.profile] = counts.get(p.profile, 0) + 1
    assert counts == dict(wanted)


@pytest.mark.parametrize(
    ("profiles", "fits"),
    [
        ({"3g.40gb": 1, "4g.40gb": 1}, True),  # 3g+4g fits one GPU
        ({"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, True),
        ({"3g.40gb": 2, "1g.10gb": 1}, False),  # 2x3g uses every memory slot
        ({"1g.10gb": 7}, True),
        ({"1g.10gb": 8}, False),
        ({"1g.20gb": 4}, True),
        ({"1g.20gb": 5}, False),
        ({"2g.20gb": 3}, True),
        ({"2g.20gb": 3, "1g.10gb": 1}, True),  # 2g at 0,2,4 and a 1-slot at 6
        ({"4g.40gb": 2}, False),
        ({"7g.80gb": 1}, True),
        ({"7g.80gb": 1, "1g.10gb": 1}, False),
        ({"1g.10gb+me": 2}, False),  # at most one +me
        ({"1g.10gb+me": 1, "1g.10gb": 6}, True),
    ],
)
def test_one_gpu_rules_a100_80gb(profiles: dict[str, int], fits: bool) -> None:
    assert (place_one_gpu("a100-80gb", profiles) is not None) is fits


def test_same_name_differs_between_models() -> None:
    # 1g.10gb: one memory slot on an A100-80GB (7 per GPU), two on an A100-40GB (4 per GPU).
    assert min_gpus("a100-80gb", {"1g.10gb": 7}) == 1
    assert min_gpus("a100-40gb", {"1g.10gb": 7}) == 2
    assert min_gpus("a100-40gb", {"1g.10gb": 8}) == 2
    assert min_gpus("h100-80gb", {"1g.10gb": 8}) == 2


def test_packing_is_not_division() -> None:
    # By compute (14/7) and memory (18/8 -> 3) division says 2 or 3; placement says 3: two GPUs
    # hold the four 3g.40gb with every memory slot taken, the 1g.10gb need a third.
    assert min_gpus("a100-80gb", {"3g.40gb": 4, "1g.10gb": 2}) == 3
    # compute 7/7 and memory 9/8 per GPU: not one GPU, but two
    assert min_gpus("a100-80gb", {"3g.40gb": 2, "1g.10gb": 1}) == 2
    # 4g.40gb alone per GPU: max 1 per GPU even though 2 x 4 slots fill the memory axis
    assert min_gpus("a100-80gb", {"4g.40gb": 2}) == 2
    assert min_gpus("a100-80gb", {"4g.40gb": 1, "3g.40gb": 3}) == 2


def test_layout_is_placeable_and_complete() -> None:
    wanted = {"3g.40gb": 3, "2g.20gb": 2, "1g.10gb": 5}
    layout = pack("h100-80gb", wanted)
    assert layout is not None
    _valid_layout("h100-80gb", wanted, layout.gpus_used, layout.placements)
    assert [len(g) for g in layout.per_gpu()] == [
        sum(1 for p in layout.placements if p.gpu == i) for i in range(layout.gpus_used)
    ]


def test_limits_and_unknowns() -> None:
    assert pack("a100-80gb", {"1g.10gb": 14}, gpus=2) is not None
    assert pack("a100-80gb", {"1g.10gb": 15}, gpus=2) is None
    assert pack("a100-80gb", {"9g.99gb": 1}) is None
    assert pack("t4", {"1g.10gb": 1}) is None
    assert min_gpus("l4", {"1g.10gb": 1}) is None
    assert pack("a100-80gb", {}) is None
    assert pack("a100-80gb", {"1g.10gb": 1}, gpus=0) is None


def test_a30_geometry() -> None:
    assert min_gpus("a30", {"1g.6gb": 4}) == 1
    assert min_gpus("a30", {"1g.6gb": 5}) == 2
    assert min_gpus("a30", {"2g.12gb": 1, "1g.6gb": 2}) == 1
    assert min_gpus("a30", {"4g.24gb": 1, "1g.6gb": 1}) == 2


# NVIDIA's MIG user guide, "Supported MIG Profiles": the profile names of each part, and the
# four-slice parts' media-extension rows (A30: 1g.6gb+me from R470, 2g.12gb+me from R525).
@pytest.mark.parametrize(
    ("model", "names"),
    [
        ("a30", ["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"]),
        ("rtx-pro-6000", ["1g.24gb", "1g.24gb+me", "2g.48gb", "4g.96gb"]),
        ("gh200", ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"]),
        (
            "gb200",
            ["1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"],
        ),
        (
            "b300",
            ["1g.34gb", "1g.34gb+me", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"],
        ),
    ],
)
def test_new_tables_from_the_mig_guide(model: str, names: list[str]) -> None:
    assert sorted(profiles_for(model)) == sorted(names)
    assert GPU_MODELS[model].mig_profiles  # the model knows its table


def test_four_slice_parts() -> None:
    # "Max Number of Instances" 4 for A30 and RTX PRO 6000 Blackwell (MIG guide, Supported GPUs)
    assert geometry("a30") == geometry("rtx-pro-6000") == (4, 4)
    assert min_gpus("rtx-pro-6000", {"1g.24gb": 4}) == 1
    assert min_gpus("rtx-pro-6000", {"1g.24gb": 5}) == 2
    assert min_gpus("rtx-pro-6000", {"2g.48gb": 1, "1g.24gb": 2}) == 1
    assert min_gpus("rtx-pro-6000", {"4g.96gb": 1, "1g.24gb": 1}) == 2
    # one +me per GPU: the A30 has one JPEG decoder and one OFA
    assert min_gpus("a30", {"1g.6gb+me": 1, "2g.12gb+me": 1}) == 2
    assert min_gpus("a30", {"2g.12gb+me": 1, "2g.12gb": 1}) == 1
    assert min_gpus("a30", {"1g.6gb+me": 1, "1g.6gb": 3}) == 1


def test_seven_slice_parts_share_the_geometry() -> None:
    # 3g+4g fits one GPU, 2x3g+1g does not (NVIDIA's MIG placement rules), whatever the names
    for model, three, four, one in (
        ("gb200", "3g.93gb", "4g.93gb", "1g.23gb"),
        ("b300", "3g.135gb", "4g.135gb", "1g.34gb"),
        ("gh200", "3g.48gb", "4g.48gb", "1g.12gb"),
    ):
        assert min_gpus(model, {three: 1, four: 1}) == 1
        assert min_gpus(model, {three: 2, one: 1}) == 2


def test_every_table_row_alone_hits_its_max() -> None:
    for model, specs in MIG_PROFILES.items():
        for spec in specs:
            assert min_gpus(model, {spec.name: spec.max_per_gpu}) == 1, (model, spec.name)
            assert min_gpus(model, {spec.name: spec.max_per_gpu + 1}) == 2, (model, spec.name)


# --- brute force -----------------------------------------------------------------------------


def _fits_brute(model: str, items: list[str]) -> bool:
    """Every combination of starts, checked directly."""
    specs = profiles_for(model)
    found = geometry(model)
    assert found is not None
    slots, compute = found
    if sum(specs[i].compute_slices for i in items) > compute:
        return False
    if sum(1 for i in items if specs[i].media_extensions) > 1:
        return False
    for starts in itertools.product(*(specs[i].starts for i in items)):
        used = [0] * (slots + 8)
        for item, start in zip(items, starts, strict=True):
            for s in range(start, start + specs[item].memory_slots):
                used[s] += 1
        if max(used) <= 1 and not any(used[slots:]):
            return True
    return False


def _min_gpus_brute(model: str, items: list[str], limit: int) -> int | None:
    """Try every assignment of items to k GPUs, k = 1, 2, ... limit."""
    for k in range(1, limit + 1):
        for assignment in itertools.product(range(k), repeat=len(items)):
            if assignment and assignment[0] != 0:
                continue  # symmetry: the first item on GPU 0
            groups: list[list[str]] = [[] for _ in range(k)]
            for item, gpu in zip(items, assignment, strict=True):
                groups[gpu].append(item)
            if all(_fits_brute(model, g) for g in groups):
                return k
    return None


_MODELS = ["a100-40gb", "a100-80gb", "h200", "a30", "rtx-pro-6000", "gb200", "b300", "gh200"]


@st.composite
def _requests(draw: st.DrawFn) -> tuple[str, dict[str, int]]:
    model = draw(st.sampled_from(_MODELS))
    names = [s.name for s in MIG_PROFILES[model]]
    chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=6))
    counts: dict[str, int] = {}
    for name in chosen:
        counts[name] = counts.get(name, 0) + 1
    return model, counts


@settings(max_examples=60, deadline=None)
@given(_requests())
def test_packer_agrees_with_brute_force(case: tuple[str, dict[str, int]]) -> None:
    model, counts = case
    items = [name for name, n in counts.items() for _ in range(n)]
    expected = _min_gpus_brute(model, items, limit=len(items))
    layout = pack(model, counts)
    assert layout is not None and expected is not None
    assert layout.gpus_used == expected
    _valid_layout(model, counts, layout.gpus_used, layout.placements)
    assert (place_one_gpu(model, counts) is not None) == (expected == 1)
    # a GPU limit below the minimum is refused; at the minimum it is met
    assert pack(model, counts, gpus=expected) is not None
    if expected > 1:
        assert pack(model, counts, gpus=expected - 1) is None


# The new tables reach selection on every cloud selling the part (AWS G7e and GCP G4 carry the
# RTX PRO 6000 Blackwell Server Edition, AWS P6e-GB200, Azure ND GB200 v6 and GCP A4X the GB200,
# AWS P6-B300 the B300; GB200 hosts are Arm): the profile names are the MIG guide's.
@pytest.mark.parametrize(
    ("cloud", "region", "mig", "arch", "model"),
    [
        ("aws", "us-east-1", {"1g.24gb": 2}, "x86_64", "rtx-pro-6000"),
        ("gcp", "us-central1", {"1g.24gb": 2}, "x86_64", "rtx-pro-6000"),
        ("aws", "us-east-1", {"3g.93gb": 2}, "arm64", "gb200"),
        ("azure", "eastus", {"3g.93gb": 2}, "arm64", "gb200"),
        ("gcp", "us-central1", {"3g.93gb": 2}, "arm64", "gb200"),
        ("aws", "us-east-1", {"2g.67gb": 3}, "x86_64", "b300"),
    ],
)
def test_new_tables_select_on_the_clouds(
    cloud: str, region: str, mig: dict[str, int], arch: str, model: str
) -> None:
    from providers.core.request import InstanceRequest
    from providers.core.selection import select
    from providers.core.snapshots import load_catalog

    # GB200 on AWS and GCP is sold through reserved capacity: an operator-named one
    request = InstanceRequest.model_validate({"mig": mig, "arch": arch, "reservation": "r-1"})
    chosen = select(load_catalog(cloud, region), request).selected  # type: ignore[arg-type]
    assert chosen.gpu_model == model
    assert chosen.mig_layout is not None and chosen.mig_layout.gpus_used == 1
