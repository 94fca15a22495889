"""Kata's Go shim and a pod VM's kata-agent, emulated for tests (no real Kata in the suite).

`ShimEmulator` behaves as `containerd-shim-kata-v2` (Go runtime, remote hypervisor) was observed
to behave against `peerpods serve`:

- CreateVM, StartVM and StopVM each on a new hypervisor connection; StartVM with the shim's own
  600 s deadline, StopVM with none.
- One agent connection per sandbox, opened once the VM started: Check (30 s limit),
  CreateSandbox, then the pause container (CreateContainer, StartContainer), then two calls that
  stay in flight for the pod's life: `WaitProcess` on the pause container and a blocking
  `GetOOMEvent` (asked again each time it answers).
- When the pause container's `WaitProcess` ends (its connection closed: `ttrpc: closed`, or the
  container exited), the shim stops the sandbox on its own: **one** StopVM, about 0.1 s later,
  on a new hypervisor connection. If nothing listens there, the error is kept and it is **never
  retried**. The agent socket is **never dialled again**.

`PodVMAgent` is the pod VM's side the adaptor's proxy dials: a kata-agent that answers the calls
above, holds `WaitProcess` until `exit()` is called for that container and `GetOOMEvent` until
the connection closes, and streams what `write()` gives to `ReadStdout`.

    agent = await PodVMAgent.start(listener)          # a bound TCP socket (any netns)
    shim = ShimEmulator(hypervisor_socket, "sb-1", annotations, netns="/var/run/netns/p1")
    await shim.run_pod()                                # CreateVM, StartVM, the pause container
    ...                                                 # kill or SIGTERM the adaptor
    outcome = await shim.stopped()                      # what its one StopVM got
    await shim.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from adaptor.ttrpc import Client
from adaptor.ttrpc.codec import (
    FrameDecoder,
    MessageType,
    encode_frame,
    encode_response,
)
from adaptor.ttrpc.gen import agent_pb2, health_pb2, hypervisor_pb2, ttrpc_pb2
from adaptor.ttrpc.status import Code, TtrpcError

HYPERVISOR = "hypervisor.Hypervisor"
AGENT = "grpc.AgentService"
START_DEADLINE_NANO = 600 * 10**9  # the shim's StartVM limit
CHECK_DEADLINE_NANO = 30 * 10**9
STOP_DELAY_SECONDS = 0.1  # observed: StopVM about 0.1 s after the agent connection closed
PAUSE = "pause"


@dataclass(frozen=True)
class StopOutcome:
    """What the shim's one StopVM got: `code` 0 for OK; `connected` False when nothing listened
    (the shim logs it and gives up)."""

    connected: bool
    code: int = 0
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.connected and self.code == 0


class ShimEmulator:
    """One sandbox as Kata's Go shim drives it (see the module docstring)."""

    def __init__(
        self,
        hypervisor_socket: str,
        sandbox_id: str,
        annotations: Mapping[str, str],
        *,
        netns: str = "",
        stop_delay_seconds: float = STOP_DELAY_SECONDS,
    ) -> None:
        self.hypervisor_socket = hypervisor_socket
        self.sandbox_id = sandbox_id
        self.annotations = dict(annotations)
        self.netns = netns
        self.stop_delay_seconds = stop_delay_seconds
        self.agent_socket = ""
        self.pause_exit: int | None = None  # the pause container's exit status, once known
        self.wait_error: TtrpcError | None = None  # why its WaitProcess failed, if it did
        self.oom_calls = 0
        self._agent: Client | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop: asyncio.Future[StopOutcome] | None = None

    # --- the hypervisor calls, each on a new connection ----------------------------------------

    async def _hypervisor(self, method: str, payload: bytes, timeout_nano: int = 0) -> bytes:
        async with await Client.connect_unix(self.hypervisor_socket) as client:
            return await client.call(HYPERVISOR, method, payload, timeout_nano=timeout_nano)

    async def create_vm(self) -> str:
        """CreateVM: the agent socket path the adaptor answers."""
        request = hypervisor_pb2.CreateVMRequest(
            id=self.sandbox_id, annotations=self.annotations, networkNamespacePath=self.netns
        )
        answer = await self._hypervisor("CreateVM", request.SerializeToString())
        self.agent_socket = hypervisor_pb2.CreateVMResponse.FromString(answer).agentSocketPath
        return self.agent_socket

    async def start_vm(self) -> None:
        request = hypervisor_pb2.StartVMRequest(id=self.sandbox_id)
        await self._hypervisor("StartVM", request.SerializeToString(), START_DEADLINE_NANO)

    async def stop_vm(self) -> StopOutcome:
        """One StopVM, as the shim sends it (no deadline); never raises."""
        request = hypervisor_pb2.StopVMRequest(id=self.sandbox_id).SerializeToString()
        try:
            client = await Client.connect_unix(self.hypervisor_socket)
        except (TtrpcError, OSError) as exc:
            return StopOutcome(False, int(Code.UNAVAILABLE), str(exc))
        async with client:
            try:
                await client.call(HYPERVISOR, "StopVM", request)
            except TtrpcError as exc:
                return StopOutcome(True, int(exc.code), exc.message)
        return StopOutcome(True)

    # --- the pod ---------------------------------------------------------------------------------

    async def run_pod(self) -> None:
        """CreateVM, StartVM, then the agent connection with the pause container running."""
        await self.create_vm()
        await self.start_vm()
        await self.start_pause()

    async def start_pause(self) -> None:
        """Open the one agent connection, set the sandbox up, and leave the pause container's
        WaitProcess and a GetOOMEvent in flight."""
        if self._agent is not None:
            raise RuntimeError("the shim opens its agent connection once")
        self._agent = agent = await Client.connect_unix(self.agent_socket)
        await agent.call(
            "grpc.Health",
            "Check",
            health_pb2.CheckRequest(service="").SerializeToString(),
            timeout_nano=CHECK_DEADLINE_NANO,
        )
        await agent.call(AGENT, "CreateSandbox", b"")
        container = agent_pb2.CreateContainerRequest(container_id=PAUSE, exec_id=PAUSE)
        await agent.call(AGENT, "CreateContainer", container.SerializeToString())
        start = agent_pb2.StartContainerRequest(container_id=PAUSE)
        await agent.call(AGENT, "StartContainer", start.SerializeToString())
        self._stop = asyncio.get_running_loop().create_future()
        self._spawn(self._wait_pause(agent))
        self._spawn(self._watch_oom(agent))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wait_pause(self, agent: Client) -> None:
        wait = agent_pb2.WaitProcessRequest(container_id=PAUSE, exec_id=PAUSE)
        try:
            answer = await agent.call(AGENT, "WaitProcess", wait.SerializeToString())
            self.pause_exit = agent_pb2.WaitProcessResponse.FromString(answer).status
        except TtrpcError as exc:
            self.wait_error = exc  # "ttrpc: closed": the Go shim stops the sandbox all the same
        await asyncio.sleep(self.stop_delay_seconds)
        outcome = await self.stop_vm()
        assert self._stop is not None
        if not self._stop.done():
            self._stop.set_result(outcome)

    async def _watch_oom(self, agent: Client) -> None:
        while True:
            try:
                await agent.call(AGENT, "GetOOMEvent", b"")
            except TtrpcError:
                return  # logged by the Go shim; it does not dial again
            self.oom_calls += 1

    async def stopped(self, timeout_seconds: float = 10.0) -> StopOutcome:
        """What the shim's one StopVM got, once it was sent."""
        if self._stop is None:
            raise RuntimeError("the pod was never started")
        return await asyncio.wait_for(asyncio.shield(self._stop), timeout_seconds)

    @property
    def stop_sent(self) -> bool:
        return self._stop is not None and self._stop.done()

    async def close(self) -> None:
        """End the emulation (test cleanup): nothing more is sent."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._agent is not None:
            await self._agent.close()


# --- the pod VM side ----------------------------------------------------------------------------


class PodVMAgent:
    """A kata-agent behind a pod VM's forwarder port (plain TCP, no TLS), for every sandbox
    whose proxy dials its listener."""

    def __init__(self) -> None:
        self.server: asyncio.AbstractServer | None = None
        self.calls: list[str] = []
        self.connections = 0
        self._exits: dict[str, asyncio.Future[int]] = {}
        self._output: dict[str, asyncio.Queue[bytes]] = {}
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    async def start(cls, listener: socket.socket) -> PodVMAgent:
        """Serve on a bound TCP socket (made in whichever network namespace the VM lives)."""
        agent = cls()
        listener.listen(64)
        listener.setblocking(False)
        agent.server = await asyncio.start_server(agent._serve, sock=listener)
        return agent

    def exit(self, container_id: str, status: int) -> None:
        """The container's process exits: its WaitProcess answers `status`."""
        self._exit(container_id).set_result(status)

    def write(self, container_id: str, data: bytes) -> None:
        """Output of the container, for its ReadStdout."""
        self._queue(container_id).put_nowait(data)

    def _exit(self, container_id: str) -> asyncio.Future[int]:
        if container_id not in self._exits:
            self._exits[container_id] = asyncio.get_running_loop().create_future()
        return self._exits[container_id]

    def _queue(self, container_id: str) -> asyncio.Queue[bytes]:
        return self._output.setdefault(container_id, asyncio.Queue())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        decoder = FrameDecoder()
        try:
            while chunk := await reader.read(65536):
                for event in decoder.feed(chunk):
                    if getattr(event, "msg_type", None) != MessageType.REQUEST:
                        continue
                    request = ttrpc_pb2.Request.FromString(event.data)  # type: ignore[union-attr]
                    task = asyncio.ensure_future(self._answer(writer, event.stream_id, request))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(
        self, writer: asyncio.StreamWriter, stream_id: int, request: ttrpc_pb2.Request
    ) -> None:
        self.calls.append(request.method)
        payload = b""
        if request.method == "Check":
            payload = health_pb2.HealthCheckResponse(
                status=health_pb2.HealthCheckResponse.SERVING
            ).SerializeToString()
        elif request.method == "WaitProcess":
            wait = agent_pb2.WaitProcessRequest.FromString(request.payload)
            status = await asyncio.shield(self._exit(wait.container_id))
            payload = agent_pb2.WaitProcessResponse(status=status).SerializeToString()
        elif request.method == "GetOOMEvent":
            await asyncio.Event().wait()  # no OOM ever: held until the connection goes
        elif request.method in ("ReadStdout", "ReadStderr"):
            read = agent_pb2.WaitProcessRequest.FromString(request.payload)  # fields 1 and 2
            data = await self._queue(read.container_id).get()
            payload = b"\x0a" + _varint(len(data)) + data
        if not writer.is_closing():
            writer.write(encode_frame(stream_id, MessageType.RESPONSE, encode_response(payload)))

    async def close(self) -> None:
        """Stop listening and drop every connection (the pod VM is gone)."""
        if self.server is not None:
            self.server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.server is not None:
            with contextlib.suppress(Exception):
                await self.server.wait_closed()


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
