"""Noticing a running sandbox's VM taken away by the cloud (Spot preemption, eviction, deletion).

Two things start a check of a sandbox: its agent connection dropping (the proxy says so at once),
and a sweep of every running sandbox each `interval_seconds` (a preempted VM that is simply gone
may never close the TCP connection). A check asks the provider (`Inspectable.inspect`); only the
provider's word marks a sandbox preempted, a dropped connection alone never does.

A preempted sandbox is recorded `preempted` with the cloud's reason (the status API shows it),
counted in `peerpods_sandboxes_preempted_total`, its agent socket answers every call, in flight
or new, with FAILED_PRECONDITION and that reason (Kata's shim then fails the pod's containers, so
a Job controller retries the pod, instead of waiting on a VM that will never answer), and
everything left of the VM is deleted (`Inspectable.purge`). The StopVM that follows succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from adaptor.hypervisor.sandboxes import SandboxManager
from adaptor.runtime import metrics
from adaptor.runtime.logs import sandbox_context
from adaptor.state import SandboxRecord, SandboxState
from adaptor.ttrpc import Code
from providers.core.base import Provider
from providers.core.errors import PeerpodsError
from providers.core.markets import Inspectable

log = logging.getLogger(__name__)

# The status every agent call of a preempted sandbox gets: retrying the same VM cannot succeed.
PREEMPTED_CODE = Code.FAILED_PRECONDITION
CHECKS_AT_ONCE = 8  # provider calls one sweep runs concurrently


@runtime_checkable
class FailableProxy(Protocol):
    """An agent proxy that can answer every call with one status (adaptor.proxy.AgentProxy)."""

    async def fail(self, code: Code, message: str) -> None: ...


class InspectableProvider(Provider, Inspectable, Protocol):
    """A provider that can also tell whether a VM lives and remove what is left of it."""


def preempted_message(record: SandboxRecord, reason: str) -> str:
    """What the shim is told: which pod, which VM, what the cloud said, and that it is final."""
    instance = record.instance
    vm = f"{instance.id} ({instance.instance_type}, {instance.capacity_type})" if instance else "?"
    return (
        f"pod VM {vm} of pod {record.pod_namespace}/{record.pod_name} was preempted or deleted "
        f"by the cloud: {reason}; this sandbox cannot continue"
    )


class DroppedConnections:
    """The sandboxes whose agent connection dropped, told by their proxies as it happens and
    checked by the watcher in turn: built before both, so the proxies (made by the sandbox
    manager) and the watcher (built over the manager) need no reference to each other. A drop
    told before the watcher starts (during recovery) is checked once it does."""

    def __init__(self) -> None:
        self._ids: asyncio.Queue[str] = asyncio.Queue()

    def tell(self, sandbox_id: str) -> None:
        """A proxy's `on_upstream_lost`: the sandbox's connection dropped (on the event loop)."""
        self._ids.put_nowait(sandbox_id)

    async def next(self) -> str:
        return await self._ids.get()


class PreemptionWatcher:
    """Finds running sandboxes whose VM the cloud took away, and ends them visibly."""

    def __init__(
        self,
        manager: SandboxManager,
        provider: InspectableProvider,
        interval_seconds: float,
        *,
        dropped: DroppedConnections | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.manager = manager
        self.provider = provider
        self.interval_seconds = interval_seconds
        self._dropped = dropped
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._checks: dict[str, asyncio.Task[bool]] = {}
        self._limit = asyncio.Semaphore(CHECKS_AT_ONCE)

    # --- lifetime ------------------------------------------------------------------------------

    def start(self) -> None:
        """Fail the sockets of sandboxes preempted before a restart, sweep once at once, then
        every `interval_seconds` (0: never) until `stop`."""
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._task = loop.create_task(self._loop(), name="preemption-watcher")
        if self._listener is None and self._dropped is not None:
            self._listener = loop.create_task(
                self._listen(self._dropped), name="preemption-dropped"
            )

    async def stop(self) -> None:
        """Stop sweeping and cancel the checks in progress (they are safe to cut short)."""
        tasks = [t for t in (self._task, self._listener, *self._checks.values()) if t is not None]
        self._task = self._listener = None
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._checks.clear()

    async def _listen(self, dropped: DroppedConnections) -> None:
        while True:
            self.nudge(await dropped.next())

    async def _loop(self) -> None:
        try:
            await self.fail_preempted()
        except PeerpodsError as exc:
            log.warning("cannot read the preempted sandboxes: %s", exc)
        while self.interval_seconds > 0:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("preemption sweep failed; the next one retries")
            await self._sleep(self.interval_seconds)

    async def fail_preempted(self) -> None:
        """Make the agent sockets of sandboxes already preempted (a restarted daemon serves them
        again) answer every call with the reason."""
        for record in await self.manager.store.records():
            proxy: Any = self.manager.proxy_of(record.id)
            if record.state is SandboxState.PREEMPTED and isinstance(proxy, FailableProxy):
                await proxy.fail(PREEMPTED_CODE, preempted_message(record, record.reason))

    # --- checks ---------------------------------------------------------------------------------

    def nudge(self, sandbox_id: str) -> None:
        """Check one sandbox now (its agent connection dropped); a check already running for it
        is not repeated."""
        if sandbox_id in self._checks:
            return
        task = asyncio.get_running_loop().create_task(
            self._check_id(sandbox_id), name=f"preemption-check-{sandbox_id}"
        )
        self._checks[sandbox_id] = task
        task.add_done_callback(lambda _t: self._checks.pop(sandbox_id, None))

    async def _check_id(self, sandbox_id: str) -> bool:
        record = await self.manager.store.get(sandbox_id)
        return record is not None and await self.check(record)

    async def sweep(self) -> list[str]:
        """Check every running sandbox once; the ids of those found preempted."""
        records = [
            r
            for r in await self.manager.store.records()
            if r.state is SandboxState.RUNNING and r.instance is not None
        ]
        found = await asyncio.gather(*(self.check(r) for r in records))
        return [r.id for r, preempted in zip(records, found, strict=True) if preempted]

    async def check(self, record: SandboxRecord) -> bool:
        """Ask the provider about a running sandbox's VM; end the sandbox if the VM is lost."""
        instance = record.instance
        if record.state is not SandboxState.RUNNING or instance is None:
            return False
        with sandbox_context(record.id, f"{record.pod_namespace}/{record.pod_name}"):
            async with self._limit:
                try:
                    condition = await self.provider.inspect(instance.id)
                except PeerpodsError as exc:
                    log.warning(
                        "sandbox %s: cannot tell whether VM %s lives: %s",
                        record.id,
                        instance.id,
                        exc,
                    )
                    return False
            if condition.alive:
                return False
            return await self._preempted(record, condition.reason)

    async def _preempted(self, record: SandboxRecord, reason: str) -> bool:
        assert record.instance is not None
        instance = record.instance
        if not await self.manager.mark_preempted(record.id, instance.id, reason):
            return False  # stopped meanwhile, or another check got there first
        log.warning("sandbox %s: VM %s lost: %s", record.id, instance.id, reason)
        metrics.PREEMPTIONS.labels(
            provider=self.provider.name, capacity_type=instance.capacity_type
        ).inc()
        proxy: Any = self.manager.proxy_of(record.id)
        if isinstance(proxy, FailableProxy):
            await proxy.fail(PREEMPTED_CODE, preempted_message(record, reason))
        try:
            await self.provider.purge(instance)
        except PeerpodsError as exc:
            note = f"{reason}; deleting what is left of VM {instance.id} failed ({exc})"
            log.warning("sandbox %s: %s", record.id, note)
        else:
            note = f"{reason}; VM {instance.id} and its disks and NICs deleted"
        with contextlib.suppress(PeerpodsError):
            await self.manager.mark_preempted(record.id, instance.id, note, again=True)
        return True
