"""The orphan collector survives any error of a sweep (moto EC2): a state store that fails, and
an unexpected error, end that sweep only; the next one deletes the orphan."""

from __future__ import annotations

import asyncio
from typing import Any

from adaptor.hypervisor.gc import GarbageCollector
from adaptor.state import StateError
from providers.clouds.retry import RetryPolicy
from tests.clouds.test_aws import live, provider, spec

OWNER_SANDBOX = f"{30:064x}"


async def test_collector_keeps_sweeping_after_state_and_unexpected_errors(
    ec2: Any, policy: RetryPolicy
) -> None:
    aws = provider(ec2, policy)
    await aws.create(spec(30))
    orphan = await aws.create(spec(31))
    failures = [StateError("state database: database is locked"), KeyError("a bug")]

    async def known() -> set[str]:
        if failures:
            raise failures.pop(0)
        return {OWNER_SANDBOX}

    gc = GarbageCollector(aws, "owner-node-a", known, interval_seconds=0.01)
    await run_until_swept(gc)
    assert orphan.id not in {i["InstanceId"] for i in live(ec2)}
    assert gc.failures == 2
    assert len(live(ec2)) == 1


async def run_until_swept(gc: GarbageCollector, sweeps: int = 1) -> None:
    """Run the collector's loop until it has finished `sweeps` sweeps, then stop it. Waits on the
    collector's own count (cheap), not on the cloud: polling moto from the loop would compete with
    the sweeps' SDK threads for the GIL on a busy machine."""
    gc.start()
    try:
        for _ in range(6000):
            if gc.sweeps >= sweeps:
                break
            await asyncio.sleep(0.02)
    finally:
        await gc.stop()


class _PoolCancelledOnce:
    """A provider whose first listing is cancelled under the sweep (its SDK pool was shut down),
    as a cancelled executor future surfaces in the awaiting task."""

    name = "fake"

    def __init__(self) -> None:
        self.listings = 0

    async def list_owned(self) -> list[Any]:
        self.listings += 1
        if self.listings == 1:
            raise asyncio.CancelledError("cannot schedule: the pool was shut down")
        return []


async def test_a_call_cancelled_under_a_sweep_does_not_end_the_collector() -> None:
    fake = _PoolCancelledOnce()

    async def known() -> set[str]:
        return set()

    gc = GarbageCollector(fake, "owner-node-a", known, interval_seconds=0.01)  # type: ignore[arg-type]
    await run_until_swept(gc)
    assert gc.failures == 1 and gc.sweeps >= 1 and fake.listings >= 2
