"""GCP pod VM lifecycle through compute_v1's own REST transport over a fake Compute Engine."""

from __future__ import annotations

import random
from typing import Any

import pytest

from adaptor.hypervisor.gc import GarbageCollector
from providers.clouds.gcp import GcpConfig, GcpProvider, vm_name
from providers.clouds.retry import FallbackExhausted, RetryPolicy
from providers.core.base import (
    TAG_OWNER,
    TAG_POD_NAME,
    TAG_SANDBOX,
    Accelerator,
    VMCandidate,
    VMSpec,
)
from providers.core.errors import InvalidRequest, ProviderError
from tests.clouds.conftest import FORWARDER, Sleeps, loopback
from tests.clouds.fake_gce import FakeGce, quota_exceeded, rate_limited, stockout
from tests.clouds.scenarios import create_delete_cycles, sweep_unknown, vm_spec
from tests.providers.fakes.gcp import COMPUTE, PROJECT

ZONES = ("us-central1-a", "us-central1-b")
T4 = Accelerator("t4", 1)
OWNER = "Owner.Node-A"  # not label-safe on purpose: labels are sanitised, metadata keeps it
INSERT = rf"{COMPUTE}/zones/[^/]+/instances"


@pytest.fixture
def gce() -> FakeGce:
    return FakeGce()


def provider(gce: FakeGce, policy: RetryPolicy, owner: str = OWNER, **config: Any) -> GcpProvider:
    settings: dict[str, Any] = {
        "project": PROJECT,
        "zones": ZONES,
        "image": "projects/peerpods/global/images/podvm-gpu",
        "policy": policy,
    }
    settings.update(config)
    return GcpProvider(GcpConfig(**settings), owner, client=gce.client(), resolve=loopback)


def spec(n: int = 1, **kw: Any) -> VMSpec:
    candidates = ("a3-highgpu-1g", "a2-ultragpu-1g")
    return vm_spec(n, **{"pod_name": f"Train.{n}", "candidates": candidates, **kw})


async def test_create_and_delete_with_checked_request_body(
    gce: FakeGce, policy: RetryPolicy
) -> None:
    gcp = provider(gce, policy)
    vm = await gcp.create(spec(1))
    assert vm.addresses == (FORWARDER[0],) and vm.extra["cloud_address"].startswith("10.128.")
    assert vm.id == f"us-central1-a/{vm_name(f'{1:064x}')}" and vm.instance_type == "a3-highgpu-1g"
    [insert] = gce.cloud.seen("POST", INSERT)
    body = insert.json()
    assert body["name"] == vm_name(f"{1:064x}") and len(body["name"]) <= 63
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert "guestAccelerators" not in body  # a3 carries its GPUs
    labels = body["labels"]
    assert labels[TAG_OWNER] == "owner-node-a" and labels[TAG_POD_NAME] == "train-1"
    assert len(labels[TAG_SANDBOX]) == 63
    assert all(len(v) <= 63 and v == v.lower() for v in labels.values())
    metadata = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert metadata["user-data"] == spec(1).user_data
    assert metadata[TAG_SANDBOX] == f"{1:064x}" and metadata[TAG_OWNER] == OWNER
    assert body["disks"][0]["autoDelete"] is True and body["disks"][0]["boot"] is True
    # the exact ids come back from metadata, so GC compares full sandbox ids
    [owned] = await gcp.list_owned()
    assert owned.tags[TAG_SANDBOX] == f"{1:064x}" and owned.tags[TAG_OWNER] == OWNER
    await gcp.delete(vm.id)
    assert gce.instances == {} and await gcp.list_owned() == []
    await gcp.delete(vm.id)  # gone already: fine


async def test_n1_gets_guest_accelerators(gce: FakeGce, policy: RetryPolicy) -> None:
    gcp = provider(gce, policy)
    candidate = VMCandidate("n1-standard-8", accelerator=Accelerator("t4", 2))
    vm = await gcp.create(spec(2, candidates=(candidate,)))
    body = gce.cloud.seen("POST", INSERT)[0].json()
    assert body["machineType"] == "zones/us-central1-a/machineTypes/n1-standard-8"
    assert body["guestAccelerators"] == [
        {
            "acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
            "acceleratorCount": 2,
        }
    ]
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert vm.instance_type == "n1-standard-8"
    # a CPU-only VM may live-migrate: no scheduling override
    await gcp.create(spec(3, candidates=("e2-standard-4",)))
    assert "scheduling" not in gce.cloud.seen("POST", INSERT)[1].json()


async def test_confidential_vm_never_gets_a_gpu_it_cannot_take(
    gce: FakeGce, policy: RetryPolicy
) -> None:
    tdx = provider(gce, policy, confidential_type="TDX")
    vm = await tdx.create(spec(4, candidates=("a2-ultragpu-1g", "a3-highgpu-1g")))
    assert vm.instance_type == "a3-highgpu-1g"  # A100 cannot run as TDX; H100 1g can
    body = gce.cloud.seen("POST", INSERT)[0].json()
    assert body["confidentialInstanceConfig"] == {"confidentialInstanceType": "TDX"}
    sev = provider(gce, policy, confidential_type="SEV")
    with pytest.raises(InvalidRequest, match="SEV confidential"):
        await sev.create(
            spec(5, candidates=("a3-highgpu-1g", VMCandidate("n1-standard-8", accelerator=T4)))
        )
    assert len(gce.cloud.seen("POST", INSERT)) == 1


