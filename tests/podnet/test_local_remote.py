"""A pod VM address that is the worker's own (loopback, or an address on one of the worker's
interfaces) would have the pod's frames encapsulated to the worker's own VXLAN port and
decapsulated straight back into the pod: an L2 loop through the CNI bridge. StartVM refuses
such a tunnel, naming the address, and makes nothing."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adaptor.podnet import PodNet, PodNetSettings
from adaptor.podnet._service import LocalRemote
from adaptor.state import StateStore
from tests.adaptor.daemon_proc import ServeProcess
from tests.adaptor.handoff_rig import serve_args
from tests.podnet.snapshot import snapshot
from tests.podnet.topology import Topology


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[StateStore]:
    store = await StateStore.open(tmp_path)
    yield store
    await store.close()


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",  # loopback
        "127.3.2.1",  # all of 127/8 is
        "192.168.0.2",  # the worker's underlay address (enc0)
        "10.128.0.1",  # the worker's CNI bridge
    ],
)
async def test_a_tunnel_to_an_address_of_the_worker_is_refused(
    topo: Topology, store: StateStore, address: str
) -> None:
    pod, _ip = await asyncio.to_thread(topo.add_pod)
    worker, pod_before = await asyncio.gather(
        asyncio.to_thread(snapshot, topo.worker), asyncio.to_thread(snapshot, pod)
    )
    podnet = PodNet(PodNetSettings(), store, host_netns=topo.worker)
    try:
        tunnel = await podnet.inspect("sb", pod)
        assert tunnel is not None
        with pytest.raises(LocalRemote, match=f"{address} is one of this node's own"):
            await podnet.setup(tunnel, (address,))
        assert await asyncio.to_thread(snapshot, topo.worker) == worker
        assert await asyncio.to_thread(snapshot, pod) == pod_before
    finally:
        await podnet.close()


async def test_a_tunnel_to_a_pod_vm_elsewhere_is_made(topo: Topology, store: StateStore) -> None:
    pod, _ip = await asyncio.to_thread(topo.add_pod)
    _vm, _podns, vm_ip = await asyncio.to_thread(topo.add_vm)
    podnet = PodNet(PodNetSettings(), store, host_netns=topo.worker)
    try:
        tunnel = await podnet.inspect("sb", pod)
        assert tunnel is not None
        ready = await podnet.setup(tunnel, (vm_ip,))
        assert ready.remote == vm_ip
        await podnet.teardown(ready)
        await podnet.deleted()
    finally:
        await podnet.close()


async def test_serve_says_at_start_which_static_endpoints_are_local() -> None:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        serve = ServeProcess(Path(directory), serve_args(["127.0.0.1:1", "192.0.2.7:15150"]))
        await serve.start()
        try:
            log = serve.log()
            assert "static endpoints 127.0.0.1:1 are addresses of this node" in log
            assert "192.0.2.7" not in log.split("are addresses of this node")[0]
        finally:
            await serve.kill()
