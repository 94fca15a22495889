"""The daemon's shutdown order against shims that behave as Kata's Go shim: the agent sockets
close first, each shim answers with its one StopVM about 0.1 s later on a new connection, and the
hypervisor socket is still there to take it, so every sandbox is torn down before the process
exits; a shim that never sends its StopVM holds the exit for the drain at most."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adaptor.node.daemon import Daemon
from adaptor.ttrpc import Code, TtrpcError
from tests.adaptor.daemon_proc import ANNOTATIONS, daemon_settings
from tests.shim_emulator import PodVMAgent, ShimEmulator

PODS = 3


@pytest.fixture
async def agent() -> AsyncIterator[tuple[PodVMAgent, list[str]]]:
    listeners = []
    for _ in range(PODS):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listeners.append(listener)
    endpoints = [f"127.0.0.1:{s.getsockname()[1]}" for s in listeners]
    agents = [await PodVMAgent.start(s) for s in listeners]
    yield agents[0], endpoints
    for one in agents:
        await one.close()


async def static_daemon(root: Path, endpoints: str, drain_seconds: float) -> Daemon:
    """A started daemon over static pod VMs, draining `drain_seconds` when it stops."""
    settings = daemon_settings(
        root,
        provider="static",
        static_endpoints=endpoints,
        status_address="",
        shutdown_drain_seconds=drain_seconds,
    )
    daemon = Daemon(settings)
    await daemon.start()
    return daemon


def shims_for(daemon: Daemon, count: int) -> list[ShimEmulator]:
    sock = str(daemon.settings.socket)
    return [
        ShimEmulator(sock, f"sb{i}", {**ANNOTATIONS, "io.kubernetes.cri.sandbox-name": f"p{i}"})
        for i in range(count)
    ]


async def test_sigterm_takes_the_stopvm_of_every_disconnected_shim(
    root: Path, agent: tuple[PodVMAgent, list[str]]
) -> None:
    _, endpoints = agent
    daemon = await static_daemon(root, ",".join(endpoints), drain_seconds=10)
    settings = daemon.settings
    shims = shims_for(daemon, PODS)
    try:
        for shim in shims:
            await shim.run_pod()
        assert daemon.store is not None
        store = daemon.store
        assert len(await store.records()) == PODS
        assert len(await store.leases("static")) == PODS
        started = time.monotonic()
        await daemon.close()
        took = time.monotonic() - started
        outcomes = [await shim.stopped() for shim in shims]
    finally:
        for shim in shims:
            await shim.close()
        await daemon.close(0)
    assert all(o.ok for o in outcomes), outcomes
    assert all(s.wait_error is not None and s.wait_error.code == Code.UNAVAILABLE for s in shims)
    assert took < 5, f"the drain waited {took:.1f}s although every StopVM came"
    reopened = Daemon(settings)
    await reopened.start()
    try:
        assert reopened.store is not None
        assert await reopened.store.records() == []
        assert await reopened.store.leases("static") == {}
        assert [p for p in (root / "pods").iterdir() if not p.name.startswith(".")] == []
    finally:
        await reopened.close(0)


async def test_a_shim_that_sends_no_stopvm_holds_the_exit_for_the_drain_only(
    root: Path, agent: tuple[PodVMAgent, list[str]]
) -> None:
    _, endpoints = agent
    daemon = await static_daemon(root, endpoints[0], drain_seconds=0.5)
    (shim,) = shims_for(daemon, 1)
    shim.stop_delay_seconds = 3600  # this shim never gets to its StopVM
    try:
        await shim.run_pod()
        started = time.monotonic()
        await daemon.close()
        took = time.monotonic() - started
        assert 0.5 <= took < 3
        with pytest.raises(TimeoutError):
            await shim.stopped(0.1)
    finally:
        await shim.close()
        await daemon.close(0)


async def test_no_sandbox_starts_while_draining(
    root: Path, agent: tuple[PodVMAgent, list[str]]
) -> None:
    _, endpoints = agent
    daemon = await static_daemon(root, ",".join(endpoints), drain_seconds=5)
    first, late = shims_for(daemon, 2)
    first.stop_delay_seconds = 0.5
    try:
        await first.run_pod()
        closing = asyncio.create_task(daemon.close())
        await asyncio.sleep(0.2)  # the agent sockets are closed, the drain waits for sb0
        with pytest.raises(TtrpcError) as refused:
            await late.create_vm()
        assert refused.value.code == Code.UNAVAILABLE
        assert "shutting down" in refused.value.message
        await closing
        assert (await first.stopped()).ok
    finally:
        for shim in (first, late):
            await shim.close()
        await daemon.close(0)
