"""Hand-offs under running pods with pod networking on, on the static provider and on moto.

Each pod is driven by Kata's Go shim (tests/adaptor/handoff_peers.StreamingShim): one agent
connection with the pause container's WaitProcess and a GetOOMEvent in flight, plus a workload
whose WaitProcess is in flight and whose output it reads in a ReadStdout loop; every workload
prints a line every 20 ms throughout. `serve` hands its sockets to a successor five times in a
row. After each: the predecessor exited 0, no shim connection closed, no call failed, no shim
sent a StopVM, and every tunnel and lease is still there. Then every byte printed reached its
shim, each workload's exit status reaches its WaitProcess, and the pods end: each shim's one
StopVM reaches the last successor, which leaves 0 VMs, 0 records, 0 leases, and the worker and
pod netns exactly as they began (no tunnel left).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.adaptor.daemon_proc import ServeProcess
from tests.adaptor.handoff_peers import StreamingAgent, StreamingShim
from tests.podnet.test_restart_no_leak import (
    FORWARDER_PORT,
    MOTO_ENV,
    PODS,
    MotoWorker,
    Node,
    add_pods,
    bound,
    live_vms,
    moto_in,
    static_node,
    until,
)
from tests.podnet.topology import Topology
from tests.shim_emulator import PAUSE

pytestmark = pytest.mark.slow

HANDOFFS = 5
PRINT_EVERY_SECONDS = 0.02
START_SECONDS = 120.0


class Successive(ServeProcess):
    """`peerpods serve` (static) whose successor runs the same command line."""

    def successor(self) -> Successive:
        return Successive(self.root, self.args, netns=self.netns, logs=list(self.logs))


class SuccessiveMoto(MotoWorker):
    """The moto worker whose successor runs the same command line (it takes over: a live
    daemon holds its state directory)."""

    def successor(self) -> SuccessiveMoto:
        new = SuccessiveMoto(self.root, [], netns=self.netns, env=self.env, logs=list(self.logs))
        new.agent_port = self.agent_port
        return new


class HandoffNode(Node):
    """A worker node whose `serve` hands over under pods that print through `agent`."""

    def __init__(
        self,
        topo: Topology,
        proc: Successive | SuccessiveMoto,
        pods: list[str],
        agent: StreamingAgent,
        pods_dir: str = "pods",
    ) -> None:
        super().__init__(topo, proc, pods, pods_dir)
        self.serving: Successive | SuccessiveMoto = proc
        self.agent = agent
        self.streaming: list[StreamingShim] = []
        self.written: list[bytearray] = []

    async def run_streaming_pods(self) -> None:
        self.streaming = self.pod_shims(StreamingShim, "h")
        self.shims = list(self.streaming)
        self.written = [bytearray() for _ in self.pods]
        await asyncio.gather(*(shim.run_pod() for shim in self.streaming))

    def write(self, index: int, data: bytes) -> None:
        shim = self.streaming[index]
        self.written[index] += data
        self.agent.containers[shim.workload].write(data)

    def lost(self) -> dict[str, int]:
        """Per pod, the bytes printed that its shim has not received (empty: none)."""
        return {
            shim.sandbox_id: len(written) - len(shim.output)
            for shim, written in zip(self.streaming, self.written, strict=True)
            if bytes(shim.output) != bytes(written)
        }

    def count(self, query: str) -> int:
        return len(self.proc.rows(query))

    async def hand_off(self) -> None:
        """A successor takes over; the predecessor exits 0 and no pod notices."""
        old = self.serving
        new = old.successor()
        await new.start(timeout_seconds=START_SECONDS)
        assert old.process is not None
        code = await asyncio.wait_for(old.process.wait(), START_SECONDS)
        assert code == 0, old.log()
        self.proc = self.serving = new
        assert [shim.connected for shim in self.streaming] == [True] * PODS
        assert [shim.errors for shim in self.streaming] == [[]] * PODS
        assert [shim.wait_error for shim in self.streaming] == [None] * PODS
        assert [shim.stop_sent for shim in self.streaming] == [False] * PODS
        assert self.count("SELECT id FROM sandboxes WHERE state='running'") == PODS
        assert self.count("SELECT * FROM leases WHERE pool='vxlan'") == PODS
        assert "Traceback" not in old.log()


@contextlib.asynccontextmanager
async def printing(node: HandoffNode) -> AsyncIterator[None]:
    """Every workload prints a numbered line every 20 ms while inside."""
    stop = asyncio.Event()

    async def print_lines() -> None:
        line = 0
        while not stop.is_set():
            for index in range(PODS):
                node.write(index, f"{index}:{line}\n".encode())
            line += 1
            await asyncio.sleep(PRINT_EVERY_SECONDS)

    printer = asyncio.create_task(print_lines())
    try:
        yield
    finally:
        stop.set()
        await printer


async def hand_offs_then_stop(node: HandoffNode, vms: Callable[[], int]) -> None:
    """Five hand-offs under printing pods, then every exit status and every pod's end."""
    await node.run_streaming_pods()
    assert await asyncio.to_thread(vms) == PODS
    async with printing(node):
        for _ in range(HANDOFFS):
            await node.hand_off()
            assert await asyncio.to_thread(vms) == PODS
    await until(lambda: not node.lost(), 10, "every byte printed to reach its shim")
    assert all(len(written) > 0 for written in node.written)

    for index, shim in enumerate(node.streaming):
        node.agent.containers[shim.workload].end(index + 1)
    codes = [
        await asyncio.wait_for(asyncio.shield(shim.exit_status), 10)
        for shim in node.streaming
        if shim.exit_status is not None
    ]
    assert codes == list(range(1, PODS + 1))
    assert [shim.connected for shim in node.streaming] == [True] * PODS

    node.agent.containers[PAUSE].end(0)  # the pods end: each shim sends its one StopVM
    outcomes = await node.stop_outcomes()
    assert all(o.ok for o in outcomes), (outcomes, node.proc.log())
    assert [shim.pause_exit for shim in node.streaming] == [0] * PODS
    await node.close_shims()
    assert await asyncio.to_thread(vms) == 0
    assert await asyncio.to_thread(node.leaks) == {}, node.proc.log()
    assert "Traceback" not in node.proc.log()
    assert await node.proc.terminate() == 0
    # every pod VM was dialled once per process: at StartVM, then by each successor
    assert node.agent.connections == PODS * (1 + HANDOFFS)