async def test_retried_create_adopts_the_vm(gce: FakeGce, policy: RetryPolicy) -> None:
    gcp = provider(gce, policy)
    first = await gcp.create(spec(6))
    again = await gcp.create(spec(6))
    assert again.id == first.id and len(gce.instances) == 1
    assert len(gce.cloud.seen("POST", INSERT)) == 1


async def test_stockout_then_quota_moves_zone_then_type(gce: FakeGce, policy: RetryPolicy) -> None:
    gcp = provider(gce, policy)

    def fault(action: str, zone: str, body: dict[str, Any]) -> Any:
        if action != "insert" or "a3-highgpu" not in body["machineType"]:
            return None
        return stockout(zone) if zone == "us-central1-a" else quota_exceeded()

    gce.faults.append(fault)
    vm = await gcp.create(spec(7))
    assert (vm.instance_type, vm.zone) == ("a2-ultragpu-1g", "us-central1-a")
    assert gce.inserts() == [
        ("a3-highgpu-1g", "us-central1-a"),
        ("a3-highgpu-1g", "us-central1-b"),
        ("a2-ultragpu-1g", "us-central1-a"),
    ]
    assert len(gce.instances) == 1


async def test_nothing_anywhere_lists_every_placement(gce: FakeGce, policy: RetryPolicy) -> None:
    gcp = provider(gce, policy)
    gce.faults.append(lambda action, zone, body: stockout(zone) if action == "insert" else None)
    with pytest.raises(FallbackExhausted) as info:
        await gcp.create(spec(8))
    message = str(info.value)
    assert "4 attempt(s)" in message and "ZONE_RESOURCE_POOL_EXHAUSTED" in message
    assert "a2-ultragpu-1g in us-central1-b" in message
    assert gce.instances == {}


async def test_throttling_retried_then_succeeds(
    gce: FakeGce, policy: RetryPolicy, sleeps: Sleeps
) -> None:
    gcp = provider(gce, policy)
    left = [2]

    def fault(action: str, zone: str, body: dict[str, Any]) -> Any:
        if action == "insert" and left[0] > 0:
            left[0] -= 1
            return rate_limited()
        return None

    gce.faults.append(fault)
    vm = await gcp.create(spec(9))
    assert vm.zone == "us-central1-a" and len(sleeps.delays) == 2
    assert gce.inserts() == [("a3-highgpu-1g", "us-central1-a")] * 3


async def test_failure_after_insert_deletes_the_vm(gce: FakeGce, policy: RetryPolicy) -> None:
    gcp = provider(gce, policy)
    healthy = await gcp.create(spec(10, candidates=("e2-standard-4",)))
    broken = vm_name(f"{11:064x}")

    def no_address(action: str, zone: str, body: dict[str, Any]) -> Any:
        if action == "get" and body["name"] == broken:
            return {**body, "networkInterfaces": []}  # exists, but reports no address
        return None

    gce.faults.append(no_address)
    with pytest.raises(ProviderError, match="has no address"):
        await gcp.create(spec(11, candidates=("e2-standard-4",)))
    assert [name for _, name in gce.instances] == [healthy.name]
    assert len(gce.cloud.seen("DELETE", rf"{INSERT}/{broken}")) == 1


async def test_user_data_over_the_metadata_limit_is_refused(
    gce: FakeGce, policy: RetryPolicy
) -> None:
    gcp = provider(gce, policy)
    with pytest.raises(InvalidRequest, match="262144"):
        await gcp.create(spec(12, user_data="x" * (256 * 1024 + 1)))
    assert gce.cloud.seen("POST", INSERT) == []


async def test_gc_removes_only_our_orphans(gce: FakeGce, policy: RetryPolicy) -> None:
    gcp = provider(gce, policy)
    kept = await gcp.create(spec(20))
    await gcp.create(spec(21))
    other = await provider(gce, policy, owner="other-node").create(spec(22))
    # a VM with our owner label but made by hand (no sandbox) is not ours to judge
    gce.instances[("us-central1-a", "hand-made")] = {
        **gce.instances[("us-central1-a", vm_name(f"{20:064x}"))],
        "name": "hand-made",
        "labels": {TAG_OWNER: "owner-node-a"},
        "metadata": {"items": []},
    }

    async def known() -> set[str]:
        return {f"{20:064x}"}

    result = await GarbageCollector(provider(gce, policy), OWNER, known).sweep()
    assert len(result.deleted) == 1 and result.failed == []
    names = {name for _, name in gce.instances}
    assert names == {kept.name, other.name, "hand-made"}


async def test_random_fault_cycles_leave_nothing(gce: FakeGce, sleeps: Sleeps) -> None:
    rng = random.Random(99)
    policy = RetryPolicy(rng=random.Random(3), sleep=sleeps, transient_retries=2)
    gcp = provider(gce, policy)

    def chaos(action: str, zone: str, body: dict[str, Any]) -> Any:
        roll = rng.random()
        if action == "insert" and roll < 0.15:
            return stockout(zone)
        if roll < 0.3:
            return rate_limited()
        return None

    gce.faults.append(chaos)
    created = await create_delete_cycles(gcp, (spec(100 + n) for n in range(150)))
    assert created > 50
    gce.faults.clear()
    await sweep_unknown(gcp, OWNER)
    assert gce.instances == {}
