"""The sandbox lifecycle behind Kata's remote hypervisor API, free of any wire format.

CreateVM records, StartVM creates the VM and its agent proxy, StopVM tears both down. Every step
is written to the state store before it is acted on or answered, so a restarted daemon knows
which VMs exist; a VM that was created is either recorded or deleted, whatever fails.

The manager has three collaborators: the provider (VMs), the placement (the typed plan: which
candidates, what devices, the pod VM's user data) and the state store. StartVM and StopVM are
small steps in order (`_plan`, `_create`, `_record_devices`, hooks, `_serve`; `_stop_proxy`,
hooks, `_delete_vm`, `_forget`); a `SandboxHook` adds a step after the VM exists and at stop
(e.g. the pod network) without touching the rest.

Calls for one sandbox are serialized by a per-sandbox lock, with one exception: StopVM never
waits behind StartVM. It cancels a start in flight, records that the sandbox is stopping, and
hands the teardown to a task the manager owns; it answers once the cloud confirms the delete or
when the caller's deadline (runtime-rs gives 1 s) is near, whichever comes first, while the
deletion goes on, retried, until the cloud confirms it. StartVM enforces its own limit whatever
the caller's deadline (runtime-rs gives about 10,000 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from adaptor.planning.placement import Plan
from adaptor.runtime import metrics
from adaptor.runtime.logs import bind_sandbox, sandbox_context
from adaptor.settings import SandboxSettings
from adaptor.state import SandboxRecord, SandboxState, StateError, StateStore
from providers.core.base import TAG_OWNER, TAG_SANDBOX, Instance, Provider
from providers.core.contract import VMIntent, parse_vm_annotations
from providers.core.errors import (
    CapacityError,
    Fault,
    InstanceNotFound,
    InvalidRequest,
    NoMatch,
    PeerpodsError,
    ProviderError,
    QuotaExhausted,
    TransientError,
)

log = logging.getLogger(__name__)

AGENT_SOCKET_NAME = "agent.ttrpc"
# sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
_SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# The reaper's bounds per sandbox and sweep (the next sweep tries again).
REAP_DELETE_ATTEMPTS = 3
REAP_WAIT_SECONDS = 120.0
# Sandboxes recovered side by side at a restart or take-over (each opens a socket, maybe a netns).
RECOVER_CONCURRENCY = 64


class SandboxNotFound(PeerpodsError):
    """No sandbox with this id was created (or it was already stopped)."""

    fault = Fault.NOT_FOUND


class SandboxBusy(PeerpodsError):
    """The sandbox is in a state where this call cannot proceed (the message says why)."""

    fault = Fault.BUSY


class StartAborted(PeerpodsError):
    """StartVM gave way to a StopVM of the same sandbox."""

    fault = Fault.ABORTED


class StartTimeout(PeerpodsError):
    """StartVM ran past the daemon's own limit (--start-timeout)."""

    fault = Fault.TIMEOUT


class ShuttingDown(TransientError):
    """The daemon is draining before it exits: no new sandbox starts here (the next one will)."""


class AgentProxyHandle(Protocol):
    """What the manager needs of a sandbox's agent proxy."""

    async def start(self) -> None:
        """Listen on the agent socket."""
        ...

    async def connect(self, timeout_seconds: float) -> None:
        """Dial the pod VM forwarder, retrying until the timeout."""
        ...

    async def stop(self) -> None:
        """Close the agent socket and the upstream connection."""
        ...

    @property
    def shims(self) -> int:
        """Shim connections open now."""
        ...

    async def wait_for_shim(self) -> None:
        """Until a shim has connected to the agent socket since `start`."""
        ...


class PodNetworkHook(Protocol):
    """The pod network (adaptor.podnet.SandboxPodNetwork); its strings go in `pod_network`."""

    async def created(self, sandbox_id: str, netns: str) -> str: ...

    async def forget(self, sandbox_id: str, pod_network: str) -> None: ...

    async def prepare(self, record: SandboxRecord, instance: Instance) -> str: ...

    async def started(self, record: SandboxRecord, instance: Instance) -> str: ...

    async def stop(self, record: SandboxRecord) -> str: ...

    async def recovered(self, record: SandboxRecord) -> str: ...

    @staticmethod
    def failed_teardown(record: SandboxRecord, error: str) -> str: ...


# (sandbox record, agent socket path, forwarder host, forwarder port) -> an unstarted proxy
ProxyFactory = Callable[[SandboxRecord, str, str, int], AgentProxyHandle]


class Planner(Protocol):
    """What StartVM needs of placement (adaptor.planning.placement.Placement is the one)."""

    async def plan(self, intent: VMIntent, sandbox_id: str) -> Plan:
        """The typed plan: candidates best first, reserved against the quota pool."""
        ...

    def release(self, sandbox_id: str) -> None:
        """Forget the sandbox's reservation (its start failed, or it stopped)."""
        ...

    def user_data_for(self, record: SandboxRecord, plan: Plan) -> str:
        """The pod VM's user data for the sandbox and its plan."""
        ...


