"""Kata's Go shim (tests/shim_emulator.py) does not notice a hand-off: its agent connection never
closes, so it never stops its pod; its one StopVM, when the pod ends, reaches the successor. A
predecessor told to wait after the hand-off (as in a DaemonSet pod) stays until SIGTERM, and
its SIGTERM stops no pod."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from tests.adaptor.daemon_proc import ANNOTATIONS, ServeProcess
from tests.adaptor.handoff_rig import START_SECONDS, hand_off, serve_args
from tests.shim_emulator import PAUSE, PodVMAgent, ShimEmulator

SANDBOXES = 5
HANDOFFS = 2


def bound_listener() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    return listener


async def test_the_go_shim_never_notices_a_hand_off(root: Path) -> None:
    listeners = [bound_listener() for _ in range(SANDBOXES)]
    endpoints = [f"127.0.0.1:{sock.getsockname()[1]}" for sock in listeners]
    agents = [await PodVMAgent.start(sock) for sock in listeners]
    serve = ServeProcess(root, serve_args(endpoints))
    shims: list[ShimEmulator] = []
    try:
        await serve.start()
        for index in range(SANDBOXES):
            shim = ShimEmulator(serve.socket, f"go{index}", ANNOTATIONS)
            await shim.run_pod()
            shims.append(shim)
        for _ in range(HANDOFFS):
            serve = await hand_off(root, serve)
        # As in a DaemonSet pod: the predecessor stays, holding nothing, until SIGTERM.
        serve = await hand_off(root, serve, "--after-hand-off", "wait")
        last = ServeProcess(root, serve.args, logs=list(serve.logs))
        await last.start(timeout_seconds=START_SECONDS)
        await asyncio.sleep(0.5)
        assert serve.process is not None and serve.process.returncode is None  # still there
        assert await serve.terminate() == 0
        serve = last
        await asyncio.sleep(0.3)  # a shim that lost its connection sends StopVM 0.1 s later
        assert [shim.stop_sent for shim in shims] == [False] * SANDBOXES
        assert [shim.wait_error for shim in shims] == [None] * SANDBOXES
        assert all(agent.connections == 1 + HANDOFFS + 2 for agent in agents)

        for agent in agents:
            agent.exit(PAUSE, 0)  # the pod ends: each shim sends its one StopVM
        outcomes = [await shim.stopped() for shim in shims]
        assert [(o.connected, o.code) for o in outcomes] == [(True, 0)] * SANDBOXES
        assert [shim.pause_exit for shim in shims] == [0] * SANDBOXES
        assert serve.rows("SELECT * FROM sandboxes") == []
        assert serve.rows("SELECT * FROM leases") == []
        assert "Traceback" not in serve.log()
    finally:
        for shim in shims:
            await shim.close()
        await serve.kill()
        for agent in agents:
            await agent.close()
