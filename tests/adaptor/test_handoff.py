"""`serve` hands its sockets to a successor, five times in a row, under 20 running sandboxes.

Each sandbox's shim holds one agent connection with Kata's long-lived calls in flight (the pause
container's WaitProcess, GetOOMEvent, a ReadStdout loop and the workload's WaitProcess), and every
workload prints a line every 20 ms throughout. After each hand-off the predecessor has exited, no
shim connection closed and no call failed; at the end every byte printed reached its shim, each
exit code reaches its WaitProcess, and StopVM tears every sandbox down through the last successor.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from tests.adaptor.daemon_proc import ServeProcess, exists
from tests.adaptor.fake_agent import WORKLOAD
from tests.adaptor.handoff_rig import Node, running_node, sandbox_id, serve_args

SANDBOXES = 20
HANDOFFS = 5


async def wait_until(done: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def lost_bytes(node: Node) -> dict[str, int]:
    """Per sandbox, what was printed but never reached the shim (empty: nothing lost)."""
    lost = {}
    for index, (shim, written) in enumerate(zip(node.shims, node.written, strict=True)):
        if bytes(shim.output) != bytes(written):
            lost[sandbox_id(index)] = len(written) - len(shim.output)
    return lost


async def test_five_hand_offs_under_twenty_running_sandboxes(root: Path) -> None:
    async with running_node(root, SANDBOXES) as node:
        stop = asyncio.Event()

        async def print_lines() -> None:
            line = 0
            while not stop.is_set():
                for index in range(SANDBOXES):
                    node.write(index, f"{index}:{line}\n".encode())
                line += 1
                await asyncio.sleep(0.02)

        printer = asyncio.create_task(print_lines())
        try:
            pids = []
            for _ in range(HANDOFFS):
                assert node.serve is not None and node.serve.process is not None
                pids.append(node.serve.process.pid)
                predecessor = node.serve
                successor = await node.hand_off()
                assert predecessor.process is not None
                assert predecessor.process.returncode == 0
                assert successor.process is not None and successor.process.pid not in pids
                assert all(shim.open for shim in node.shims)
                assert [shim.errors for shim in node.shims] == [[]] * SANDBOXES
                assert "Traceback" not in predecessor.log()
        finally:
            stop.set()
            await printer

        # every pod VM was dialled once per process: once at StartVM, then by each successor
        assert [agent.connections for agent in node.agents] == [1 + HANDOFFS] * SANDBOXES
        assert await wait_until(lambda: not lost_bytes(node), 10), lost_bytes(node)

        for index, agent in enumerate(node.agents):
            agent.containers[WORKLOAD].end(index)
        codes = await asyncio.wait_for(
            asyncio.gather(*(shim.exit_code() for shim in node.shims)), 10
        )
        assert codes == list(range(SANDBOXES))
        assert all(
            shim.pause_wait is not None and not shim.pause_wait.done() for shim in node.shims
        )
        assert all(shim.open for shim in node.shims)

        assert node.serve is not None
        assert node.serve.rows("SELECT count(*) FROM sandboxes WHERE state = 'running'") == [
            (SANDBOXES,)
        ]
        for index, shim in enumerate(node.shims):
            await node.hypervisor("StopVM", pb.StopVMRequest(id=sandbox_id(index)))
            assert not exists(shim.socket_path)
        assert node.serve.rows("SELECT * FROM sandboxes") == []
        assert node.serve.rows("SELECT * FROM leases") == []
        assert "Traceback" not in node.serve.log()


async def test_take_over_always_without_a_predecessor_is_a_clear_error(root: Path) -> None:
    serve = ServeProcess(root, [*serve_args(["127.0.0.1:1"]), "--take-over", "always"])
    with pytest.raises(RuntimeError, match="did not start"):
        await serve.start()
    assert serve.process is not None and serve.process.returncode == 2
    assert f"no running peerpods serve at {root / 'pods' / '.handoff'}" in serve.log()
    assert "Traceback" not in serve.log()
    assert not exists(serve.socket)