class SandboxHook:
    """A step added to StartVM and StopVM; every method here does nothing.

    `vm_created` runs once the VM exists and is recorded, before the forwarder is dialled (an
    error fails the start, which then deletes the VM and calls `vm_stopping`); `vm_stopping`
    runs at StopVM (and when a started VM is torn down) after the proxy stopped and before the
    VM is deleted, and must be idempotent (it may run again after a restart); `sandbox_gone`
    runs once the sandbox is forgotten. Hooks run in the order given.
    """

    async def vm_created(self, record: SandboxRecord) -> None:
        """After the VM exists (record.instance is set)."""

    async def vm_stopping(self, record: SandboxRecord) -> None:
        """Before the VM is deleted."""

    async def sandbox_gone(self, sandbox_id: str) -> None:
        """After the sandbox is forgotten."""


def check_sandbox_id(sandbox_id: str) -> str:
    """A sandbox id must be usable as one path component (it names the socket directory)."""
    if not _SANDBOX_ID.fullmatch(sandbox_id):
        raise InvalidRequest(
            f"invalid sandbox id {sandbox_id[:80]!r}: want 1-128 characters of "
            "[A-Za-z0-9_.-] starting with a letter or digit"
        )
    return sandbox_id


class ManagerConfig(SandboxSettings):
    """The daemon settings the lifecycle needs: the sandbox section (pods dir, forwarder port,
    StartVM's and StopVM's limits) and the lifecycle's own tuning below."""

    # Backoff between retries of a VM delete that failed (doubling up to the cap); the same
    # backoff retries the state writes a full disk refused.
    delete_retry_seconds: float = 1.0
    delete_retry_max_seconds: float = 30.0


@dataclass
class _Stop:
    """A teardown in flight: done when the sandbox is forgotten; `failed` once a delete failed
    (its reason in `error`), for StopVM's answer."""

    task: asyncio.Task[None] | None = None
    error: str = ""
    left: str = ""  # set when the teardown ended with something still owed
    done: asyncio.Event = field(default_factory=asyncio.Event)
    failed: asyncio.Event = field(default_factory=asyncio.Event)


