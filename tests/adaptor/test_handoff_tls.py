"""A hand-off with agent TLS on: what the pods lose, measured byte by byte.

A TLS session cannot move between processes, so at a hand-off the old process drops its
connection to each pod VM and the new one dials its own. An answer the pod VM has sent when the
old process lets go is still on the network; the test puts the network in: each pod VM sits
behind a relay that delays everything it sends by 50 ms (a forwarder one 50 ms hop away), and
relays a half-close towards the agent as a forwarder does. The agent (TLS with the adaptor's own
CA, as a pod VM's forwarder) cancels a closed connection's calls. Every workload prints a line
every 20 ms, so at each hand-off a `ReadStdout` answer is nearly always on its way.

The agent's TLS layer is asyncio's, which ends the whole session when the TCP FIN arrives: an
answer the agent writes after that is dropped, though its server cancels the read only a moment
later. Every stream here is printing, so the old process lets each read in flight be answered
before it shuts its side of the TCP connection for writing, then reads what the pod VM had
already sent until the agent closes.

Measured: every byte printed, compared with what each shim received (the gaps, by hand-off):
nothing is lost, as docs/upgrade.md says. The exit status of each workload reaches its shim
afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

from adaptor.proxy.pki import AdaptorPKI
from tests.adaptor.daemon_proc import ANNOTATIONS, ServeProcess
from tests.adaptor.handoff_peers import StreamingAgent, StreamingShim
from tests.adaptor.handoff_rig import hand_off
from tests.shim_emulator import PAUSE

PODS = 5
HANDOFFS = 3
LATENCY_SECONDS = 0.05
PRINT_EVERY_SECONDS = 0.02
# lines each workload prints at least, however fast the hand-offs go (a busy machine slows the
# printer's 20 ms ticks; the lines printed while each hand-off runs are checked apart)
MIN_LINES = 150


class DelayingRelay:
    """A forwarder one hop away: what the pod VM sends reaches the adaptor `latency` later; the
    adaptor's half-close is passed on to the agent, and the adaptor's side closes once the
    agent's has and everything it sent went through."""

    def __init__(self, target_port: int, latency: float) -> None:
        self.target_port = target_port
        self.latency = latency
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._relay(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        agent_reader, agent_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def towards_agent() -> None:
            while data := await reader.read(65536):
                agent_writer.write(data)
            agent_writer.write_eof()

        async def from_agent() -> None:
            while data := await agent_reader.read(65536):
                queue.put_nowait((loop.time() + self.latency, data))
            queue.put_nowait((loop.time() + self.latency, b""))

        async def towards_adaptor() -> None:
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                if not data:
                    return
                writer.write(data)
                await writer.drain()

        with contextlib.suppress(ConnectionError, OSError):
            async with asyncio.TaskGroup() as group:
                group.create_task(towards_agent())
                group.create_task(from_agent())
                group.create_task(towards_adaptor())
        writer.close()
        agent_writer.close()


def server_tls(pki: AdaptorPKI, directory: Path) -> ssl.SSLContext:
    """The forwarder's side: a server certificate of the adaptor's CA; clients must chain to it."""
    pair = pki.issue_server("any-sandbox")
    (directory / "server.crt").write_text(pair.cert_pem)
    (directory / "server.key").write_text(pair.key_pem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca_file))
    context.load_cert_chain(directory / "server.crt", directory / "server.key")
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def gaps(written: bytes, received: bytes) -> list[bytes]:
    """What `received` misses of `written`, as the runs of lines left out (in order); `received`
    must be `written` with some lines left out."""
    missing: list[bytes] = []
    lines = iter(received.splitlines(keepends=True))
    expected = next(lines, None)
    run = b""
    for line in written.splitlines(keepends=True):
        if line == expected:
            if run:
                missing.append(run)
                run = b""
            expected = next(lines, None)
        else:
            run += line
    assert expected is None, f"received a line never written: {expected!r}"
    if run:
        missing.append(run)
    return missing


@contextlib.asynccontextmanager
async def pod_vms(root: Path) -> AsyncIterator[tuple[StreamingAgent, list[DelayingRelay]]]:
    """One TLS agent behind a delaying relay per pod VM (its static endpoint)."""
    pki = AdaptorPKI.load_or_create(root / "state")  # serve finds and uses this CA
    agent = StreamingAgent()
    relays: list[DelayingRelay] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    try:
        await agent.serve_on(listener, server_tls(pki, root))
        for _ in range(PODS):
            relay = DelayingRelay(agent.port, LATENCY_SECONDS)
            await relay.start()
            relays.append(relay)
        yield agent, relays
    finally:
        for relay in relays:
            await relay.stop()
        await agent.stop()


async def test_agent_tls_hand_off_loses_no_output(root: Path) -> None:
    async with pod_vms(root) as (agent, relays):
        endpoints = ",".join(f"127.0.0.1:{relay.port}" for relay in relays)
        args = ["--provider", "static", "--static-endpoints", endpoints, "--agent-tls"]
        args += ["--proxy-timeout", "20s", "--shutdown-grace", "2s", "--gc-interval", "0s"]
        serve = ServeProcess(root, args)
        await serve.start()
        shims = [StreamingShim(serve.socket, f"tls{i}", ANNOTATIONS) for i in range(PODS)]
        written = [bytearray() for _ in shims]
        stop = asyncio.Event()
        printed = [0]  # lines each workload has printed so far

        async def print_lines() -> None:
            while not (stop.is_set() and printed[0] >= MIN_LINES):
                for index, shim in enumerate(shims):
                    data = f"{index}:{printed[0]}\n".encode()
                    written[index] += data
                    agent.containers[shim.workload].write(data)
                printed[0] += 1
                await asyncio.sleep(PRINT_EVERY_SECONDS)

        try:
            await asyncio.gather(*(shim.run_pod() for shim in shims))
            printer = asyncio.create_task(print_lines())
            during: list[int] = []  # lines printed while each hand-off ran
            try:
                for _ in range(HANDOFFS):
                    before = printed[0]
                    serve = await hand_off(root, serve)
                    during.append(printed[0] - before)
                    await asyncio.sleep(0.3)
            finally:
                stop.set()
                await printer
            await asyncio.sleep(1.0)  # the last lines are on their way (50 ms)

            lost = {
                shim.sandbox_id: gaps(bytes(data), bytes(shim.output))
                for shim, data in zip(shims, written, strict=True)
            }
            assert lost == {shim.sandbox_id: [] for shim in shims}
            assert all(data.count(b"\n") >= MIN_LINES for data in written)
            assert all(lines > 0 for lines in during), during  # output crossed every hand-off
            assert [shim.errors for shim in shims] == [[]] * PODS
            assert [shim.connected for shim in shims] == [True] * PODS
            assert agent.connections == PODS * (1 + HANDOFFS)

            for index, shim in enumerate(shims):
                agent.containers[shim.workload].end(7 + index)
            codes = [
                await asyncio.wait_for(asyncio.shield(shim.exit_status), 10)
                for shim in shims
                if shim.exit_status is not None
            ]
            assert codes == [7 + index for index in range(PODS)]
            agent.containers[PAUSE].end(0)
            outcomes = [await shim.stopped() for shim in shims]
            assert all(o.ok for o in outcomes), (outcomes, serve.log())
            assert serve.rows("SELECT * FROM sandboxes") == []
            assert "Traceback" not in serve.log()
        finally:
            for shim in shims:
                await shim.close()
            await serve.kill()
