"""Teardown and reaping: StopVM, the teardown of a failed start, abandoning a sandbox whose shim
is gone, and the reaper's and preemption watcher's entry points.

A teardown runs as a task the table owns and retries the VM delete until the cloud confirms it;
StopVM answers once it is done or when the caller's deadline (runtime-rs gives 1 s) is near,
whichever comes first. A state store that refuses writes (disk full) does not hold a teardown
up: the writes are owed and retried until the store takes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from adaptor.hypervisor.collaborators import AgentProxyHandle
from adaptor.hypervisor.errors import check_sandbox_id, why
from adaptor.hypervisor.table import SandboxTable, Stop, remove_socket_dir
from adaptor.runtime import metrics
from adaptor.runtime.logs import sandbox_context
from adaptor.state import SandboxRecord, SandboxState, StateError
from providers.core.base import TAG_OWNER, TAG_SANDBOX, Instance, Provider
from providers.core.errors import InstanceNotFound, ProviderError

log = logging.getLogger(__name__)

# The reaper's bounds per sandbox and sweep (the next sweep tries again).
REAP_DELETE_ATTEMPTS = 3
REAP_WAIT_SECONDS = 120.0


class Teardowns:
    """Tears sandboxes down over the shared table; owns the writes a full store refused."""

    def __init__(self, table: SandboxTable) -> None:
        self.table = table
        # writes a full state store refused: sandbox id -> the record to put (None: delete it)
        self._owed: dict[str, SandboxRecord | None] = {}
        self._owed_why = ""
        self._owed_task: asyncio.Task[None] | None = None

    # --- StopVM ----------------------------------------------------------------------------------

    async def stop_vm(self, sandbox_id: str, deadline_seconds: float | None = None) -> None:
        """Tear the sandbox down: cancel a start in flight, stop the proxy, delete the VM,
        forget the sandbox.

        The teardown runs as a task the manager owns and keeps retrying the delete until the
        cloud confirms it; this call answers when it is done, or a little before
        `deadline_seconds` (the caller's deadline), or after `stop_wait_seconds`, whichever is
        first. ProviderError when the delete failed and is still being retried.
        """
        table = self.table
        check_sandbox_id(sandbox_id)
        table.called.add(sandbox_id)
        stop = table.stops.get(sandbox_id)
        if stop is not None:
            stop.failed.clear()  # joining a teardown: only a failure from now on is news
        else:
            record = await table.require(sandbox_id)
            with contextlib.suppress(Exception):
                # Durable before anything else: a restarted daemon finishes the teardown.
                await table.store.set_state(sandbox_id, SandboxState.STOPPING, "StopVM")
            stop = self.begin_stop(record.id, cancel_start=True)
        wait = table.config.stop_wait_seconds
        if deadline_seconds is not None and deadline_seconds > 0:
            wait = min(wait, answer_within(deadline_seconds))
        await _first_of(stop, wait)
        if stop.done.is_set() and stop.left:
            raise ProviderError(f"sandbox {sandbox_id}: {stop.left}")
        if stop.done.is_set():
            log.info("sandbox %s stopped", sandbox_id)
            return
        if stop.error:
            raise ProviderError(f"sandbox {sandbox_id}: {stop.error}")
        log.info("sandbox %s: StopVM answered, the VM delete goes on", sandbox_id)

    def begin_stop(
        self,
        sandbox_id: str,
        *,
        cancel_start: bool,
        known: Sequence[Instance] = (),
        reason: str = "",
    ) -> Stop:
        """Start (or join) the sandbox's teardown task; `known` are VMs found by a listing,
        `reason` (default: the recorded one, or "StopVM") is what the record says meanwhile."""
        table = self.table
        stop = table.stops.get(sandbox_id)
        if stop is not None:
            return stop
        aborted = False
        if cancel_start:
            for task in table.starts.get(sandbox_id, ()):
                aborted = task.cancel() or aborted
        stop = Stop()
        table.stops[sandbox_id] = stop
        stop.task = table.spawn(
            self._teardown(sandbox_id, aborted, tuple(known), reason), name=f"stop-{sandbox_id}"
        )

        def finished(task: asyncio.Task[None]) -> None:
            # A teardown that ended early never reads as done: StopVM answers why.
            if task.cancelled():
                stop.left = stop.left or "teardown interrupted (the next start finishes it)"
            elif (exc := task.exception()) is not None:
                stop.left = stop.left or why("teardown", exc)
                log.error("sandbox %s: %s", sandbox_id, stop.left)
            stop.done.set()
            if table.stops.get(sandbox_id) is stop:
                del table.stops[sandbox_id]
            if table.draining:
                table.ended.add(sandbox_id)
                table.teardown_ended.set()

        stop.task.add_done_callback(finished)
        return stop

    async def _teardown(
        self,
        sandbox_id: str,
        start_aborted: bool,
        known: tuple[Instance, ...] = (),
        reason: str = "",
    ) -> None:
        """The whole StopVM, after the start (if any) unwound; retried until the VM is gone.

        A state store that cannot be written (disk full) does not hold it up: the VM is deleted
        all the same, the writes are owed (retried until the store takes them) and StopVM
        answers with what is still owed."""
        table = self.table
        async with table.locked(sandbox_id):
            record = await table.store.get(sandbox_id)
            if record is None:
                return
            with sandbox_context(record.id, f"{record.pod_namespace}/{record.pod_name}"):
                reason = reason or record.reason or "StopVM"
                if record.state is not SandboxState.STOPPING or record.reason != reason:
                    # (StopVM wrote it already, before the teardown began)
                    record = await self._save(
                        record.evolve(state=SandboxState.STOPPING, reason=reason)
                    )
                await self._stop_proxy(record)
                record, owed = await table.hooks.vm_stopping(record, self._save)
                for instance in await self._vms_of(record, start_aborted, known):
                    await self._delete_vm(record, instance)
                await table.hooks.vm_deleted(record)
                if owed:
                    await self._keep_owed(record, owed)
                    return
                await self._forget(record)
                stop = table.stops.get(sandbox_id)
                if sandbox_id in self._owed and stop is not None:
                    stop.left = (
                        f"the VM is deleted, but the state store cannot be written "
                        f"({self._owed_why}); its record is removed once it can"
                    )
                    return
        log.info("sandbox %s: torn down", sandbox_id)

    async def _keep_owed(self, record: SandboxRecord, owed: str) -> None:
        """The VM is gone; the tunnel's remains stay recorded until a retry removes them (the
        next StopVM, or a restart), and StopVM says so."""
        await self._save(record.evolve(state=SandboxState.FAILED, reason=owed, instance=None))
        stop = self.table.stops.get(record.id)
        if stop is not None:
            stop.error = stop.left = f"{owed}; retry StopVM"
            stop.failed.set()

    async def _stop_proxy(self, record: SandboxRecord) -> None:
        proxy = self.table.proxies.pop(record.id, None)
        if proxy is not None:
            with contextlib.suppress(Exception):
                await proxy.stop()

    async def _vms_of(
        self, record: SandboxRecord, start_aborted: bool, known: tuple[Instance, ...]
    ) -> list[Instance]:
        """The VMs to delete: the recorded one and `known`; after an aborted start, also any VM
        the provider lists with this sandbox's tag (a create cut short before it was recorded)."""
        table = self.table
        found = [record.instance] if record.instance is not None else []
        found += known
        if start_aborted and not found:
            with contextlib.suppress(ProviderError, TimeoutError):
                async with asyncio.timeout(table.config.stop_wait_seconds):
                    owned = await table.provider.list_owned()
                found += [vm for vm in owned if _tagged(vm, record.id, table.provider)]
        return list({vm.id: vm for vm in found}.values())

    async def _delete_vm(
        self, record: SandboxRecord, instance: Instance, attempts: int | None = None
    ) -> None:
        """Delete until the cloud confirms (or says it is gone); failures recorded and retried,
        `attempts` times at most (None: until confirmed), then the last error is raised."""
        table = self.table
        delay = table.config.delete_retry_seconds
        tried = 0
        while True:
            try:
                await table.provider.delete(instance.id)
                return
            except InstanceNotFound:
                return
            except Exception as exc:
                tried += 1
                reason = why(f"delete of VM {instance.id}", exc)
                stop = table.stops.get(record.id)
                if stop is not None:
                    stop.error = f"{reason}; the delete is retried"
                    stop.failed.set()
                metrics.VM_DELETE_FAILURES.labels(provider=table.provider.name).inc()
                await self._save(record.evolve(reason=reason))
                if attempts is not None and tried >= attempts:
                    raise
                log.warning("sandbox %s: %s; retrying in %gs", record.id, reason, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, table.config.delete_retry_max_seconds)

    async def _forget(self, record: SandboxRecord) -> None:
        table = self.table
        await asyncio.to_thread(remove_socket_dir, Path(record.agent_socket))
        try:
            await table.store.delete(record.id)
        except StateError as exc:
            self._owe(record.id, None, exc)
        else:
            self._owed.pop(record.id, None)
        table.placement.release(record.id)
        table.intents.pop(record.id, None)
        await table.hooks.sandbox_gone(record.id)

    # --- a start that failed once its VM existed -------------------------------------------------

    async def failed_start(
        self,
        record: SandboxRecord,
        instance: Instance,
        proxy: AgentProxyHandle | None,
        reason: str,
    ) -> None:
        """Undo a StartVM that failed after the VM existed: proxy, tunnel and VM go, the
        sandbox stays failed (a delete that fails leaves the VM recorded for StopVM or the
        reaper)."""
        table = self.table
        if proxy is not None:
            with contextlib.suppress(Exception):
                await proxy.stop()
        # The stored record, not the start's copy: its tunnel may be further on (write-ahead).
        record = await table.store.get(record.id) or record
        record = await table.store.put(record.evolve(state=SandboxState.FAILED, reason=reason))
        record, owed = await table.hooks.vm_stopping(record, self._save)
        if owed:
            reason = f"{reason}; {owed}"
            record = await table.store.put(record.evolve(reason=reason))
        try:
            await table.provider.delete(instance.id)
        except InstanceNotFound:
            pass
        except Exception as exc:
            # The record keeps the VM: StopVM (or the reaper) deletes it.
            await table.store.put(record.evolve(reason=f"{reason}; {why('delete', exc)}"))
            return
        finally:
            await table.hooks.vm_deleted(record)
        if record.id in table.stops:
            return  # the StopVM in flight forgets the sandbox
        await asyncio.to_thread(remove_socket_dir, Path(record.agent_socket))
        await table.store.put(record.evolve(instance=None))

    # --- the reaper's, the restart's and the preemption watcher's entry points -------------------

    async def reap(self, record: SandboxRecord, vms: Iterable[Instance]) -> int:
        """Delete the VMs an interrupted sandbox left: a failed record stays, without its VM;
        a stopping one is torn down and forgotten. How many VMs were deleted (0 while a
        teardown is still retrying: the next sweep finds it busy and leaves it)."""
        table = self.table
        if table.busy(record.id):
            return 0
        vms = list(vms)
        if record.state is SandboxState.STOPPING:
            stop = self.begin_stop(record.id, cancel_start=False, known=vms)
            return len(vms) if await self.settled(stop) else 0
        async with table.locked(record.id):
            current = await table.store.get(record.id)
            if current is None or current.state is not SandboxState.FAILED:
                return 0
            with sandbox_context(record.id, f"{record.pod_namespace}/{record.pod_name}"):
                current, _ = await table.hooks.vm_stopping(current, self._save, reaped=True)
                for vm in vms:
                    await self._delete_vm(current, vm, attempts=REAP_DELETE_ATTEMPTS)
                reason = f"{current.reason}; VM deleted by the reaper".lstrip("; ")
                await table.store.put(current.evolve(instance=None, reason=reason))
        return len(vms)

    @staticmethod
    async def settled(stop: Stop) -> bool:
        """Until the teardown ends, for the reaper's bound at most; whether it ended."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(stop.done.wait()), REAP_WAIT_SECONDS)
        return stop.done.is_set()

    async def abandon(self, sandbox_id: str, reason: str) -> None:
        """Tear down a sandbox nobody will StopVM (its shim is gone): VM, tunnel and record go,
        with a log line, `peerpods_sandboxes_abandoned_total` and the reason kept for the
        status API."""
        table = self.table
        record = await table.store.get(sandbox_id)
        if record is None or table.busy(sandbox_id):
            return
        reason = f"abandoned: {reason}"
        with sandbox_context(record.id, f"{record.pod_namespace}/{record.pod_name}"):
            log.warning("sandbox %s %s; tearing it down", sandbox_id, reason)
        metrics.ABANDONED.labels(provider=table.provider.name).inc()
        if self.table.on_abandoned is not None:
            try:
                self.table.on_abandoned(record, reason)
            except Exception:
                log.exception("on_abandoned callback failed")
        stop = self.begin_stop(sandbox_id, cancel_start=False, reason=reason)
        await asyncio.shield(stop.done.wait())

    async def mark_preempted(
        self, sandbox_id: str, instance_id: str, reason: str, *, again: bool = False
    ) -> bool:
        """Record that the cloud took a running sandbox's VM away (adaptor.hypervisor.preemption).

        True when the sandbox ran on `instance_id` and is now preempted (with `again`: was
        preempted already, and gets the new reason); False when it moved on meanwhile (stopped,
        stopping, another VM, or another check marked it first), and then nothing is written. The
        VM stays in the record, so the StopVM that follows deletes it again (idempotently).
        """
        table = self.table
        if sandbox_id in table.stops:
            return False
        async with table.locked(sandbox_id):
            record = await table.store.get(sandbox_id)
            if record is None or record.instance is None or record.instance.id != instance_id:
                return False
            wanted = SandboxState.PREEMPTED if again else SandboxState.RUNNING
            if record.state is not wanted:
                return False
            await table.store.put(record.evolve(state=SandboxState.PREEMPTED, reason=reason))
            return True

    # --- writes a full state store refused -------------------------------------------------------

    async def _save(self, record: SandboxRecord) -> SandboxRecord:
        """Write a teardown's progress; when the store refuses (disk full), the write is owed
        and retried until it lands, and the teardown goes on with the record in memory."""
        try:
            stored = await self.table.store.put(record)
        except StateError as exc:
            self._owe(record.id, record, exc)
            return record
        self._owed.pop(record.id, None)
        return stored

    def _owe(self, sandbox_id: str, record: SandboxRecord | None, exc: StateError) -> None:
        if sandbox_id not in self._owed:
            log.error(
                "sandbox %s: state write refused, retried until it lands: %s", sandbox_id, exc
            )
        self._owed[sandbox_id] = record
        self._owed_why = str(exc)
        if self._owed_task is None or self._owed_task.done():
            self._owed_task = self.table.spawn(self._write_owed(), name="owed-state-writes")

    def owed(self) -> dict[str, str]:
        """Sandboxes whose last state write the store refused: id -> what it still owes."""
        return {i: "record removal" if r is None else r.state.value for i, r in self._owed.items()}

    async def _write_owed(self) -> None:
        """Retry the refused writes, with the delete backoff, until the store takes them all: a
        torn-down sandbox is then forgotten, an unfinished one reads `stopping` (the reaper's)."""
        config = self.table.config
        delay = config.delete_retry_seconds
        while self._owed:
            await asyncio.sleep(delay)
            delay = min(delay * 2, config.delete_retry_max_seconds)
            for sandbox_id in list(self._owed):
                if not self.table.busy(sandbox_id):  # else its teardown writes it
                    await self._write_one_owed(sandbox_id)

    async def _write_one_owed(self, sandbox_id: str) -> None:
        store = self.table.store
        async with self.table.locked(sandbox_id):
            if sandbox_id not in self._owed:
                return
            record = self._owed[sandbox_id]
            try:
                if record is None:
                    await store.delete(sandbox_id)
                else:
                    await store.put(record)
            except StateError:
                return
            del self._owed[sandbox_id]
            log.info("sandbox %s: the state store took the owed write", sandbox_id)


def answer_within(deadline_seconds: float) -> float:
    """How long a call with this deadline may wait before answering: a margin is kept for the
    reply to arrive in time (a quarter of the deadline, at most 250 ms)."""
    return max(0.0, deadline_seconds - min(0.25, deadline_seconds / 4))


async def _first_of(stop: Stop, wait: float) -> None:
    """Until the teardown is done or a delete failed, `wait` seconds at most."""
    waits = [asyncio.ensure_future(event.wait()) for event in (stop.done, stop.failed)]
    try:
        await asyncio.wait(waits, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waits:
            waiter.cancel()


def _tagged(vm: Instance, sandbox_id: str, provider: Provider) -> bool:
    owner = getattr(provider, "owner_id", None)
    if owner and vm.tags.get(TAG_OWNER) != owner:
        return False
    return vm.tags.get(TAG_SANDBOX) == sandbox_id
