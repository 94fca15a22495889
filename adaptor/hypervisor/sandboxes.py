"""The sandbox lifecycle behind Kata's remote hypervisor API, free of any wire format.

CreateVM records, StartVM creates the VM and its agent proxy, StopVM tears both down. Every step
is written to the state store before it is acted on or answered, so a restarted daemon knows
which VMs exist; a VM that was created is either recorded or deleted, whatever fails.

Calls for one sandbox are serialized by a per-sandbox lock; different sandboxes run concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from adaptor import metrics
from adaptor.logs import bind_sandbox, sandbox_context
from adaptor.state import SandboxRecord, SandboxState, StateStore
from providers.base import Instance, Provider, VMSpec
from providers.contract import VMIntent, parse_vm_annotations
from providers.errors import InstanceNotFound, InvalidRequest, PeerpodsError, ProviderError

log = logging.getLogger(__name__)

AGENT_SOCKET_NAME = "agent.ttrpc"
# sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
_SANDBOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class SandboxNotFound(PeerpodsError):
    """No sandbox with this id was created (or it was already stopped)."""


class SandboxBusy(PeerpodsError):
    """The sandbox is in a state where this call cannot proceed (the message says why)."""


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


class PodNetworkHook(Protocol):
    """The pod network (adaptor.podnet.SandboxPodNetwork); its strings go in `pod_network`."""

    async def created(self, sandbox_id: str, netns: str) -> str: ...

    async def forget(self, sandbox_id: str, pod_network: str) -> None: ...

    async def started(self, record: SandboxRecord, instance: Instance) -> str: ...

    async def stop(self, record: SandboxRecord) -> str: ...

    async def recovered(self, record: SandboxRecord) -> str: ...

    @staticmethod
    def failed_teardown(record: SandboxRecord, error: str) -> str: ...


# (sandbox record, agent socket path, forwarder host, forwarder port) -> an unstarted proxy
ProxyFactory = Callable[[SandboxRecord, str, str, int], AgentProxyHandle]
# The intent -> instance types to try, best first.
CandidateChooser = Callable[[VMIntent], tuple[str, ...]]
# A VM -> the (host, port) its forwarder is reached at.
EndpointResolver = Callable[[Instance], tuple[str, int]]
# The intent and the VM it got -> the sandbox's device plan (JSON), stored with the record.
DevicePlanner = Callable[[VMIntent, Instance], str]
# Candidates reserved against the quota pool for a sandbox, and the release of that reservation.
Reserver = Callable[[VMIntent, str], Awaitable[tuple[str, ...]]]
Releaser = Callable[[str], None]
# Candidates -> the zones each is restricted to (VMSpec.zones).
ZoneRestrictions = Callable[[tuple[str, ...]], Mapping[str, tuple[str, ...]]]
# The record, its intent and the candidates -> the pod VM's user data.
UserDataBuilder = Callable[[SandboxRecord, VMIntent, tuple[str, ...]], str]


def machine_type_candidates(intent: VMIntent) -> tuple[str, ...]:
    """The default chooser: the explicit machine_type annotation, else let the provider decide."""
    return (intent.machine_type,) if intent.machine_type else ()


def check_sandbox_id(sandbox_id: str) -> str:
    """A sandbox id must be usable as one path component (it names the socket directory)."""
    if not _SANDBOX_ID.fullmatch(sandbox_id):
        raise InvalidRequest(
            f"invalid sandbox id {sandbox_id[:80]!r}: want 1-128 characters of "
            "[A-Za-z0-9_.-] starting with a letter or digit"
        )
    return sandbox_id


@dataclass(frozen=True)
class ManagerConfig:
    """The daemon settings the lifecycle needs."""

    pods_dir: Path
    forwarder_port: int = 15150
    proxy_timeout_seconds: float = 300.0


class SandboxManager:
    """Owns every sandbox on this node: records, VMs and agent proxies."""

    def __init__(
        self,
        config: ManagerConfig,
        store: StateStore,
        provider: Provider,
        proxy_factory: ProxyFactory,
        *,
        choose_candidates: CandidateChooser = machine_type_candidates,
        resolve_endpoint: EndpointResolver | None = None,
        plan_devices: DevicePlanner | None = None,
        user_data: UserDataBuilder | None = None,
        on_stopped: Callable[[str], None] | None = None,
        reserve: Reserver | None = None,
        release: Releaser | None = None,
        candidate_zones: ZoneRestrictions | None = None,
        pod_network: PodNetworkHook | None = None,
        vm_policy: Callable[[VMIntent], None] | None = None,
    ) -> None:
        self.config = config
        # the node's own limits on a pod's VM choices (adaptor.vmpolicy), at CreateVM and StartVM
        self._vm_policy = vm_policy or (lambda _intent: None)
        self.store = store
        self.provider = provider
        self._proxy_factory = proxy_factory
        self._choose_candidates = choose_candidates
        self._resolve_endpoint = resolve_endpoint or self.default_endpoint
        self._plan_devices = plan_devices
        self._user_data = user_data
        self._on_stopped = on_stopped
        self._reserve_candidates = reserve
        self._release = release or (lambda _sandbox_id: None)
        self._candidate_zones = candidate_zones
        self._pod_network = pod_network
        self._proxies: dict[str, AgentProxyHandle] = {}
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

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

    async def _require(self, sandbox_id: str) -> SandboxRecord:
        record = await self.store.get(check_sandbox_id(sandbox_id))
        if record is None:
            raise SandboxNotFound(f"no sandbox {sandbox_id}")
        # Every later log line of this call (and of tasks it starts) names the sandbox and pod.
        bind_sandbox(record.id, f"{record.pod_namespace}/{record.pod_name}")
        return record

    # --- the API ---------------------------------------------------------------------------------

    async def create_vm(
        self, sandbox_id: str, annotations: Mapping[str, str], network_namespace: str = ""
    ) -> str:
        """Validate and durably record a sandbox; the agent socket path it will be served on."""
        check_sandbox_id(sandbox_id)
        intent = parse_vm_annotations(annotations)
        self._vm_policy(intent)
        bind_sandbox(sandbox_id, f"{intent.pod_namespace}/{intent.pod_name}")
        path = str(self.socket_path(sandbox_id))
        if len(path.encode()) > MAX_SOCKET_PATH_BYTES:
            raise InvalidRequest(f"agent socket path {path} is too long for a unix socket")
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

    async def start_vm(self, sandbox_id: str) -> None:
        """Create the VM, connect its forwarder and serve the agent socket."""
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
            await self._start_locked(record)

    async def _start_locked(self, record: SandboxRecord) -> None:
        intent = parse_vm_annotations(record.annotations)
        self._vm_policy(intent)
        if self._reserve_candidates is not None:
            candidates = await self._reserve_candidates(intent, record.id)
        else:
            candidates = self._choose_candidates(intent)
        try:
            spec = self._vm_spec(record, intent, candidates)
        except BaseException:
            self._release(record.id)
            raise
        await self._create_and_serve(record, spec, intent)

    def _vm_spec(
        self, record: SandboxRecord, intent: VMIntent, candidates: tuple[str, ...]
    ) -> VMSpec:
        return VMSpec(
            sandbox_id=record.id,
            pod_namespace=record.pod_namespace,
            pod_name=record.pod_name,
            candidates=candidates,
            user_data=self._user_data(record, intent, candidates) if self._user_data else "",
            image=intent.image,
            vcpus=intent.vcpus,
            memory_mib=intent.memory_mib,
            gpus=intent.gpu.gpus,
            zones=dict(self._candidate_zones(candidates)) if self._candidate_zones else {},
            capacity_type=intent.capacity_type,
        )

    async def _create_and_serve(
        self, record: SandboxRecord, spec: VMSpec, intent: VMIntent
    ) -> None:
        record = await self.store.put(record.evolve(state=SandboxState.STARTING, reason=""))
        started = time.monotonic()
        try:
            instance = await self.provider.create(spec)
        except BaseException as exc:
            self._release(record.id)
            await asyncio.shield(
                self.store.put(record.evolve(state=SandboxState.FAILED, reason=_why("create", exc)))
            )
            raise
        metrics.VM_CREATE_SECONDS.labels(provider=self.provider.name).observe(
            time.monotonic() - started
        )
        log.info("sandbox %s: VM %s (%s) created", record.id, instance.id, instance.instance_type)
        proxy: AgentProxyHandle | None = None
        try:
            record = await self.store.put(record.evolve(instance=instance))
            if self._plan_devices is not None:
                plan = self._plan_devices(intent, instance)
                record = await self.store.put(record.evolve(device_plan=plan))
            if self._pod_network is not None and record.pod_network:
                tunnel = await self._pod_network.started(record, instance)
                record = await self.store.put(record.evolve(pod_network=tunnel))
            host, port = self._resolve_endpoint(instance)
            socket = Path(record.agent_socket)
            await asyncio.to_thread(_prepare_socket_dir, socket)
            proxy = self._proxy_factory(record, str(socket), host, port)
            await proxy.connect(self.config.proxy_timeout_seconds)
            await proxy.start()
            record = await self.store.put(record.evolve(state=SandboxState.RUNNING))
        except BaseException as exc:
            cleanup = self._spawn(
                self._abort_start(record, instance, proxy, _why("start", exc)),
                name=f"abort-start-{record.id}",
            )
            await asyncio.shield(cleanup)
            raise
        self._proxies[record.id] = proxy
        log.info("sandbox %s running, agent socket %s", record.id, record.agent_socket)

    async def _abort_start(
        self,
        record: SandboxRecord,
        instance: Instance,
        proxy: AgentProxyHandle | None,
        reason: str,
    ) -> None:
        """Undo a StartVM that failed after the VM existed: stop the proxy, delete the VM."""
        log.warning("sandbox %s: %s; deleting VM %s", record.id, reason, instance.id)
        self._release(record.id)
        if proxy is not None:
            with contextlib.suppress(Exception):
                await proxy.stop()
        record, owed = await self._stop_pod_network(record)
        if owed:
            reason = f"{reason}; {owed}"
        try:
            await self.provider.delete(instance.id)
        except InstanceNotFound:
            pass
        except Exception as exc:
            await self.store.put(
                record.evolve(state=SandboxState.FAILED, reason=f"{reason}; {_why('delete', exc)}")
            )
            return
        await asyncio.to_thread(_remove_socket_dir, Path(record.agent_socket))
        await self.store.put(record.evolve(state=SandboxState.FAILED, reason=reason, instance=None))

    async def stop_vm(self, sandbox_id: str) -> None:
        """Stop the proxy, delete the VM and forget the sandbox; a failed delete stays owed."""
        async with self._locked(sandbox_id):
            record = await self._require(sandbox_id)
            record = await self.store.put(record.evolve(state=SandboxState.STOPPING))
            proxy = self._proxies.pop(sandbox_id, None)
            if proxy is not None:
                await proxy.stop()
            record, owed = await self._stop_pod_network(record)
            if record.instance is not None:
                try:
                    await self.provider.delete(record.instance.id)
                except InstanceNotFound:
                    pass
                except Exception as exc:
                    reason = _why(f"delete of VM {record.instance.id}", exc)
                    await asyncio.shield(
                        self.store.put(record.evolve(state=SandboxState.FAILED, reason=reason))
                    )
                    raise ProviderError(f"sandbox {sandbox_id}: {reason}; retry StopVM") from exc
            if owed:
                # The VM is gone; the tunnel's remains stay recorded until a retry removes them.
                await self.store.put(
                    record.evolve(state=SandboxState.FAILED, reason=owed, instance=None)
                )
                raise PeerpodsError(f"sandbox {sandbox_id}: {owed}; retry StopVM")
            await asyncio.to_thread(_remove_socket_dir, Path(record.agent_socket))
            await self.store.delete(sandbox_id)
        self._release(sandbox_id)
        if self._on_stopped is not None:
            self._on_stopped(sandbox_id)
        log.info("sandbox %s stopped", sandbox_id)

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
            return await self.store.put(record.evolve(pod_network=remaining)), owed
        return await self.store.put(record.evolve(pod_network=remaining)), ""

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        """A sandbox's record (for a status API)."""
        return await self.store.get(sandbox_id)

    async def records(self) -> list[SandboxRecord]:
        """Every sandbox's record (for a status API)."""
        return await self.store.records()

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
        async with self._locked(sandbox_id):
            record = await self.store.get(sandbox_id)
            if record is None or record.instance is None or record.instance.id != instance_id:
                return False
            wanted = SandboxState.PREEMPTED if again else SandboxState.RUNNING
            if record.state is not wanted:
                return False
            await self.store.put(record.evolve(state=SandboxState.PREEMPTED, reason=reason))
            return True

    # --- restart and shutdown --------------------------------------------------------------------

    async def recover(self) -> None:
        """Serve again the agent sockets of sandboxes that were running before a restart.

        A sandbox caught in StartVM is marked failed (its caller is gone); its VM stays recorded
        so the StopVM that follows deletes it.
        """
        gone: list[str] = []
        for record in await self.store.records():
            if self._pod_network is not None and record.pod_network:
                record, alive = await self._recover_pod_network(record)
                if not alive:
                    gone.append(record.id)
                    continue
            if record.state is SandboxState.STARTING:
                await self.store.put(
                    record.evolve(
                        state=SandboxState.FAILED, reason="daemon restarted during StartVM"
                    )
                )
            elif (
                record.state in (SandboxState.RUNNING, SandboxState.PREEMPTED)
                and record.instance is not None
            ):
                # A preempted sandbox's socket is served too: the preemption watcher makes it
                # answer every call with why (adaptor.hypervisor.preemption).
                with sandbox_context(record.id, f"{record.pod_namespace}/{record.pod_name}"):
                    await self._reserve(record, record.instance)
        for sandbox_id in gone:
            # The pod's netns is gone, so is the pod: nobody will call StopVM for it.
            try:
                await self.stop_vm(sandbox_id)
            except Exception as exc:
                log.error("sandbox %s: cleanup after its pod went away failed: %s", sandbox_id, exc)

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
            host, port = self._resolve_endpoint(instance)
            socket = Path(record.agent_socket)
            await asyncio.to_thread(_prepare_socket_dir, socket)
            proxy = self._proxy_factory(record, str(socket), host, port)
            await proxy.start()
        except Exception as exc:
            log.error("sandbox %s: cannot serve its agent socket again: %s", record.id, exc)
            await self.store.put(record.evolve(reason=_why("restart", exc)))
            return
        self._proxies[record.id] = proxy
        self._spawn(self._reconnect(record.id, proxy), name=f"reconnect-{record.id}")
        log.info("sandbox %s served again at %s", record.id, record.agent_socket)

    async def _reconnect(self, sandbox_id: str, proxy: AgentProxyHandle) -> None:
        try:
            await proxy.connect(self.config.proxy_timeout_seconds)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The proxy answers UNAVAILABLE and dials again on the next call.
            log.warning("sandbox %s: upstream not reachable after restart: %s", sandbox_id, exc)

    async def close(self, grace_seconds: float = 5.0) -> None:
        """Stop serving agent sockets; VMs and records stay for the next start."""
        if self._closed:
            return
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            if task.get_name().startswith("reconnect-"):
                task.cancel()
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
