"""`peerpods plan` and `serve` plan with one code path: the Placement `serve` builds for its
provider (allow list, zones, candidate cap) with its GPU quota, handed to `plan_manifest`, gives
the very candidates StartVM would try, and the plan's choice is StartVM's first candidate."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from adaptor.cli.pod_plan import load_documents, plan_manifest
from adaptor.devices import CdiConfig, CdiNaming
from adaptor.node.wiring import placement_for
from adaptor.planning.placement import Placement
from adaptor.state import StateStore
from providers.clouds.aws import AwsConfig, AwsProvider

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def offline_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Static credentials, so building the AWS client never asks instance metadata."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


GPU_POD = load_documents((ROOT / "config" / "examples" / "gpu-pod.yaml").read_text())


def serve_placement(
    store: StateStore, *, allowed: tuple[str, ...], zones: tuple[str, ...], quota: str
) -> Placement:
    """The Placement as `serve` builds it (node wiring, with the store's GPU quota)."""
    provider = AwsProvider(
        AwsConfig(
            region="us-east-1",
            zones=zones,
            allowed_instance_types=allowed,
            endpoint_url="http://127.0.0.1:9",  # never dialled: planning makes no cloud call
        ),
        "owner-plan-test",
    )
    cdi = CdiConfig("annotations", CdiNaming(), None)
    return placement_for(provider, cdi, gpu_quota=quota, store=store)


CASES = [
    pytest.param((), (), "", id="unrestricted"),
    pytest.param(("g5.*", "g6.*"), (), "", id="allow-list"),
    pytest.param(("g5.*", "g6.*", "g4dn.*"), ("us-east-1a", "us-east-1b"), "", id="zones"),
    pytest.param((), (), "t4=0", id="quota-excludes-t4"),
]


@pytest.mark.parametrize(("allowed", "zones", "quota"), CASES)
def test_plan_chooses_what_startvm_tries_first(
    tmp_path: Path, allowed: tuple[str, ...], zones: tuple[str, ...], quota: str
) -> None:
    store = asyncio.run(StateStore.open(tmp_path / "state"))
    try:
        placement = serve_placement(store, allowed=allowed, zones=zones, quota=quota)
        report = plan_manifest(GPU_POD, placement=placement)
        assert report.ok, report.failure
        assert report.intent is not None
        # StartVM: the same object plans the same intent for a sandbox.
        startvm = asyncio.run(placement.plan(report.intent, "sandbox-1"))
        placement.release("sandbox-1")
        assert startvm.candidates, "StartVM found no candidate"
        assert report.plan is not None
        assert [c.instance_type for c in report.plan.candidates] == [
            c.instance_type for c in startvm.candidates
        ]
        assert report.chosen == startvm.candidates[0].instance_type
        for name in [c.instance_type for c in startvm.candidates]:
            if allowed:
                assert any(name.startswith(glob.rstrip("*")) for glob in allowed), name
    finally:
        asyncio.run(store.close())


def test_the_restrictions_change_the_choice(tmp_path: Path) -> None:
    """The cases above are not all the same choice: allow list and quota really steer it."""
    store = asyncio.run(StateStore.open(tmp_path / "state"))
    try:
        choices = {
            c.id: plan_manifest(
                GPU_POD, placement=serve_placement(store, allowed=a, zones=z, quota=q)
            ).chosen
            for c in CASES
            for a, z, q in [c.values]
        }
    finally:
        asyncio.run(store.close())
    assert choices["allow-list"] != choices["unrestricted"], choices
    assert choices["quota-excludes-t4"] != choices["unrestricted"], choices
