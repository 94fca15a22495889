"""The hand-off tests' pod VM agent and Go shim, for pods that print and exit.

`StreamingAgent` is the fake kata-agent of `tests.adaptor.fake_agent` for any number of
sandboxes behind any number of listeners (containers are made on first use, by id), serving the
calls Kata's Go shim makes to set a pod up, on sockets bound anywhere (VMs' netns), with TLS when
given a context. Like a ttrpc server, it cancels a closed connection's calls, so a read
cancelled that way takes no output.

`StreamingShim` is Kata's Go shim (`tests.shim_emulator.ShimEmulator`) running one workload
container besides the pause container: on its one agent connection it also keeps the
workload's `WaitProcess` in flight and reads its output in a `ReadStdout` loop.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import defaultdict
from collections.abc import Mapping

from adaptor.ttrpc import Client, TtrpcError
from adaptor.ttrpc.gen import agent_pb2
from adaptor.ttrpc.server import CallContext
from tests.adaptor.fake_agent import (
    AGENT,
    Container,
    FakeAgent,
    read_stdout,
)
from tests.shim_emulator import ShimEmulator


class StreamingAgent(FakeAgent):
    """Pod VM agents behind their listeners; `containers[id]` is made on first use."""

    def __init__(self) -> None:
        super().__init__()
        self.containers = defaultdict(Container)
        self._servers: list[asyncio.Server] = []
        self.server.register(
            AGENT,
            {name: self._empty for name in ("CreateSandbox", "CreateContainer", "StartContainer")},
        )

    async def serve_on(self, listener: socket.socket, tls: ssl.SSLContext | None = None) -> None:
        """Serve on a bound TCP socket (made in whichever netns the VM lives), over TLS when
        `tls` is a server context."""

        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            self.server._accept(reader, writer)  # the ttrpc server's own connection handling

        listener.listen(128)
        listener.setblocking(False)
        self._servers.append(await asyncio.start_server(accept, sock=listener, ssl=tls))
        self.port = int(listener.getsockname()[1])

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        await self.server.close(0)

    async def _empty(self, _ctx: CallContext, _payload: bytes) -> bytes:
        return b""


class StreamingShim(ShimEmulator):
    """Kata's Go shim with a workload container `workload` that prints and exits."""

    def __init__(
        self,
        hypervisor_socket: str,
        sandbox_id: str,
        annotations: Mapping[str, str],
        *,
        netns: str = "",
    ) -> None:
        super().__init__(hypervisor_socket, sandbox_id, annotations, netns=netns)
        self.workload = f"w-{sandbox_id}"
        self.output = bytearray()
        self.errors: list[str] = []
        self.exit_status: asyncio.Future[int] | None = None

    async def start_pause(self) -> None:
        await super().start_pause()
        agent = self._agent
        assert agent is not None
        request = agent_pb2.CreateContainerRequest(container_id=self.workload)
        await agent.call(AGENT, "CreateContainer", request.SerializeToString())
        start = agent_pb2.StartContainerRequest(container_id=self.workload)
        await agent.call(AGENT, "StartContainer", start.SerializeToString())
        self.exit_status = asyncio.get_running_loop().create_future()
        self._spawn(self._wait_workload(agent))
        self._spawn(self._read_output(agent))

    async def _wait_workload(self, agent: Client) -> None:
        assert self.exit_status is not None
        wait = agent_pb2.WaitProcessRequest(container_id=self.workload, exec_id=self.workload)
        try:
            answer = await agent.call(AGENT, "WaitProcess", wait.SerializeToString())
        except TtrpcError as exc:
            self.errors.append(f"WaitProcess: {exc.code.name}: {exc.message}")
            self.exit_status.set_exception(exc)
            return
        self.exit_status.set_result(agent_pb2.WaitProcessResponse.FromString(answer).status)

    async def _read_output(self, agent: Client) -> None:
        await read_stdout(agent, self.workload, self.output, self.errors)

    @property
    def connected(self) -> bool:
        """Whether its one agent connection is still open."""
        return self._agent is not None and not self._agent.closed
