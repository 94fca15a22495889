"""CreateVM's netns path on the real kernel: only a pod's namespace, directly in the CRI's
directories, is accepted; the adaptor's, the host's and the worker's are refused however they
are named; a FIFO at the path never blocks the networking threads."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptor.hypervisor.service import to_status
from adaptor.podnet import VNI_POOL, BadNetns, PodNet, PodNetSettings, _netns
from adaptor.state import StateStore
from adaptor.ttrpc.status import Code
from tests.podnet.snapshot import snapshot
from tests.podnet.topology import Topology


@pytest.fixture
async def store(tmp_path: Path) -> StateStore:
    store = await StateStore.open(tmp_path / "state")
    yield store  # type: ignore[misc]
    await store.close()


@contextlib.contextmanager
def bound_in_run_netns(source: str) -> Iterator[str]:
    """`source` (a namespace file) bind-mounted at a new name in /run/netns."""
    target = Path("/run/netns") / f"pnown{uuid.uuid4().hex[:6]}"
    target.touch()
    try:
        subprocess.run(["mount", "--bind", source, str(target)], check=True)
        try:
            yield str(target)
        finally:
            subprocess.run(["umount", str(target)], check=True)
    finally:
        target.unlink()


@contextlib.contextmanager
def symlink_in_run_netns(to: str) -> Iterator[str]:
    link = Path("/run/netns") / f"pnlnk{uuid.uuid4().hex[:6]}"
    link.symlink_to(to)
    try:
        yield str(link)
    finally:
        link.unlink()


async def test_the_adaptors_the_hosts_and_the_workers_netns_are_refused(
    topo: Topology, store: StateStore
) -> None:
    podnet = PodNet(PodNetSettings(), store, host_netns=topo.worker)
    pod, _ = await asyncio.to_thread(topo.add_pod)
    before = await asyncio.to_thread(snapshot, topo.worker)
    own = f"/proc/{os.getpid()}/ns/net"
    outside = "is not a file directly in /run/netns or /var/run/netns"
    cases = {
        "/proc/self/ns/net": outside,
        own: outside,
        "/proc/1/ns/net": outside,
        "/run/netns/../../proc/self/ns/net": outside,
        "/var/run/netns/./" + Path(pod).name: outside,
        "run/netns/" + Path(pod).name: outside,
        # The worker netns the tunnel's UDP sockets live in is in /var/run/netns here.
        topo.worker: "is the worker's network namespace, not a pod's",
        "/run/netns/a\0b": "contains a NUL byte",
    }
    try:
        with (
            bound_in_run_netns(own) as bound,
            symlink_in_run_netns(pod) as to_pod,
            symlink_in_run_netns("/proc/self/ns/net") as to_own,
        ):
            cases[bound] = "is the adaptor's own network namespace, not a pod's"
            cases[to_pod] = "is a symbolic link"
            cases[to_own] = "is a symbolic link"
            for path, message in cases.items():
                with pytest.raises(BadNetns, match=message) as caught:
                    await podnet.inspect("sb", path)
                assert to_status(caught.value).code is Code.INVALID_ARGUMENT
        assert await store.leases(VNI_POOL) == {}
        assert await asyncio.to_thread(snapshot, topo.worker) == before
        # The real pod netns, by either of the CRI's directory names, is accepted.
        for path in (pod, pod.replace("/var/run/", "/run/")):
            tunnel = await podnet.inspect(f"sb-{len(path)}", path)
            assert tunnel is not None and tunnel.network.pod_ip
    finally:
        await podnet.close()


async def test_a_fifo_at_the_path_blocks_no_networking_thread(
    topo: Topology, store: StateStore, tmp_path: Path
) -> None:
    directory = tmp_path / "netns"
    directory.mkdir()
    fifos = [directory / f"fifo{i}" for i in range(16)]
    for fifo in fifos:
        os.mkfifo(fifo)
    settings = PodNetSettings(netns_dirs=(str(directory), *_netns.NETNS_DIRS))
    podnet = PodNet(settings, store, host_netns=topo.worker, threads=8)
    pod, _ = await asyncio.to_thread(topo.add_pod)
    try:
        async with asyncio.timeout(10):
            results = await asyncio.gather(
                *(podnet.inspect(f"sb{i}", str(f)) for i, f in enumerate(fifos)),
                return_exceptions=True,
            )
            assert all(
                isinstance(r, BadNetns) and "is not a network namespace" in str(r) for r in results
            ), results
            assert await podnet.inspect("good", pod) is not None
        assert set((await store.leases(VNI_POOL)).values()) == {"good"}
    finally:
        # A thread blocked opening a FIFO for reading is released by a writer.
        for fifo in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        await podnet.close()
