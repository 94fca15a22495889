"""A restart or a take-over: serve again what the records say was running, and give up on the
sandboxes whose shim does not come back.

Each record is recovered on its own (its netns, its sockets), side by side, RECOVER_CONCURRENCY
at a time: a successor taking over 100 sandboxes answers their shims again in one round, not in
100. A sandbox caught in StartVM is marked failed (its caller is gone); a running one whose shim
does not connect again within the reconnect grace is abandoned (adaptor.hypervisor.teardown): a
shim that lost its agent connection stopped its pod and sent a StopVM nobody heard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from adaptor.hypervisor.collaborators import AgentProxyHandle
from adaptor.hypervisor.errors import why
from adaptor.hypervisor.hooks import PodGone
from adaptor.hypervisor.table import SandboxTable, prepare_socket_dir
from adaptor.hypervisor.teardown import Teardowns
from adaptor.runtime.logs import sandbox_context
from adaptor.state import SandboxRecord, SandboxState
from providers.core.base import Instance

log = logging.getLogger(__name__)

# At a hand-off (adaptor.node.handoff): serves a recovered sandbox's inherited agent sockets with
# the proxy made for it, or answers False to have the proxy start afresh.
Adopt = Callable[[str, AgentProxyHandle], Awaitable[bool]]

# Sandboxes recovered side by side at a restart or take-over (each opens a socket, maybe a netns).
RECOVER_CONCURRENCY = 64


class Recovery:
    """Serves the recorded sandboxes again and watches for their shims, over the shared table."""

    def __init__(self, table: SandboxTable, teardowns: Teardowns) -> None:
        self.table = table
        self.teardowns = teardowns

    async def recover(self, adopt: Adopt | None = None) -> None:
        """Serve again the agent sockets of sandboxes that were running before a restart, and
        finish the teardowns a StopVM had asked for; the sandboxes whose pod is gone are torn
        down. At a take-over, `adopt` serves a sandbox's inherited sockets."""
        records = await self.table.store.records()
        gone: list[str] = []
        limit = asyncio.Semaphore(RECOVER_CONCURRENCY)

        async def one(record: SandboxRecord) -> None:
            async with limit:
                if not await self._recover_one(record, adopt):
                    gone.append(record.id)

        async with asyncio.TaskGroup() as group:
            for record in records:
                group.create_task(one(record), name=f"recover-{record.id}")
        for sandbox_id in gone:
            await self._pod_gone(sandbox_id)

    async def _pod_gone(self, sandbox_id: str) -> None:
        """The pod's netns is gone, so is the pod: nobody will call StopVM for it."""
        with contextlib.suppress(Exception):
            await self.table.store.set_state(sandbox_id, SandboxState.STOPPING, "pod netns gone")
        stop = self.teardowns.begin_stop(sandbox_id, cancel_start=False)
        await self.teardowns.settled(stop)

    async def _recover_one(self, record: SandboxRecord, adopt: Adopt | None) -> bool:
        """Recover one sandbox from its record (False: its pod netns is gone)."""
        table = self.table
        try:
            record = await table.hooks.recovered(record)
        except PodGone as exc:
            log.warning("sandbox %s: %s; cleaning up", record.id, exc)
            return False
        if record.state is SandboxState.STARTING:
            await table.store.put(
                record.evolve(state=SandboxState.FAILED, reason="daemon restarted during StartVM")
            )
            self._watch_calls(record.id)
        elif record.state in (SandboxState.CREATED, SandboxState.FAILED):
            self._watch_calls(record.id)
        elif record.state is SandboxState.STOPPING:
            self.teardowns.begin_stop(record.id, cancel_start=False)
        elif (
            record.state in (SandboxState.RUNNING, SandboxState.PREEMPTED)
            and record.instance is not None
        ):
            # A preempted sandbox's socket is served too: the preemption watcher makes it
            # answer every call with why (adaptor.hypervisor.preemption).
            with sandbox_context(record.id, f"{record.pod_namespace}/{record.pod_name}"):
                await self._reserve(record, record.instance, adopt)
        return True

    async def _reserve(
        self, record: SandboxRecord, instance: Instance, adopt: Adopt | None
    ) -> None:
        """Serve the running sandbox's agent socket again (or adopt a predecessor's)."""
        table = self.table
        try:
            host, port = table.default_endpoint(instance)
            socket = Path(record.agent_socket)
            proxy = table.proxy_factory(record, str(socket), host, port)
            if adopt is None or not await adopt(record.id, proxy):
                await asyncio.to_thread(prepare_socket_dir, socket)
                await proxy.start()
        except Exception as exc:
            log.error("sandbox %s: cannot serve its agent socket again: %s", record.id, exc)
            await table.store.put(record.evolve(reason=why("restart", exc)))
            self._watch_shim(record.id, None)
            return
        table.proxies[record.id] = proxy
        table.spawn(self._reconnect(record.id, proxy), name=f"reconnect-{record.id}")
        self._watch_shim(record.id, proxy)
        log.info("sandbox %s served again at %s", record.id, record.agent_socket)

    async def _reconnect(self, sandbox_id: str, proxy: AgentProxyHandle) -> None:
        try:
            await proxy.connect(self.table.config.proxy_timeout_seconds)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The proxy answers UNAVAILABLE and dials again on the next call.
            log.warning("sandbox %s: upstream not reachable after restart: %s", sandbox_id, exc)

    # --- the reconnect grace ---------------------------------------------------------------------

    def _watch_calls(self, sandbox_id: str) -> None:
        """A sandbox found created or failed at start: its shim's next step is a hypervisor
        call (StartVM, StopVM); if none comes within the grace, the shim is gone."""
        grace = self.table.config.reconnect_grace_seconds
        if grace > 0:
            self.table.spawn(self._await_call(sandbox_id, grace), name=f"shim-grace-{sandbox_id}")

    async def _await_call(self, sandbox_id: str, grace: float) -> None:
        await asyncio.sleep(grace)
        if sandbox_id in self.table.called or self.table.busy(sandbox_id):
            return
        await self.teardowns.abandon(
            sandbox_id, f"no hypervisor call for it within {grace:g}s of the restart"
        )

    def _watch_shim(self, sandbox_id: str, proxy: AgentProxyHandle | None) -> None:
        grace = self.table.config.reconnect_grace_seconds
        if grace > 0:
            self.table.spawn(
                self._await_shim(sandbox_id, proxy, grace), name=f"shim-grace-{sandbox_id}"
            )

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
        if self.table.busy(sandbox_id) or self.table.proxies.get(sandbox_id) is not proxy:
            return  # a StopVM (or a preemption) took it over meanwhile
        await self.teardowns.abandon(
            sandbox_id, f"its shim did not connect again within {grace:g}s of the restart"
        )
