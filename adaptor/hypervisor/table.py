"""The one sandbox table the lifecycle's parts share: who is served, starting and stopping.

Start (adaptor.hypervisor.start), teardown (adaptor.hypervisor.teardown) and recovery
(adaptor.hypervisor.recovery) each own their steps; what they have in common lives here, once:
the collaborators, the agent proxies serving now, the starts and teardowns in flight, the
per-sandbox locks, the tasks the manager owns, and the process's lifetime (drain, close, hand-off).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptor.hypervisor.collaborators import (
    AgentProxyHandle,
    ManagerConfig,
    Planner,
    ProxyFactory,
    UserDataBuilder,
)
from adaptor.hypervisor.errors import SandboxNotFound, ShuttingDown, check_sandbox_id
from adaptor.hypervisor.hooks import Hooks, SandboxHook
from adaptor.runtime.logs import bind_sandbox
from adaptor.state import SandboxRecord, StateStore
from adaptor.warmpool import WarmPool
from providers.core.base import Instance, Provider
from providers.core.contract import VMIntent
from providers.core.errors import ProviderError

log = logging.getLogger(__name__)

AGENT_SOCKET_NAME = "agent.ttrpc"
# The owned tasks that end with the process (a restart's dials and shim waits, owed writes).
WATCHER_PREFIXES = ("reconnect-", "shim-grace-", "owed-state-writes")


@dataclass
class Stop:
    """A teardown in flight: done when the sandbox is forgotten; `failed` once a delete failed
    (its reason in `error`), for StopVM's answer."""

    task: asyncio.Task[None] | None = None
    error: str = ""
    left: str = ""  # set when the teardown ended with something still owed
    done: asyncio.Event = field(default_factory=asyncio.Event)
    failed: asyncio.Event = field(default_factory=asyncio.Event)