@contextlib.asynccontextmanager
async def stopping(agent: StreamingAgent) -> AsyncIterator[StreamingAgent]:
    try:
        yield agent
    finally:
        await agent.stop()


async def test_static_provider_hand_offs_with_pod_networking(
    topo: Topology, tmp_path: Path
) -> None:
    pods, vms, args = await static_node(topo, "--proxy-timeout", "20s")
    proc = Successive(tmp_path, args, netns=topo.worker)
    async with stopping(StreamingAgent()) as agent:
        for vm, _podns, ip in vms:
            await agent.serve_on(bound(vm, (ip, FORWARDER_PORT)))
        node = HandoffNode(topo, proc, pods, agent)
        await node.remember()
        await proc.start()
        try:
            await hand_offs_then_stop(node, node.static_leases)
        finally:
            await node.close_shims()
            await node.proc.kill()
    assert await asyncio.to_thread(node.leaks) == {}


async def test_moto_hand_offs_with_pod_networking(topo: Topology, tmp_path: Path) -> None:
    pods = await add_pods(topo)
    proc = SuccessiveMoto(tmp_path, [], netns=topo.worker, env=MOTO_ENV)
    with moto_in(topo.worker):
        async with stopping(StreamingAgent()) as agent:
            listener = bound(topo.worker, ("127.0.0.1", 0))
            proc.agent_port = listener.getsockname()[1]
            await agent.serve_on(listener)
            node = HandoffNode(topo, proc, pods, agent, pods_dir="p")
            await node.remember()

            def vms() -> int:
                return live_vms(topo.worker)

            await proc.start()
            try:
                await hand_offs_then_stop(node, vms)
            finally:
                await node.close_shims()
                await node.proc.kill()
    assert await asyncio.to_thread(node.leaks) == {}