class SandboxManager:
    """Owns every sandbox on this node: records, VMs and agent proxies."""

    def __init__(
        self,
        config: ManagerConfig,
        store: StateStore,
        provider: Provider,
        placement: Planner,
        proxies: ProxyFactory,
        *,
        hooks: Sequence[SandboxHook] = (),
        pod_network: PodNetworkHook | None = None,
        vm_policy: Callable[[VMIntent], None] | None = None,
        on_abandoned: Callable[[SandboxRecord, str], None] | None = None,
    ) -> None:
        self.config = config
        # told of each sandbox given up because its shim never came back (the status API)
        self._on_abandoned = on_abandoned
        # the node's own limits on a pod's VM choices (adaptor.planning.vmpolicy),
        # at CreateVM and StartVM
        self._vm_policy = vm_policy or (lambda _intent: None)
        self.store = store
        self.provider = provider
        self.placement = placement
        self.hooks = tuple(hooks)
        self._pod_network = pod_network
        self._proxy_factory = proxies
        self._proxies: dict[str, AgentProxyHandle] = {}
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._starts: dict[str, set[asyncio.Task[None]]] = {}
        self._stops: dict[str, _Stop] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        # writes a full state store refused: sandbox id -> the record to put (None: delete it)
        self._owed: dict[str, SandboxRecord | None] = {}
        self._owed_why = ""
        self._owed_task: asyncio.Task[None] | None = None
        # sandboxes a hypervisor call named since start (a shim that is still there)
        self._called: set[str] = set()
        # while draining (shutdown), no new sandbox starts; ended teardowns are noted
        self._draining = False
        self._ended: set[str] = set()
        self._teardown_ended = asyncio.Event()
        self._closed = False
        # At a hand-off (adaptor.node.handoff): serves a recovered sandbox's inherited agent
        # sockets with the proxy made for it, or answers False to have the proxy start afresh.
        self.adopt: Callable[[str, AgentProxyHandle], Awaitable[bool]] | None = None

    # --- helpers ---------------------------------------------------------------------------------

    def default_endpoint(self, instance: Instance) -> tuple[str, int]:
        """The VM's first address, at its own port or --forwarder-port."""
        if not instance.addresses:
            raise ProviderError(f"VM {instance.id} has no address")
        return instance.addresses[0], instance.port or self.config.forwarder_port

    def socket_path(self, sandbox_id: str) -> Path:
        return self.config.pods_dir / sandbox_id / AGENT_SOCKET_NAME

    @contextlib.asynccontextmanager
    async def _locked(self, sandbox_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(sandbox_id, (asyncio.Lock(), 0))
        self._locks[sandbox_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[sandbox_id]
            if users <= 1:
                del self._locks[sandbox_id]
            else:
                self._locks[sandbox_id] = (lock, users - 1)

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _refuse_when_draining(self) -> None:
        if self._draining:
            raise ShuttingDown("the adaptor is shutting down; the next one takes new sandboxes")

    async def _require(self, sandbox_id: str) -> SandboxRecord:
        record = await self.store.get(check_sandbox_id(sandbox_id))
        if record is None:
            raise SandboxNotFound(f"no sandbox {sandbox_id}")
        # Every later log line of this call (and of tasks it starts) names the sandbox and pod.
        bind_sandbox(record.id, f"{record.pod_namespace}/{record.pod_name}")
        return record

    async def _hooks(self, step: str, *args: Any) -> None:
        for hook in self.hooks:
            await getattr(hook, step)(*args)

    # --- CreateVM --------------------------------------------------------------------------------

    async def create_vm(
        self, sandbox_id: str, annotations: Mapping[str, str], network_namespace: str = ""
    ) -> str:
        """Validate and durably record a sandbox; the agent socket path it will be served on."""
        check_sandbox_id(sandbox_id)
        self._called.add(sandbox_id)
        intent = parse_vm_annotations(annotations)
        self._vm_policy(intent)
        bind_sandbox(sandbox_id, f"{intent.pod_namespace}/{intent.pod_name}")
        path = str(self.socket_path(sandbox_id))
        if len(path.encode()) > MAX_SOCKET_PATH_BYTES:
            raise InvalidRequest(f"agent socket path {path} is too long for a unix socket")
        if sandbox_id in self._stops:
            raise SandboxBusy(f"sandbox {sandbox_id} is stopping")
        self._refuse_when_draining()
        async with self._locked(sandbox_id):
            existing = await self.store.get(sandbox_id)
            if existing is not None:
                return existing.agent_socket or path
            pod_network = ""
            if self._pod_network is not None:
                pod_network = await self._pod_network.created(sandbox_id, network_namespace)
            try:
                await self.store.put(
                    SandboxRecord(
                        id=sandbox_id,
                        pod_namespace=intent.pod_namespace,
                        pod_name=intent.pod_name,
                        annotations=dict(annotations),
                        network_namespace=network_namespace,
                        agent_socket=path,
                        pod_network=pod_network,
                    )
                )
            except BaseException:
                if self._pod_network is not None:
                    await asyncio.shield(self._pod_network.forget(sandbox_id, pod_network))
                raise
        log.info(
            "sandbox %s recorded for pod %s/%s", sandbox_id, intent.pod_namespace, intent.pod_name
        )
        return path

    # --- StartVM ---------------------------------------------------------------------------------

    async def start_vm(self, sandbox_id: str) -> None:
        """Create the VM, connect its forwarder and serve the agent socket.

        Runs as a task the manager owns, so a StopVM can cancel it (StartAborted), within the
        daemon's own limit (StartTimeout); a caller giving up cancels it too.
        """
        check_sandbox_id(sandbox_id)
        self._called.add(sandbox_id)
        if sandbox_id in self._stops:
            raise SandboxBusy(f"sandbox {sandbox_id} is stopping")
        self._refuse_when_draining()
        task = self._spawn(self._start(sandbox_id), name=f"start-{sandbox_id}")
        self._starts.setdefault(sandbox_id, set()).add(task)
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the caller itself gave up (its deadline, or shutdown)
            raise StartAborted(f"sandbox {sandbox_id}: StartVM aborted by StopVM") from None
        finally:
            tasks = self._starts.get(sandbox_id, set())
            tasks.discard(task)
            if not tasks:
                self._starts.pop(sandbox_id, None)

    async def _start(self, sandbox_id: str) -> None:
        async with self._locked(sandbox_id):
            record = await self._require(sandbox_id)
            if record.state is SandboxState.RUNNING and sandbox_id in self._proxies:
                return
            if record.state is SandboxState.STOPPING or record.instance is not None:
                raise SandboxBusy(
                    f"sandbox {sandbox_id} is {record.state.value}"
                    + (f" ({record.reason})" if record.reason else "")
                    + "; stop it first"
                )
            limit = self.config.start_timeout_seconds
            try:
                async with asyncio.timeout(limit):
                    await self._start_steps(record)
            except TimeoutError:
                raise StartTimeout(
                    f"sandbox {sandbox_id}: StartVM did not finish within {limit:g}s"
                ) from None

    async def _start_steps(self, record: SandboxRecord) -> None:
        plan = await self._plan(record)
        record, instance = await self._create(record, plan)
        proxy: AgentProxyHandle | None = None
        try:
            record = await self._record_devices(record, plan, instance)
            record = await self._start_pod_network(record, instance)
            await self._hooks("vm_created", record)
            proxy = await self._serve(record, instance)
            record = await self.store.put(record.evolve(state=SandboxState.RUNNING))
        except BaseException as exc:
            await self._abort_start(record, instance, proxy, exc)
            raise
        self._proxies[record.id] = proxy
        log.info("sandbox %s running, agent socket %s", record.id, record.agent_socket)

    async def _plan(self, record: SandboxRecord) -> Plan:
        """Step 1: the typed plan (selection, quota). A refusal leaves the sandbox failed."""
        try:
            intent = parse_vm_annotations(record.annotations)
            self._vm_policy(intent)
            return await self.placement.plan(intent, record.id)
        except BaseException as exc:
            self.placement.release(record.id)
            await self._failed(record, "selection", exc)
            raise

    async def _create(self, record: SandboxRecord, plan: Plan) -> tuple[SandboxRecord, Instance]:
        """Step 2: the VM, recorded the moment the provider returns it."""
        record = await self.store.put(record.evolve(state=SandboxState.STARTING, reason=""))
        started = time.monotonic()
        try:
            spec = plan.vm_spec(self.placement.user_data_for(record, plan))
            instance = await self.provider.create(spec)
        except BaseException as exc:
            self.placement.release(record.id)
            await self._failed(record, "create", exc)
            raise
        metrics.VM_CREATE_SECONDS.labels(provider=self.provider.name).observe(
            time.monotonic() - started
        )
        log.info("sandbox %s: VM %s (%s) created", record.id, instance.id, instance.instance_type)
        record = await asyncio.shield(self.store.put(record.evolve(instance=instance)))
        return record, instance

    async def _record_devices(
        self, record: SandboxRecord, plan: Plan, instance: Instance
    ) -> SandboxRecord:
        """Step 3: the device plan of the VM it got, stored for CreateContainer."""
        devices = plan.devices_for(instance)
        return await self.store.put(record.evolve(device_plan=devices.to_json()))

    async def _start_pod_network(self, record: SandboxRecord, instance: Instance) -> SandboxRecord:
        """Step 4: the pod's tunnel to the VM (when the pod has a network namespace)."""
        if self._pod_network is None or not record.pod_network:
            return record
        # Write-ahead: the tunnel's VM end is stored before its first part is made, so a
        # teardown after any interruption (StopVM, a kill) knows what to remove.
        ahead = await self._pod_network.prepare(record, instance)
        record = await asyncio.shield(self.store.put(record.evolve(pod_network=ahead)))
        tunnel = await self._pod_network.started(record, instance)
        return await self.store.put(record.evolve(pod_network=tunnel))

    async def _serve(self, record: SandboxRecord, instance: Instance) -> AgentProxyHandle:
        """Step 5: dial the forwarder, then serve the agent socket."""
        host, port = self.default_endpoint(instance)
        socket = Path(record.agent_socket)
        await asyncio.to_thread(_prepare_socket_dir, socket)
        proxy = self._proxy_factory(record, str(socket), host, port)
        try:
            await proxy.connect(self.config.proxy_timeout_seconds)
            await proxy.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await proxy.stop()
            raise
        return proxy

    async def _failed(self, record: SandboxRecord, step: str, exc: BaseException) -> None:
        """A start refused before any VM exists: state, reason, one log line, a metric."""
        reason = _why(step, exc)
        if not isinstance(exc, asyncio.CancelledError):
            log.warning("sandbox %s: StartVM failed: %s", record.id, reason)
        metrics.START_FAILURES.labels(reason=failure_category(exc)).inc()
        await asyncio.shield(
            self.store.put(record.evolve(state=SandboxState.FAILED, reason=reason))
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
        reason = _why("start", exc)
        log.warning(
            "sandbox %s: StartVM failed: %s; deleting VM %s", record.id, reason, instance.id
        )
        metrics.START_FAILURES.labels(reason=failure_category(exc)).inc()
        self.placement.release(record.id)
        teardown = self._spawn(
            self._teardown_failed(record, instance, proxy, reason), name=f"abort-{record.id}"
        )
        await asyncio.shield(teardown)

    async def _teardown_failed(
        self,
        record: SandboxRecord,
        instance: Instance,
        proxy: AgentProxyHandle | None,
        reason: str,
    ) -> None:
        if proxy is not None:
            with contextlib.suppress(Exception):
                await proxy.stop()
        # The stored record, not the start's copy: its tunnel may be further on (write-ahead).
        record = await self.store.get(record.id) or record
        record = await self.store.put(record.evolve(state=SandboxState.FAILED, reason=reason))
        record, owed = await self._stop_pod_network(record)
        if owed:
            reason = f"{reason}; {owed}"
            record = await self.store.put(record.evolve(reason=reason))
        try:
            await self._hooks("vm_stopping", record)
            await self.provider.delete(instance.id)
        except InstanceNotFound:
            pass
        except Exception as exc:
            # The record keeps the VM: StopVM (or the reaper) deletes it.
            await self.store.put(record.evolve(reason=f"{reason}; {_why('delete', exc)}"))
            return
        if record.id in self._stops:
            return  # the StopVM in flight forgets the sandbox
        await asyncio.to_thread(_remove_socket_dir, Path(record.agent_socket))
        await self.store.put(record.evolve(instance=None))

    # --- StopVM ----------------------------------------------------------------------------------

    async def stop_vm(self, sandbox_id: str, deadline_seconds: float | None = None) -> None:
        """Tear the sandbox down: cancel a start in flight, stop the proxy, delete the VM,
        forget the sandbox.

        The teardown runs as a task the manager owns and keeps retrying the delete until the
        cloud confirms it; this call answers when it is done, or a little before
        `deadline_seconds` (the caller's deadline), or after `stop_wait_seconds`, whichever is
        first. ProviderError when the delete failed and is still being retried.
        """
        check_sandbox_id(sandbox_id)
        self._called.add(sandbox_id)
        stop = self._stops.get(sandbox_id)
        if stop is not None:
            stop.failed.clear()  # joining a teardown: only a failure from now on is news
        else:
            record = await self._require(sandbox_id)
            with contextlib.suppress(Exception):
                # Durable before anything else: a restarted daemon finishes the teardown.
                await self.store.set_state(sandbox_id, SandboxState.STOPPING, "StopVM")
            stop = self._begin_stop(record.id, cancel_start=True)
        wait = self.config.stop_wait_seconds
        if deadline_seconds is not None and deadline_seconds > 0:
            wait = min(wait, answer_within(deadline_seconds))
        waits = [asyncio.ensure_future(event.wait()) for event in (stop.done, stop.failed)]
        try:
            await asyncio.wait(waits, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
        if stop.done.is_set() and stop.left:
            raise ProviderError(f"sandbox {sandbox_id}: {stop.left}")
        if stop.done.is_set():
            log.info("sandbox %s stopped", sandbox_id)
            return
        if stop.error:
            raise ProviderError(f"sandbox {sandbox_id}: {stop.error}")
        log.info("sandbox %s: StopVM answered, the VM delete goes on", sandbox_id)

    def _begin_stop(
        self,
        sandbox_id: str,
        *,
        cancel_start: bool,
        known: Sequence[Instance] = (),
        reason: str = "",
    ) -> _Stop:
        """Start (or join) the sandbox's teardown task; `known` are VMs found by a listing,
        `reason` (default: the recorded one, or "StopVM") is what the record says meanwhile."""
        stop = self._stops.get(sandbox_id)
        if stop is not None:
            return stop
        aborted = False
        if cancel_start:
            for task in self._starts.get(sandbox_id, ()):
                aborted = task.cancel() or aborted
        stop = _Stop()
        self._stops[sandbox_id] = stop
        stop.task = self._spawn(
            self._teardown(sandbox_id, aborted, tuple(known), reason), name=f"stop-{sandbox_id}"
        )

        def finished(task: asyncio.Task[None]) -> None:
            # A teardown that ended early never reads as done: StopVM answers why.
            if task.cancelled():
                stop.left = stop.left or "teardown interrupted (the next start finishes it)"
            elif (exc := task.exception()) is not None:
                stop.left = stop.left or _why("teardown", exc)
                log.error("sandbox %s: %s", sandbox_id, stop.left)
            stop.done.set()
            if self._stops.get(sandbox_id) is stop:
                del self._stops[sandbox_id]
            if self._draining:
                self._ended.add(sandbox_id)
                self._teardown_ended.set()

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
        async with self._locked(sandbox_id):
            record = await self.store.get(sandbox_id)
            if record is None:
                return
            with sandbox_context(record.id, f"{record.pod_namespace}/{record.pod_name}"):
                why = reason or record.reason or "StopVM"
                record = await self._save(record.evolve(state=SandboxState.STOPPING, reason=why))
                await self._stop_proxy(record)
                record, owed = await self._stop_pod_network(record)
                await self._hooks("vm_stopping", record)
                for instance in await self._vms_of(record, start_aborted, known):
                    await self._delete_vm(record, instance)
                stop = self._stops.get(sandbox_id)
                if owed:
                    # The VM is gone; the tunnel's remains stay recorded until a retry removes
                    # them (the next StopVM, or a restart).
                    await self._save(
                        record.evolve(state=SandboxState.FAILED, reason=owed, instance=None)
                    )
                    if stop is not None:
                        stop.error = stop.left = f"{owed}; retry StopVM"
                        stop.failed.set()
                    return
                await self._forget(record)
                if sandbox_id in self._owed and stop is not None:
                    stop.left = (
                        f"the VM is deleted, but the state store cannot be written "
                        f"({self._owed_why}); its record is removed once it can"
                    )
                    return
        log.info("sandbox %s: torn down", sandbox_id)

    async def _stop_proxy(self, record: SandboxRecord) -> None:
        proxy = self._proxies.pop(record.id, None)
        if proxy is not None:
            with contextlib.suppress(Exception):
                await proxy.stop()

    async def _stop_pod_network(self, record: SandboxRecord) -> tuple[SandboxRecord, str]:
        """Tear the sandbox's tunnel down: the record as stored, and what is still owed."""
        if self._pod_network is None or not record.pod_network:
            return record, ""
        try:
            remaining = await self._pod_network.stop(record)
        except PeerpodsError as exc:
            owed = str(exc)
            remaining = self._pod_network.failed_teardown(record, owed)
            log.error("sandbox %s: %s", record.id, owed)
            return await self._save(record.evolve(pod_network=remaining)), owed
        return await self._save(record.evolve(pod_network=remaining)), ""

    async def _vms_of(
        self, record: SandboxRecord, start_aborted: bool, known: tuple[Instance, ...]
    ) -> list[Instance]:
        """The VMs to delete: the recorded one and `known`; after an aborted start, also any VM
        the provider lists with this sandbox's tag (a create cut short before it was recorded)."""
        found = [record.instance] if record.instance is not None else []
        found += known
        if start_aborted and not found:
            with contextlib.suppress(ProviderError, TimeoutError):
                async with asyncio.timeout(self.config.stop_wait_seconds):
                    owned = await self.provider.list_owned()
                found += [vm for vm in owned if _tagged(vm, record.id, self.provider)]
        return list({vm.id: vm for vm in found}.values())

    async def _delete_vm(
        self, record: SandboxRecord, instance: Instance, attempts: int | None = None
    ) -> None:
        """Delete until the cloud confirms (or says it is gone); failures recorded and retried,
        `attempts` times at most (None: until confirmed), then the last error is raised."""
        delay = self.config.delete_retry_seconds
        tried = 0
        while True:
            try:
                await self.provider.delete(instance.id)
                return
            except InstanceNotFound:
                return
            except Exception as exc:
                tried += 1
                reason = _why(f"delete of VM {instance.id}", exc)
                stop = self._stops.get(record.id)
                if stop is not None:
                    stop.error = f"{reason}; the delete is retried"
                    stop.failed.set()
                metrics.VM_DELETE_FAILURES.labels(provider=self.provider.name).inc()
                await self._save(record.evolve(reason=reason))
                if attempts is not None and tried >= attempts:
                    raise
                log.warning("sandbox %s: %s; retrying in %gs", record.id, reason, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.delete_retry_max_seconds)

    async def _forget(self, record: SandboxRecord) -> None:
        await asyncio.to_thread(_remove_socket_dir, Path(record.agent_socket))
        try:
            await self.store.delete(record.id)
        except StateError as exc:
            self._owe(record.id, None, exc)
        else:
            self._owed.pop(record.id, None)
        self.placement.release(record.id)
        await self._hooks("sandbox_gone", record.id)

    # --- writes a full state store refused -------------------------------------------------------

    async def _save(self, record: SandboxRecord) -> SandboxRecord:
        """Write a teardown's progress; when the store refuses (disk full), the write is owed
        and retried until it lands, and the teardown goes on with the record in memory."""
        try:
            stored = await self.store.put(record)
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
            self._owed_task = self._spawn(self._write_owed(), name="owed-state-writes")

    def owed(self) -> dict[str, str]:
        """Sandboxes whose last state write the store refused: id -> what it still owes."""
        return {i: "record removal" if r is None else r.state.value for i, r in self._owed.items()}

    async def _write_owed(self) -> None:
        """Retry the refused writes, with the delete backoff, until the store takes them all: a
        torn-down sandbox is then forgotten, an unfinished one reads `stopping` (the reaper's)."""
        delay = self.config.delete_retry_seconds
        while self._owed:
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.delete_retry_max_seconds)
            for sandbox_id in list(self._owed):
                if self.busy(sandbox_id):
                    continue  # its teardown writes it
                async with self._locked(sandbox_id):
                    if sandbox_id not in self._owed:
                        continue
                    record = self._owed[sandbox_id]
                    try:
                        if record is None:
                            await self.store.delete(sandbox_id)
                        else:
                            await self.store.put(record)
                    except StateError:
                        continue
                    del self._owed[sandbox_id]
                    log.info("sandbox %s: the state store took the owed write", sandbox_id)

    def serving(self, sandbox_id: str) -> bool:
        """Whether this process serves the sandbox's agent socket now."""
        return sandbox_id in self._proxies

    def proxy_of(self, sandbox_id: str) -> AgentProxyHandle | None:
        """The agent proxy serving a sandbox now, if any."""
        return self._proxies.get(sandbox_id)

    async def mark_preempted(
        self, sandbox_id: str, instance_id: str, reason: str, *, again: bool = False
    ) -> bool:
        """Record that the cloud took a running sandbox's VM away (adaptor.hypervisor.preemption).

        True when the sandbox ran on `instance_id` and is now preempted (with `again`: was
        preempted already, and gets the new reason); False when it moved on meanwhile (stopped,
        stopping, another VM, or another check marked it first), and then nothing is written. The
        VM stays in the record, so the StopVM that follows deletes it again (idempotently).
        """
        if sandbox_id in self._stops:
            return False
        async with self._locked(sandbox_id):
            record = await self.store.get(sandbox_id)
            if record is None or record.instance is None or record.instance.id != instance_id:
                return False
            wanted = SandboxState.PREEMPTED if again else SandboxState.RUNNING
            if record.state is not wanted:
                return False
            await self.store.put(record.evolve(state=SandboxState.PREEMPTED, reason=reason))
            return True

    def busy(self, sandbox_id: str) -> bool:
        """Whether a StartVM or a teardown of the sandbox is in flight in this process."""
        return sandbox_id in self._starts or sandbox_id in self._stops

    # --- the reaper's entry points ---------------------------------------------------------------

    async def reap(self, record: SandboxRecord, vms: Iterable[Instance]) -> int:
        """Delete the VMs an interrupted sandbox left: a failed record stays, without its VM;
        a stopping one is torn down and forgotten. How many VMs were deleted (0 while a
        teardown is still retrying: the next sweep finds it busy and leaves it)."""
        if self.busy(record.id):
            return 0
        vms = list(vms)
        if record.state is SandboxState.STOPPING:
            stop = self._begin_stop(record.id, cancel_start=False, known=vms)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(stop.done.wait()), REAP_WAIT_SECONDS)
            return len(vms) if stop.done.is_set() else 0
        async with self._locked(record.id):
            current = await self.store.get(record.id)
            if current is None or current.state is not SandboxState.FAILED:
                return 0
            with sandbox_context(record.id, f"{record.pod_namespace}/{record.pod_name}"):
                await self._hooks("vm_stopping", current)
                for vm in vms:
                    await self._delete_vm(current, vm, attempts=REAP_DELETE_ATTEMPTS)
                reason = f"{current.reason}; VM deleted by the reaper".lstrip("; ")
                await self.store.put(current.evolve(instance=None, reason=reason))
        return len(vms)

    # --- restart and shutdown --------------------------------------------------------------------

    async def recover(self) -> None:
        """Serve again the agent sockets of sandboxes that were running before a restart, and
        finish the teardowns a StopVM had asked for.

        A sandbox caught in StartVM is marked failed (its caller is gone); its VM stays recorded
        so the StopVM that follows, or the reaper, deletes it. A running sandbox whose shim does
        not connect again within the reconnect grace is abandoned (torn down): a shim that lost
        its agent connection stopped its pod and sent a StopVM nobody heard.
        """
        records = await self.store.records()
        gone: list[str] = []
        # Each record's recovery is its own (its netns, its sockets): done side by side, a
        # successor taking over 100 sandboxes answers their shims again in one round, not 100.
        limit = asyncio.Semaphore(RECOVER_CONCURRENCY)

        async def one(record: SandboxRecord) -> None:
            async with limit:
                if not await self._recover_one(record):
                    gone.append(record.id)

        async with asyncio.TaskGroup() as group:
            for record in records:
                group.create_task(one(record), name=f"recover-{record.id}")
        for sandbox_id in gone:
            # The pod's netns is gone, so is the pod: nobody will call StopVM for it.
            with contextlib.suppress(Exception):
                await self.store.set_state(sandbox_id, SandboxState.STOPPING, "pod netns gone")
            stop = self._begin_stop(sandbox_id, cancel_start=False)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(stop.done.wait()), REAP_WAIT_SECONDS)

    async def _recover_one(self, record: SandboxRecord) -> bool:
        """Recover one sandbox from its record (False: its pod netns is gone)."""
        if self._pod_network is not None and record.pod_network:
            record, alive = await self._recover_pod_network(record)
            if not alive:
                return False
        if record.state is SandboxState.STARTING:
            await self.store.put(
                record.evolve(state=SandboxState.FAILED, reason="daemon restarted during StartVM")
            )
            self._watch_calls(record.id)
        elif record.state in (SandboxState.CREATED, SandboxState.FAILED):
            self._watch_calls(record.id)
        elif record.state is SandboxState.STOPPING:
            self._begin_stop(record.id, cancel_start=False)
        elif (
            record.state in (SandboxState.RUNNING, SandboxState.PREEMPTED)
            and record.instance is not None
        ):
            # A preempted sandbox's socket is served too: the preemption watcher makes it
            # answer every call with why (adaptor.hypervisor.preemption).
            with sandbox_context(record.id, f"{record.pod_namespace}/{record.pod_name}"):
                await self._reserve(record, record.instance)
        return True

    async def _recover_pod_network(self, record: SandboxRecord) -> tuple[SandboxRecord, bool]:
        """Repair a recorded tunnel (False: its pod netns is gone)."""
        assert self._pod_network is not None
        from adaptor.podnet import NetnsGone

        try:
            tunnel = await self._pod_network.recovered(record)
        except NetnsGone:
            log.warning("sandbox %s: pod network namespace is gone; cleaning up", record.id)
            return record, False
        if tunnel != record.pod_network:
            record = await self.store.put(record.evolve(pod_network=tunnel))
        return record, True

    async def _reserve(self, record: SandboxRecord, instance: Instance) -> None:
        try:
            host, port = self.default_endpoint(instance)
            socket = Path(record.agent_socket)
            proxy = self._proxy_factory(record, str(socket), host, port)
            if self.adopt is None or not await self.adopt(record.id, proxy):
                await asyncio.to_thread(_prepare_socket_dir, socket)
                await proxy.start()
        except Exception as exc:
            log.error("sandbox %s: cannot serve its agent socket again: %s", record.id, exc)
            await self.store.put(record.evolve(reason=_why("restart", exc)))
            self._watch_shim(record.id, None)
            return
        self._proxies[record.id] = proxy
        self._spawn(self._reconnect(record.id, proxy), name=f"reconnect-{record.id}")
        self._watch_shim(record.id, proxy)
        log.info("sandbox %s served again at %s", record.id, record.agent_socket)

    def _watch_calls(self, sandbox_id: str) -> None:
        """A sandbox found created or failed at start: its shim's next step is a hypervisor
        call (StartVM, StopVM); if none comes within the grace, the shim is gone."""
        grace = self.config.reconnect_grace_seconds
        if grace > 0:
            self._spawn(self._await_call(sandbox_id, grace), name=f"shim-grace-{sandbox_id}")

    async def _await_call(self, sandbox_id: str, grace: float) -> None:
        await asyncio.sleep(grace)
        if sandbox_id in self._called or self.busy(sandbox_id):
            return
        await self.abandon(
            sandbox_id, f"no hypervisor call for it within {grace:g}s of the restart"
        )

    def _watch_shim(self, sandbox_id: str, proxy: AgentProxyHandle | None) -> None:
        grace = self.config.reconnect_grace_seconds
        if grace > 0:
            self._spawn(self._await_shim(sandbox_id, proxy, grace), name=f"shim-grace-{sandbox_id}")

    async def _await_shim(
        self, sandbox_id: str, proxy: AgentProxyHandle | None, grace: float
    ) -> None:
        """Abandon the recovered sandbox unless its shim connects within `grace` seconds."""
        if proxy is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proxy.wait_for_shim(), grace)
                return
        else:
            await asyncio.sleep(grace)
        if self.busy(sandbox_id) or self._proxies.get(sandbox_id) is not proxy:
            return  # a StopVM (or a preemption) took it over meanwhile
        await self.abandon(
            sandbox_id, f"its shim did not connect again within {grace:g}s of the restart"
        )

    async def abandon(self, sandbox_id: str, why: str) -> None:
        """Tear down a sandbox nobody will StopVM (its shim is gone): VM, tunnel and record go,
        with a log line, `peerpods_sandboxes_abandoned_total` and the reason kept for the
        status API."""
        record = await self.store.get(sandbox_id)
        if record is None or self.busy(sandbox_id):
            return
        reason = f"abandoned: {why}"
        with sandbox_context(record.id, f"{record.pod_namespace}/{record.pod_name}"):
            log.warning("sandbox %s %s; tearing it down", sandbox_id, reason)
        metrics.ABANDONED.labels(provider=self.provider.name).inc()
        if self._on_abandoned is not None:
            try:
                self._on_abandoned(record, reason)
            except Exception:
                log.exception("on_abandoned callback failed")
        stop = self._begin_stop(sandbox_id, cancel_start=False, reason=reason)
        await asyncio.shield(stop.done.wait())

    async def _reconnect(self, sandbox_id: str, proxy: AgentProxyHandle) -> None:
        try:
            await proxy.connect(self.config.proxy_timeout_seconds)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The proxy answers UNAVAILABLE and dials again on the next call.
            log.warning("sandbox %s: upstream not reachable after restart: %s", sandbox_id, exc)

    async def release_agent_sockets(self, timeout_seconds: float = 5.0) -> set[str]:
        """Shutdown's first step: start no new sandbox and close every agent socket. Returns the
        sandboxes whose shim was connected: Kata's Go shim answers the close with one StopVM
        (never retried), so the hypervisor socket must still take it (`drain`)."""
        self._draining = True
        self._ended.clear()
        self._cancel_watchers()
        held = {sandbox_id for sandbox_id, proxy in self._proxies.items() if proxy.shims}
        proxies, self._proxies = list(self._proxies.values()), {}
        for proxy in proxies:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proxy.stop(), timeout=timeout_seconds)
        return held

    async def drain(self, expected: set[str], timeout_seconds: float) -> set[str]:
        """Until every sandbox in `expected` was torn down (its StopVM came and the teardown
        ended), within `timeout_seconds`; those still awaited."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        while True:
            waiting = expected - self._ended
            if not waiting or loop.time() >= deadline:
                return waiting
            self._teardown_ended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._teardown_ended.wait(), deadline - loop.time())

    def _cancel_watchers(self) -> None:
        """Cancel the restart's dials and shim waits: they end with the process."""
        for task in list(self._tasks):
            if task.get_name().startswith(("reconnect-", "shim-grace-", "owed-state-writes")):
                task.cancel()

    async def close(self, grace_seconds: float = 5.0) -> None:
        """Stop serving agent sockets; VMs and records stay for the next start (a teardown cut
        short stays recorded as stopping and is finished then)."""
        if self._closed:
            return
        self._closed = True
        self._draining = True
        tasks = list(self._tasks)
        self._cancel_watchers()
        if tasks:
            await asyncio.wait(tasks, timeout=grace_seconds)
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        proxies, self._proxies = list(self._proxies.values()), {}
        for proxy in proxies:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proxy.stop(), timeout=grace_seconds)

    async def hand_off(self, grace_seconds: float = 5.0) -> dict[str, AgentProxyHandle]:
        """End this process's part for a successor that takes the agent sockets over: the
        owned tasks end as at `close` (an unfinished teardown stays recorded as stopping, and
        the successor finishes it), and the agent proxies are returned still serving."""
        proxies, self._proxies = self._proxies, {}
        await self.close(grace_seconds)
        return proxies