class SandboxTable:
    """Every sandbox this process knows of beyond its record, and the collaborators."""

    def __init__(
        self,
        config: ManagerConfig,
        store: StateStore,
        provider: Provider,
        placement: Planner,
        proxies: ProxyFactory,
        *,
        hooks: Sequence[SandboxHook] = (),
        vm_policy: Callable[[VMIntent], None] | None = None,
        user_data: UserDataBuilder | None = None,
        on_abandoned: Callable[[SandboxRecord, str], None] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.provider = provider
        self.placement = placement
        self.user_data = user_data
        self.hooks = Hooks(hooks, self.save)
        # the node's own limits on a pod's VM choices (adaptor.planning.vmpolicy),
        # at CreateVM and StartVM
        self.vm_policy = vm_policy or (lambda _intent: None)
        self.proxy_factory = proxies
        # told of each sandbox given up because its shim never came back (the status API)
        self.on_abandoned = on_abandoned
        # the warm pools StartVM adopts a stopped VM from before it launches one (None: none)
        self.warm: WarmPool | None = None
        self.proxies: dict[str, AgentProxyHandle] = {}
        # intents CreateVM parsed and checked, until their StartVM (or teardown) takes them: a
        # sandbox recorded by an earlier process is parsed again from its annotations
        self.intents: dict[str, VMIntent] = {}
        self.starts: dict[str, set[asyncio.Task[None]]] = {}
        self.stops: dict[str, Stop] = {}
        # sandboxes a hypervisor call named since start (a shim that is still there)
        self.called: set[str] = set()
        # while draining (shutdown), no new sandbox starts; ended teardowns are noted
        self.draining = False
        self.ended: set[str] = set()
        self.teardown_ended = asyncio.Event()
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    # --- shared steps ----------------------------------------------------------------------------

    def default_endpoint(self, instance: Instance) -> tuple[str, int]:
        """The VM's first address, at its own port or --forwarder-port."""
        if not instance.addresses:
            raise ProviderError(f"VM {instance.id} has no address")
        return instance.addresses[0], instance.port or self.config.forwarder_port

    def socket_path(self, sandbox_id: str) -> Path:
        return self.config.pods_dir / sandbox_id / AGENT_SOCKET_NAME

    @contextlib.asynccontextmanager
    async def locked(self, sandbox_id: str) -> AsyncIterator[None]:
        """Calls for one sandbox, one at a time (the lock is dropped with its last user)."""
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

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """A task the manager owns (awaited or cancelled at close)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def refuse_when_draining(self) -> None:
        if self.draining:
            raise ShuttingDown("the adaptor is shutting down; the next one takes new sandboxes")

    async def require(self, sandbox_id: str) -> SandboxRecord:
        """The sandbox's record (SandboxNotFound without one); later log lines name it."""
        record = await self.store.get(check_sandbox_id(sandbox_id))
        if record is None:
            raise SandboxNotFound(f"no sandbox {sandbox_id}")
        # Every later log line of this call (and of tasks it starts) names the sandbox and pod.
        bind_sandbox(record.id, f"{record.pod_namespace}/{record.pod_name}")
        return record

    async def save(self, record: SandboxRecord) -> SandboxRecord:
        """Write the record, whatever cancels the caller meanwhile; the record as stored."""
        return await asyncio.shield(self.store.put(record))

    def busy(self, sandbox_id: str) -> bool:
        """Whether a StartVM or a teardown of the sandbox is in flight in this process."""
        return sandbox_id in self.starts or sandbox_id in self.stops

    # --- the process's lifetime ------------------------------------------------------------------

    async def release_agent_sockets(self, timeout_seconds: float = 5.0) -> set[str]:
        """Shutdown's first step: start no new sandbox and close every agent socket. Returns the
        sandboxes whose shim was connected: Kata's Go shim answers the close with one StopVM
        (never retried), so the hypervisor socket must still take it (`drain`)."""
        self.draining = True
        self.ended.clear()
        self._cancel_watchers()
        held = {sandbox_id for sandbox_id, proxy in self.proxies.items() if proxy.shims}
        proxies, self.proxies = list(self.proxies.values()), {}
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
            waiting = expected - self.ended
            if not waiting or loop.time() >= deadline:
                return waiting
            self.teardown_ended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.teardown_ended.wait(), deadline - loop.time())

    def _cancel_watchers(self) -> None:
        """Cancel the restart's dials and shim waits: they end with the process."""
        for task in list(self._tasks):
            if task.get_name().startswith(WATCHER_PREFIXES):
                task.cancel()

    async def close(self, grace_seconds: float = 5.0) -> None:
        """Stop serving agent sockets; VMs and records stay for the next start (a teardown cut
        short stays recorded as stopping and is finished then)."""
        if self._closed:
            return
        self._closed = True
        self.draining = True
        tasks = list(self._tasks)
        self._cancel_watchers()
        if tasks:
            await asyncio.wait(tasks, timeout=grace_seconds)
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        proxies, self.proxies = list(self.proxies.values()), {}
        for proxy in proxies:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proxy.stop(), timeout=grace_seconds)

    async def hand_off(self, grace_seconds: float = 5.0) -> dict[str, AgentProxyHandle]:
        """End this process's part for a successor that takes the agent sockets over: the
        owned tasks end as at `close` (an unfinished teardown stays recorded as stopping, and
        the successor finishes it), and the agent proxies are returned still serving."""
        proxies, self.proxies = self.proxies, {}
        await self.close(grace_seconds)
        return proxies


def prepare_socket_dir(socket: Path) -> None:
    """The agent socket's directory (0700), without a stale socket file. Blocking IO."""
    socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        socket.unlink()


def remove_socket_dir(socket: Path) -> None:
    """The agent socket and its directory, gone. Blocking IO."""
    with contextlib.suppress(FileNotFoundError):
        socket.unlink()
    shutil.rmtree(socket.parent, ignore_errors=True)
