"""The publisher against an in-memory API: writes the difference under a new generation,
nothing when nothing changed, deletes its slices on uninstall; one leader among replicas."""

from __future__ import annotations

import asyncio

from providers.core.snapshots import CatalogLoader
from providers.dra import build_pool
from providers.dra.publisher import SLICES, LeaseElector, delete_pool, publish, run_controller
from tests.dra.fake_kube import FakeKube


def pool(limits: dict[str, int] | None = None):  # type: ignore[no-untyped-def]
    return build_pool(CatalogLoader(None).load("aws", "us-east-1"), limits)


def stored(kube: FakeKube) -> list[dict]:  # type: ignore[type-arg]
    return kube.store.items(SLICES)


def test_first_publish_creates_a_complete_pool_at_generation_one(kube: FakeKube) -> None:
    done = publish(kube.client, pool())
    slices = stored(kube)
    assert done.generation == 1 and len(done.created) == len(slices) > 1
    assert {s["spec"]["pool"]["generation"] for s in slices} == {1}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}


def test_an_unchanged_pool_writes_nothing(kube: FakeKube) -> None:
    publish(kube.client, pool())
    writes = len(kube.store.writes)
    again = publish(kube.client, pool())
    assert not again.changed and again.generation == 1
    assert len(kube.store.writes) == writes


def test_a_limit_change_is_a_new_generation_of_every_slice(kube: FakeKube) -> None:
    publish(kube.client, pool())
    before = {s["metadata"]["name"] for s in stored(kube)}
    done = publish(kube.client, pool({"h100-80gb": 1, "l40s": 0, "l4": 0, "a10g": 0}))
    slices = stored(kube)
    assert done.generation == 2
    assert {s["spec"]["pool"]["generation"] for s in slices} == {2}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    assert set(done.deleted) == before - {s["metadata"]["name"] for s in slices}
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    assert sum(d["attributes"]["model"]["string"] == "h100-80gb" for d in devices) == 1


def test_delete_pool_removes_only_this_pools_slices(kube: FakeKube) -> None:
    publish(kube.client, pool())
    other = {"metadata": {"name": "other", "labels": {}}, "spec": {"driver": "gpu.nvidia.com"}}
    kube.store.put(SLICES, other)
    deleted = delete_pool(kube.client, "aws-us-east-1")
    assert deleted and [s["metadata"]["name"] for s in stored(kube)] == ["other"]
    assert delete_pool(kube.client, "aws-us-east-1") == ()


def test_one_replica_leads_and_another_takes_over_an_expired_lease(kube: FakeKube) -> None:
    now = [1000.0]
    a = LeaseElector(kube.client, "peerpods", "dra", "a", 15, clock=lambda: now[0])
    b = LeaseElector(kube.client, "peerpods", "dra", "b", 15, clock=lambda: now[0])
    assert a.try_acquire() and not b.try_acquire()
    now[0] += 10
    assert a.try_acquire() and not b.try_acquire()  # renewed
    now[0] += 16
    assert b.try_acquire() and not a.try_acquire()
    lease = kube.store.items("/apis/coordination.k8s.io/v1/namespaces/peerpods/leases")[0]
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1


def test_the_controller_republishes_and_deletes_on_exit(kube: FakeKube) -> None:
    limits = [{"h100-80gb": 2}]

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(
            run_controller(
                kube.client,
                lambda: pool(limits[0]),
                stop,
                resync_seconds=0.05,
                delete_on_exit=True,
            )
        )
        for _ in range(200):
            await asyncio.sleep(0.02)
            if stored(kube):
                break
        first = {s["spec"]["pool"]["generation"] for s in stored(kube)}
        limits[0] = {"h100-80gb": 3}
        for _ in range(200):
            await asyncio.sleep(0.02)
            if {s["spec"]["pool"]["generation"] for s in stored(kube)} == {2}:
                break
        devices = [d for s in stored(kube) for d in s["spec"].get("devices", [])]
        stop.set()
        await task
        assert first == {1}
        assert sum(d["attributes"]["model"]["string"] == "h100-80gb" for d in devices) == 3

    asyncio.run(main())
    assert stored(kube) == []
