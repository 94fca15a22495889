"""Garbage collection of pod VMs: delete VMs this adaptor owns whose sandbox it no longer knows.

A VM costs money from its first second, so a VM left by a crash (between launch and the sandbox
record, or a delete that failed) must not live on. At start and then periodically the collector
lists the VMs carrying this adaptor's owner tag, reads the known sandboxes *after* the listing
(a sandbox is recorded before its VM is launched, so a VM seen in the listing whose sandbox is
still unknown afterwards is an orphan), and deletes only those. A VM without our owner tag or
without a sandbox tag is never touched: a warm pool's VMs (adaptor.warmpool) carry none until
adopted, and the pool's keeper deletes its own orphans.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field

from adaptor.runtime import metrics
from adaptor.runtime.periodic import OwnedTask
from providers.core.base import (
    TAG_OWNER,
    TAG_POD_NAME,
    TAG_POD_NAMESPACE,
    TAG_SANDBOX,
    Instance,
    Provider,
)
from providers.core.errors import ProviderError

log = logging.getLogger(__name__)

KnownSandboxes = Callable[[], Awaitable[Collection[str]]]


@dataclass
class SweepResult:
    """What one sweep did: deleted orphans, deletes that failed (retried next sweep), kept VMs."""

    deleted: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    kept: int = 0


def orphans(
    instances: Collection[Instance], owner_id: str, known: Collection[str]
) -> list[Instance]:
    """The owned VMs whose sandbox is unknown (the tags are re-checked: never trust a filter)."""
    known_set = set(known)
    return [
        vm
        for vm in instances
        if vm.tags.get(TAG_OWNER) == owner_id
        and vm.tags.get(TAG_SANDBOX)
        and vm.tags[TAG_SANDBOX] not in known_set
    ]


class GarbageCollector:
    """Sweeps at start and every `interval_seconds`; `stop()` ends the loop."""

    def __init__(
        self,
        provider: Provider,
        owner_id: str,
        known_sandboxes: KnownSandboxes,
        *,
        interval_seconds: float = 300.0,
        sweep_timeout_seconds: float = 600.0,
    ) -> None:
        self.provider = provider
        self.owner_id = owner_id
        self.known_sandboxes = known_sandboxes
        self.interval_seconds = interval_seconds
        self.sweep_timeout_seconds = sweep_timeout_seconds
        self._task = OwnedTask("peerpods-gc")
        self.sweeps = 0
        self.failures = 0  # sweeps that ended in an unexpected error (the loop went on)

    async def sweep(self) -> SweepResult:
        """One pass: list owned VMs, then read the known sandboxes, delete the difference."""
        instances = await self.provider.list_owned()
        known = await self.known_sandboxes()
        result = SweepResult()
        doomed = orphans(instances, self.owner_id, known)
        result.kept = len(instances) - len(doomed)
        for vm in doomed:
            log.info(
                "gc: deleting orphan %s (sandbox %s, pod %s/%s)",
                vm.id,
                vm.tags.get(TAG_SANDBOX, ""),
                vm.tags.get(TAG_POD_NAMESPACE, ""),
                vm.tags.get(TAG_POD_NAME, ""),
            )
            try:
                await self.provider.delete(vm.id)
            except ProviderError as exc:
                log.warning("gc: delete of %s failed, retried next sweep: %s", vm.id, exc)
                result.failed.append(vm.id)
            else:
                result.deleted.append(vm.id)
                metrics.GC_DELETIONS.labels(provider=self.provider.name).inc()
        self.sweeps += 1
        return result

    async def _loop(self) -> None:
        while True:
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancel that
                # lands as the sweep finishes, and stop() would then wait forever.
                async with asyncio.timeout(self.sweep_timeout_seconds):
                    await self.sweep()
            except (ProviderError, TimeoutError) as exc:
                log.warning("gc: sweep failed, retried in %gs: %s", self.interval_seconds, exc)
            except asyncio.CancelledError as exc:
                if _stopping():
                    raise
                # A call the sweep awaited was cancelled under it (an SDK pool shut down and
                # made anew, say), not this loop: the next sweep must still run.
                log.error("gc: sweep cancelled, retried in %gs: %s", self.interval_seconds, exc)
                self.failures += 1
            except Exception as exc:  # a state error, a bug: the next sweep must still run
                log.error(
                    "gc: sweep failed (%s), retried in %gs: %s",
                    type(exc).__name__,
                    self.interval_seconds,
                    exc,
                )
                self.failures += 1
            if _stopping():
                raise asyncio.CancelledError
            await asyncio.sleep(self.interval_seconds)

    def start(self) -> asyncio.Task[None]:
        """Start sweeping (first sweep at once); the caller owns the task through stop()."""
        return self._task.start(self._loop)

    async def stop(self) -> None:
        """Cancel the loop and wait for it to end."""
        await self._task.stop()


def _stopping() -> bool:
    """Whether the running task itself is being cancelled (by stop()), not a call it awaited."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0
