"""CreateVM and StartVM: record the sandbox, then plan, create the VM, record what it got, run
the hooks' steps and serve the agent socket, each step written before it is acted on.

StartVM runs as a task the table owns, so a StopVM can cancel it (StartAborted), within the
daemon's own limit whatever the caller's deadline (runtime-rs gives about 10,000 s). A start
that fails once the VM exists hands the VM to the teardown (adaptor.hypervisor.teardown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path

from adaptor.hypervisor.collaborators import AgentProxyHandle
from adaptor.hypervisor.errors import (
    SandboxBusy,
    StartAborted,
    StartTimeout,
    check_sandbox_id,
    failure_category,
    why,
)
from adaptor.hypervisor.table import SandboxTable, prepare_socket_dir
from adaptor.hypervisor.teardown import Teardowns
from adaptor.planning.placement import Plan
from adaptor.runtime import metrics
from adaptor.runtime.logs import bind_sandbox
from adaptor.state import SandboxRecord, SandboxState
from providers.core.base import Instance
from providers.core.contract import VMIntent, parse_vm_annotations
from providers.core.errors import InvalidRequest

log = logging.getLogger(__name__)

# sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107


class Starts:
    """CreateVM and StartVM over the shared table."""

    def __init__(self, table: SandboxTable, teardowns: Teardowns) -> None:
        self.table = table
        self.teardowns = teardowns

    # --- CreateVM --------------------------------------------------------------------------------

    async def create_vm(
        self, sandbox_id: str, annotations: Mapping[str, str], network_namespace: str = ""
    ) -> str:
        """Validate and durably record a sandbox; the agent socket path it will be served on."""
        table = self.table
        check_sandbox_id(sandbox_id)
        table.called.add(sandbox_id)
        intent = _checked_intent(annotations, table)
        bind_sandbox(sandbox_id, f"{intent.pod_namespace}/{intent.pod_name}")
        path = str(table.socket_path(sandbox_id))
        if len(path.encode()) > MAX_SOCKET_PATH_BYTES:
            raise InvalidRequest(f"agent socket path {path} is too long for a unix socket")
        self._refuse_if_stopping(sandbox_id)
        table.refuse_when_draining()
        async with table.locked(sandbox_id):
            existing = await table.store.get(sandbox_id)
            if existing is not None:
                return existing.agent_socket or path
            record = SandboxRecord(
                id=sandbox_id,
                pod_namespace=intent.pod_namespace,
                pod_name=intent.pod_name,
                annotations=dict(annotations),
                network_namespace=network_namespace,
                agent_socket=path,
            )
            stored = await self._record(record)
            if stored.annotations != record.annotations:  # a hook planned the VM (DRA claims)
                intent = _checked_intent(stored.annotations, table)
            table.intents[sandbox_id] = intent
        log.info(
            "sandbox %s recorded for pod %s/%s", sandbox_id, intent.pod_namespace, intent.pod_name
        )
        return path

    async def _record(self, record: SandboxRecord) -> SandboxRecord:
        """The new sandbox, as the hooks make it (its pod network inspected), written."""
        hooks = self.table.hooks
        record = await hooks.sandbox_created(record)
        try:
            return await self.table.store.put(record)
        except BaseException:
            await asyncio.shield(hooks.create_failed(record))
            raise

    def _refuse_if_stopping(self, sandbox_id: str) -> None:
        if sandbox_id in self.table.stops:
            raise SandboxBusy(f"sandbox {sandbox_id} is stopping")

    # --- StartVM ---------------------------------------------------------------------------------

    async def start_vm(self, sandbox_id: str) -> None:
        """Create the VM, connect its forwarder and serve the agent socket.

        Runs as a task the manager owns, so a StopVM can cancel it (StartAborted), within the
        daemon's own limit (StartTimeout); a caller giving up cancels it too.
        """
        table = self.table
        check_sandbox_id(sandbox_id)
        table.called.add(sandbox_id)
        self._refuse_if_stopping(sandbox_id)
        table.refuse_when_draining()
        task = table.spawn(self._start(sandbox_id), name=f"start-{sandbox_id}")
        table.starts.setdefault(sandbox_id, set()).add(task)
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the caller itself gave up (its deadline, or shutdown)
            raise StartAborted(f"sandbox {sandbox_id}: StartVM aborted by StopVM") from None
        finally:
            tasks = table.starts.get(sandbox_id, set())
            tasks.discard(task)
            if not tasks:
                table.starts.pop(sandbox_id, None)

    async def _start(self, sandbox_id: str) -> None:
        table = self.table
        async with table.locked(sandbox_id):
            record = await table.require(sandbox_id)
            if record.state is SandboxState.RUNNING and sandbox_id in table.proxies:
                return
            if record.state is SandboxState.STOPPING or record.instance is not None:
                raise SandboxBusy(
                    f"sandbox {sandbox_id} is {record.state.value}"
                    + (f" ({record.reason})" if record.reason else "")
                    + "; stop it first"
                )
            limit = table.config.start_timeout_seconds
            try:
                async with asyncio.timeout(limit):
                    await self._start_steps(record)
            except TimeoutError:
                raise StartTimeout(
                    f"sandbox {sandbox_id}: StartVM did not finish within {limit:g}s"
                ) from None

    async def _start_steps(self, record: SandboxRecord) -> None:
        table = self.table
        plan = await self._plan(record)
        record, instance = await self._create(record, plan)
        proxy: AgentProxyHandle | None = None
        try:
            if not record.device_plan:  # it could not be made with the VM's record: say why
                record = await self._record_devices(record, plan, instance)
            # What the hooks made (the pod's tunnel, ready) is written with the state running:
            # each wrote ahead what a teardown must know before making it.
            record = await table.hooks.vm_created(record)
            proxy = await self._serve(record, instance)
            record = await table.store.put(record.evolve(state=SandboxState.RUNNING))
        except BaseException as exc:
            await self._abort_start(record, instance, proxy, exc)
            raise
        table.proxies[record.id] = proxy
        log.info("sandbox %s running, agent socket %s", record.id, record.agent_socket)

    async def _plan(self, record: SandboxRecord) -> Plan:
        """Step 1: the typed plan (selection, quota). A refusal leaves the sandbox failed."""
        table = self.table
        try:
            intent = table.intents.pop(record.id, None)
            if intent is None:
                intent = _checked_intent(record.annotations, table)
            return await table.placement.plan(intent, record.id)
        except BaseException as exc:
            table.placement.release(record.id)
            await self._failed(record, "selection", exc)
            raise

    async def _create(self, record: SandboxRecord, plan: Plan) -> tuple[SandboxRecord, Instance]:
        """Step 2: the VM, recorded the moment the provider returns it, with its device plan
        (step 3) in the same write."""
        table = self.table
        record = await table.store.put(record.evolve(state=SandboxState.STARTING, reason=""))
        started = time.monotonic()
        try:
            user_data = table.user_data(record, plan) if table.user_data is not None else ""
            spec = plan.vm_spec(user_data)
            # a warm VM when the placement's choice matches one; else, or when adopting it
            # fails (the pod does not notice), a VM launched for it
            adopted = await table.warm.adopt(spec) if table.warm is not None else None
            instance = adopted or await table.provider.create(spec)
        except BaseException as exc:
            table.placement.release(record.id)
            await self._failed(record, "create", exc)
            raise
        metrics.VM_CREATE_SECONDS.labels(provider=table.provider.name).observe(
            time.monotonic() - started
        )
        log.info("sandbox %s: VM %s (%s) created", record.id, instance.id, instance.instance_type)
        recorded = record.evolve(instance=instance, device_plan="")
        with contextlib.suppress(Exception):  # raised again by `_record_devices`, once recorded
            recorded = recorded.evolve(device_plan=plan.devices_for(instance).to_json())
        record = await asyncio.shield(table.store.put(recorded))
        return record, instance

    async def _record_devices(
        self, record: SandboxRecord, plan: Plan, instance: Instance
    ) -> SandboxRecord:
        """Step 3 on its own, when the plan could not be made as the VM was recorded: the
        device plan of the VM it got, stored for CreateContainer (or the error, raised)."""
        devices = plan.devices_for(instance)
        return await self.table.store.put(record.evolve(device_plan=devices.to_json()))

    async def _serve(self, record: SandboxRecord, instance: Instance) -> AgentProxyHandle:
        """Step 4, after the hooks' `vm_created` (the pod's tunnel): dial the forwarder, then
        serve the agent socket."""
        table = self.table
        host, port = table.default_endpoint(instance)
        socket = Path(record.agent_socket)
        await asyncio.to_thread(prepare_socket_dir, socket)
        proxy = table.proxy_factory(record, str(socket), host, port)
        try:
            await proxy.connect(table.config.proxy_timeout_seconds)
            await proxy.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await proxy.stop()
            raise
        return proxy

    async def _failed(self, record: SandboxRecord, step: str, exc: BaseException) -> None:
        """A start refused before any VM exists: state, reason, one log line, a metric."""
        reason = why(step, exc)
        if not isinstance(exc, asyncio.CancelledError):
            log.warning("sandbox %s: StartVM failed: %s", record.id, reason)
        metrics.START_FAILURES.labels(reason=failure_category(exc)).inc()
        await asyncio.shield(
            self.table.store.put(record.evolve(state=SandboxState.FAILED, reason=reason))
        )

    async def _abort_start(
        self,
        record: SandboxRecord,
        instance: Instance,
        proxy: AgentProxyHandle | None,
        exc: BaseException,
    ) -> None:
        """Undo a StartVM that failed after the VM existed: the VM is deleted (by the teardown
        task, which a cancelled start does not wait for) and the sandbox left failed."""
        table = self.table
        reason = why("start", exc)
        log.warning(
            "sandbox %s: StartVM failed: %s; deleting VM %s", record.id, reason, instance.id
        )
        metrics.START_FAILURES.labels(reason=failure_category(exc)).inc()
        table.placement.release(record.id)
        teardown = table.spawn(
            self.teardowns.failed_start(record, instance, proxy, reason), name=f"abort-{record.id}"
        )
        await asyncio.shield(teardown)


def _checked_intent(annotations: Mapping[str, str], table: SandboxTable) -> VMIntent:
    """The pod's VM intent from its annotations, within the node's VM policy."""
    intent = parse_vm_annotations(annotations)
    table.vm_policy(intent)
    return intent
