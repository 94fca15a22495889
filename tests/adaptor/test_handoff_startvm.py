"""A hand-off while a StartVM waits for its pod VM's forwarder: the StartVM finishes in the old
process and its shim is answered with success (Kata's shim does not retry a StartVM), the VM
is kept, and the new process serves the sandbox."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from tests.adaptor.daemon_proc import ANNOTATIONS, ServeProcess, hypervisor_call
from tests.adaptor.fake_agent import FakeAgent, FakeShim
from tests.adaptor.handoff_rig import START_SECONDS, hand_off, serve_args


class LateAgent(FakeAgent):
    """A pod VM whose forwarder comes up only when told, on a port chosen before."""

    def __init__(self) -> None:
        super().__init__()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])

    async def start(self) -> None:
        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            self.server._accept(reader, writer)

        self._listener = await asyncio.start_server(accept, "127.0.0.1", self.port)


async def test_a_start_in_flight_finishes_across_a_hand_off(root: Path) -> None:
    agent = LateAgent()
    old = ServeProcess(root, [*serve_args([f"127.0.0.1:{agent.port}"]), "--shutdown-grace", "1s"])
    await old.start()
    new: ServeProcess | None = None
    shim: FakeShim | None = None
    try:
        created = await hypervisor_call(
            old.socket, "CreateVM", pb.CreateVMRequest(id="sb1", annotations=ANNOTATIONS)
        )
        agent_socket = pb.CreateVMResponse.FromString(created).agentSocketPath
        starting = asyncio.create_task(
            hypervisor_call(old.socket, "StartVM", pb.StartVMRequest(id="sb1"))
        )
        await asyncio.sleep(1.0)  # the StartVM dials a forwarder that is not there yet
        assert not starting.done()
        successor = asyncio.create_task(hand_off(root, old))
        await asyncio.sleep(3.0)  # past the old process's --shutdown-grace of 1 s
        assert not starting.done()
        await agent.start()  # the VM has booted: its forwarder answers
        await asyncio.wait_for(starting, START_SECONDS)  # answered, and with success
        new = await asyncio.wait_for(successor, START_SECONDS)
        rows = new.rows("SELECT id, state FROM sandboxes")
        assert rows == [("sb1", "running")], new.log()
        assert "deleting VM" not in new.log()
        shim = FakeShim(agent_socket)  # the successor serves the agent socket
        await shim.start()
        await asyncio.sleep(0.5)
        assert shim.open and shim.pause_wait is not None and not shim.pause_wait.done()
        await hypervisor_call(new.socket, "StopVM", pb.StopVMRequest(id="sb1"))
        assert new.rows("SELECT id FROM sandboxes") == []
    finally:
        if shim is not None:
            await shim.close()
        for process in (old, new):
            if process is not None:
                await process.kill()
        await agent.stop()
