"""The reaper: finishes what an interrupted sandbox left behind.

A StartVM cut short (the daemon killed mid-create, a failure whose delete failed too) leaves a
record in `failed` or `stopping` whose VM may still run; the shim's StopVM may never come (its
pod is gone, or runtime-rs gave up after 1 s). The garbage collector skips these VMs because
their sandbox is known. Each sweep the reaper lists the VMs the provider owns, and for every
failed or stopping record unchanged for the grace period deletes its VMs (the recorded one and
any carrying its sandbox tag) through the sandbox manager, which retries until the cloud
confirms: a failed record stays, without its VM, for the StopVM that may follow; a stopping one
is forgotten. Every VM deleted is counted in `peerpods_reaped_vms_total`; a sweep that fails is
logged and the next one tries again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from adaptor.hypervisor.sandboxes import SandboxManager
from adaptor.runtime import metrics
from adaptor.runtime.periodic import OwnedTask
from adaptor.state import SandboxRecord, SandboxState
from providers.core.base import TAG_OWNER, TAG_SANDBOX, Instance

log = logging.getLogger(__name__)

REAPED_STATES = (SandboxState.FAILED, SandboxState.STOPPING)


@dataclass
class ReapResult:
    """What one sweep did: VMs deleted per sandbox, sandboxes whose reaping failed."""

    deleted: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)


def overdue(record: SandboxRecord, now: float, grace_seconds: float) -> bool:
    """Whether a record is failed or stopping and unchanged for the grace period."""
    return record.state in REAPED_STATES and now - record.updated_at >= grace_seconds


class Reaper:
    """Sweeps every `interval_seconds`; `stop()` ends the loop."""

    def __init__(
        self,
        manager: SandboxManager,
        *,
        grace_seconds: float,
        interval_seconds: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.manager = manager
        self.grace_seconds = grace_seconds
        self.interval_seconds = interval_seconds or max(1.0, min(60.0, grace_seconds / 4))
        self.clock = clock
        self._task = OwnedTask("peerpods-reaper")
        self.sweeps = 0

    async def sweep(self) -> ReapResult:
        """One pass over the records; VMs listed once for all of them."""
        result = ReapResult()
        now = self.clock()
        records = [
            r
            for r in await self.manager.store.records()
            if overdue(r, now, self.grace_seconds) and not self.manager.busy(r.id)
        ]
        if not records:
            self.sweeps += 1
            return result
        provider = self.manager.provider
        by_sandbox = _by_sandbox(await provider.list_owned(), getattr(provider, "owner_id", ""))
        for record in records:
            vms = list(by_sandbox.get(record.id, ()))
            if record.instance is not None and all(vm.id != record.instance.id for vm in vms):
                vms.append(record.instance)
            if not vms and record.state is SandboxState.FAILED:
                continue
            log.info(
                "reaper: sandbox %s %s for %.0fs; deleting %s",
                record.id,
                record.state.value,
                now - record.updated_at,
                ", ".join(vm.id for vm in vms) or "nothing (forgetting it)",
            )
            try:
                count = await self.manager.reap(record, vms)
            except Exception as exc:
                log.warning("reaper: sandbox %s: %s (retried next sweep)", record.id, exc)
                result.failed.append(record.id)
                continue
            result.deleted[record.id] = count
            if count:
                metrics.REAPED_VMS.labels(provider=provider.name).inc(count)
        self.sweeps += 1
        return result

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_seconds)
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("reaper: sweep failed, retried in %gs: %s", self.interval_seconds, exc)

    def start(self) -> asyncio.Task[None]:
        """Start sweeping (first sweep after one interval); the caller owns it through stop()."""
        return self._task.start(self._loop)

    async def stop(self) -> None:
        """Cancel the loop and wait for it to end."""
        await self._task.stop()


def _by_sandbox(vms: list[Instance], owner_id: str) -> dict[str, list[Instance]]:
    found: dict[str, list[Instance]] = {}
    for vm in vms:
        if owner_id and vm.tags.get(TAG_OWNER) != owner_id:
            continue
        sandbox = vm.tags.get(TAG_SANDBOX)
        if sandbox:
            found.setdefault(sandbox, []).append(vm)
    return found