def answer_within(deadline_seconds: float) -> float:
    """How long a call with this deadline may wait before answering: a margin is kept for the
    reply to arrive in time (a quarter of the deadline, at most 250 ms)."""
    return max(0.0, deadline_seconds - min(0.25, deadline_seconds / 4))


def failure_category(exc: BaseException) -> str:
    """A bounded label for why a StartVM failed."""
    for kind, label in (
        (QuotaExhausted, "quota"),
        (NoMatch, "selection"),
        (InvalidRequest, "invalid"),
        (CapacityError, "capacity"),
        (TransientError, "cloud_unavailable"),
        (StartTimeout, "timeout"),
        (ProviderError, "cloud"),
        (asyncio.CancelledError, "cancelled"),
    ):
        if isinstance(exc, kind):
            return label
    return "forwarder" if "forwarder" in str(exc).lower() or "unreachable" in str(exc) else "other"


def _tagged(vm: Instance, sandbox_id: str, provider: Provider) -> bool:
    owner = getattr(provider, "owner_id", None)
    if owner and vm.tags.get(TAG_OWNER) != owner:
        return False
    return vm.tags.get(TAG_SANDBOX) == sandbox_id


def _why(step: str, exc: BaseException) -> str:
    if isinstance(exc, asyncio.CancelledError):
        return f"{step} cancelled"
    text = str(exc) or type(exc).__name__
    return f"{step} failed: {text}"


def _prepare_socket_dir(socket: Path) -> None:
    socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        socket.unlink()


def _remove_socket_dir(socket: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        socket.unlink()
    shutil.rmtree(socket.parent, ignore_errors=True)


__all__ = [
    "AGENT_SOCKET_NAME",
    "AgentProxyHandle",
    "ManagerConfig",
    "Planner",
    "PodNetworkHook",
    "ProxyFactory",
    "SandboxBusy",
    "SandboxHook",
    "SandboxManager",
    "SandboxNotFound",
    "ShuttingDown",
    "StartAborted",
    "StartTimeout",
    "answer_within",
    "check_sandbox_id",
    "failure_category",
]
