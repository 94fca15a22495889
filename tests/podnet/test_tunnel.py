"""The tunnel end to end on the real kernel: the adaptor's worker side (run in the worker netns),
the pod VM side emulated from apf.json, real TCP and UDP both ways."""

from __future__ import annotations

import asyncio
import errno
import json
from pathlib import Path

import pytest

from adaptor.podnet import PodNet, PodNetSettings, Tunnel, TunnelState
from adaptor.state import StateStore
from tests.podnet.snapshot import snapshot
from tests.podnet.topology import POD_MTU, Topology, podvm_setup, tcp_roundtrip, udp_roundtrip

PEER = "10.128.0.250"


def apf(tunnel: Tunnel) -> dict[str, object]:
    """The apf.json a pod VM gets (what matters to the forwarder), through JSON text."""
    text = json.dumps(
        {"pod-network": tunnel.network.to_dict(), "pod-namespace": "default", "pod-name": "p"}
    )
    decoded: dict[str, object] = json.loads(text)
    return decoded


async def test_one_pod_tcp_and_udp_both_ways(topo: Topology, tmp_path: Path) -> None:
    store = await StateStore.open(tmp_path)
    podnet = PodNet(PodNetSettings(), store, host_netns=topo.worker)
    try:
        pod, pod_ip = await asyncio.to_thread(topo.add_pod)
        vm, podns, vm_ip = await asyncio.to_thread(topo.add_vm)
        worker_before = await asyncio.to_thread(snapshot, topo.worker)
        pod_before = await asyncio.to_thread(snapshot, pod)
        tunnel = await podnet.inspect("sb1", pod)
        assert tunnel is not None and tunnel.vni == 555000
        assert tunnel.network.pod_ip == f"{pod_ip}/24"
        assert tunnel.network.worker_node_ip == "192.168.0.2/16"
        tunnel = await podnet.setup(tunnel, (vm_ip,))
        assert tunnel.state is TunnelState.READY and tunnel.remote == vm_ip
        await asyncio.to_thread(podvm_setup, vm, podns, apf(tunnel))
        peer_path = topo.peer
        assert (
            await asyncio.to_thread(tcp_roundtrip, podns, pod_ip, peer_path, b"x" * 200_000)
            == b"x" * 200_000
        )
        assert (
            await asyncio.to_thread(tcp_roundtrip, peer_path, PEER, podns, b"y" * 100_000)
            == b"y" * 100_000
        )
        assert (
            await asyncio.to_thread(udp_roundtrip, podns, pod_ip, peer_path, b"u" * 100)
            == b"u" * 100
        )
        assert (
            await asyncio.to_thread(udp_roundtrip, peer_path, PEER, podns, b"v" * 100) == b"v" * 100
        )
        # A datagram at the pod MTU with DF set passes, both ways.
        payload = b"m" * (POD_MTU - 28)
        assert (
            await asyncio.to_thread(udp_roundtrip, podns, pod_ip, peer_path, payload, df=True)
            == payload
        )
        assert (
            await asyncio.to_thread(udp_roundtrip, peer_path, PEER, podns, payload, df=True)
            == payload
        )
        # One byte more does not fit the pod VM's interface: with DF it is refused, not split.
        with pytest.raises(OSError) as refused:
            await asyncio.to_thread(udp_roundtrip, peer_path, PEER, podns, payload + b"m", df=True)
        assert refused.value.errno == errno.EMSGSIZE
        await podnet.teardown(tunnel)
        await podnet.deleted()
        assert await asyncio.to_thread(snapshot, topo.worker) == worker_before
        assert await asyncio.to_thread(snapshot, pod) == pod_before
    finally:
        await podnet.close()
        await store.close()
