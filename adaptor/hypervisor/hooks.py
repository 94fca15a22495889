"""The one way to add a step to the sandbox lifecycle: a `SandboxHook` and its fixed points
(CreateVM, the VM created, stopping, reaped, recovered, gone), and `Hooks`, which runs them in
order and writes the records they return. The pod network is one (adaptor.hypervisor.pod_network),
the device book's cleanup another (adaptor.node.wiring)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from adaptor.state import SandboxRecord
from providers.core.errors import PeerpodsError

# Writes a record durably (shielded from cancellation) and returns it as stored: how a hook
# writes ahead what it is about to make.
SaveRecord = Callable[[SandboxRecord], Awaitable[SandboxRecord]]


class TeardownOwed(PeerpodsError):
    """A hook's teardown left something behind: `record` says what (it is kept), the message
    why; the VM is deleted all the same and StopVM answers that a retry is owed."""

    def __init__(self, message: str, record: SandboxRecord) -> None:
        super().__init__(message)
        self.record = record


class PodGone(PeerpodsError):
    """At recovery: the sandbox's pod is gone (its network namespace), so is its shim."""


class SandboxHook:
    """A step added to the lifecycle at fixed points; every method here does nothing. Hooks run
    in the order given, each getting the record as the one before left it; a record a hook
    returns changed is written to the store (at `vm_created`, with the step that follows).

    `sandbox_created`: at CreateVM, before the record is first written (`create_failed` if that
    write fails). `vm_created`: once the VM exists and is recorded, before the forwarder is
    dialled (an error fails the start, which then deletes the VM and calls `vm_stopping`); `save`
    writes ahead what the hook is about to make, and the record it returns is written with the
    state running, once the agent socket is served (a start cut short before then is torn down
    from what was written ahead). `vm_stopping`: at StopVM (and when a started VM
    is torn down) after the proxy stopped and before the VM is deleted; idempotent (it may run
    again after a restart); TeardownOwed keeps its remains recorded. `vm_deleted`: once the VM
    is deleted (at StopVM, or a start undone), before the record goes: a teardown that
    `vm_stopping` left finishing in the background, while the VM was deleted, is awaited here.
    `vm_reaped`: before the reaper deletes the VM of a failed sandbox that stays recorded (by
    default `vm_stopping`). `recovered`: at a restart, before the sandbox is served again
    (PodGone: tear it down). `sandbox_gone`: once the sandbox is forgotten.
    """

    async def sandbox_created(self, record: SandboxRecord) -> SandboxRecord:
        """At CreateVM, before the record is written."""
        return record

    async def create_failed(self, record: SandboxRecord) -> None:
        """CreateVM could not write the record `sandbox_created` returned."""

    async def vm_created(self, record: SandboxRecord, save: SaveRecord) -> SandboxRecord:
        """After the VM exists (record.instance is set)."""
        return record

    async def vm_stopping(self, record: SandboxRecord) -> SandboxRecord:
        """Before the VM is deleted."""
        return record

    async def vm_deleted(self, record: SandboxRecord) -> None:
        """After the VM is deleted (StopVM, a start undone), before the record is forgotten."""

    async def vm_reaped(self, record: SandboxRecord) -> SandboxRecord:
        """Before the reaper deletes a failed sandbox's VM (the record stays)."""
        return await self.vm_stopping(record)

    async def recovered(self, record: SandboxRecord) -> SandboxRecord:
        """At a restart or take-over, before the sandbox is served again."""
        return record

    async def sandbox_gone(self, sandbox_id: str) -> None:
        """After the sandbox is forgotten."""


class Hooks:
    """The hooks in their order, run at each point; a record a hook returns changed is saved
    (at `vm_created`, by the caller)."""

    def __init__(self, hooks: Sequence[SandboxHook], save: SaveRecord) -> None:
        self.hooks = tuple(hooks)
        self._save = save

    async def sandbox_created(self, record: SandboxRecord) -> SandboxRecord:
        """The record to write at CreateVM (nothing is saved yet)."""
        for hook in self.hooks:
            record = await hook.sandbox_created(record)
        return record

    async def create_failed(self, record: SandboxRecord) -> None:
        for hook in self.hooks:
            await hook.create_failed(record)

    async def vm_created(self, record: SandboxRecord) -> SandboxRecord:
        """The record after every hook's step, not written: the caller writes it with its next
        state (each hook wrote ahead with `save` what a teardown must know)."""
        for hook in self.hooks:
            record = await hook.vm_created(record, self._save)
        return record

    async def vm_stopping(
        self, record: SandboxRecord, save: SaveRecord, *, reaped: bool = False
    ) -> tuple[SandboxRecord, str]:
        """Every hook's teardown (`vm_reaped` with `reaped`), each change written with `save`:
        the record, and what is still owed ("" when nothing)."""
        owed: list[str] = []
        for hook in self.hooks:
            try:
                updated = await (hook.vm_reaped if reaped else hook.vm_stopping)(record)
            except TeardownOwed as exc:
                owed.append(str(exc))
                updated = exc.record
            if updated != record:
                record = await save(updated)
        return record, "; ".join(owed)

    async def vm_deleted(self, record: SandboxRecord) -> None:
        for hook in self.hooks:
            await hook.vm_deleted(record)

    async def recovered(self, record: SandboxRecord) -> SandboxRecord:
        """The record after every hook's repair (PodGone propagates)."""
        for hook in self.hooks:
            updated = await hook.recovered(record)
            if updated != record:
                record = await self._save(updated)
        return record

    async def sandbox_gone(self, sandbox_id: str) -> None:
        for hook in self.hooks:
            await hook.sandbox_gone(sandbox_id)
