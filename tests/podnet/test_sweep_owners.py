"""Two `serve` processes on one node with the same --vxlan-port (distinct --owner-id, as their
VM collectors need): each one's network sweep removes only the tunnels its own owner made. A
device an older version made (tagged with the worker netns's inode alone) is still swept when
no lease holds its VNI."""

from __future__ import annotations

import asyncio
from pathlib import Path

from adaptor.podnet import PodNet, PodNetSettings, _tunnel
from adaptor.podnet._sweep import legacy_tag
from adaptor.state import StateStore
from tests.podnet.snapshot import snapshot
from tests.podnet.topology import Topology


def settings(owner: str, first_vni: int) -> PodNetSettings:
    return PodNetSettings(owner_id=owner, vxlan_min_id=first_vni, sweep_interval_seconds=0)


async def test_two_owners_on_one_port_sweep_only_their_own(topo: Topology, tmp_path: Path) -> None:
    (pod_a, _), (pod_b, _) = [await asyncio.to_thread(topo.add_pod) for _ in range(2)]
    (_, _, vm_a), (_, _, vm_b) = [await asyncio.to_thread(topo.add_vm) for _ in range(2)]
    store_a = await StateStore.open(tmp_path / "a")
    store_b = await StateStore.open(tmp_path / "b")
    node_a = PodNet(settings("peerpods-a", 700000), store_a, host_netns=topo.worker)
    node_b = PodNet(settings("peerpods-b", 800000), store_b, host_netns=topo.worker)
    try:
        tunnel_a = await node_a.inspect("sa", pod_a)
        tunnel_b = await node_b.inspect("sb", pod_b)
        assert tunnel_a is not None and tunnel_b is not None
        tunnel_a = await node_a.setup(tunnel_a, (vm_a,))
        tunnel_b = await node_b.setup(tunnel_b, (vm_b,))
        pod_b_before, worker_before = await asyncio.gather(
            asyncio.to_thread(snapshot, pod_b), asyncio.to_thread(snapshot, topo.worker)
        )
        removed = await node_a.sweep()  # b's tunnel is in none of a's leases
        assert removed.total == 0
        assert await asyncio.to_thread(snapshot, pod_b) == pod_b_before
        assert await asyncio.to_thread(snapshot, topo.worker) == worker_before
        assert (await node_b.sweep()).total == 0
        # each owner's own orphan still goes: a's lease lost (a killed daemon's)
        await node_a.release_vni(tunnel_a.vni)
        assert (await node_a.sweep()).devices == 1
        assert await asyncio.to_thread(snapshot, pod_b) == pod_b_before
        await node_b.teardown(tunnel_b)
        await node_b.deleted()
    finally:
        await node_a.close()
        await node_b.close()
        await store_a.close()
        await store_b.close()


async def test_an_older_versions_orphan_device_is_still_swept(
    topo: Topology, tmp_path: Path
) -> None:
    pod, _ = await asyncio.to_thread(topo.add_pod)
    _, _, vm = await asyncio.to_thread(topo.add_vm)
    store = await StateStore.open(tmp_path / "s")
    node = PodNet(settings("peerpods-a", 700000), store, host_netns=topo.worker)
    try:
        tunnel = await node.inspect("old", pod)
        assert tunnel is not None
        before = await asyncio.to_thread(snapshot, pod)
        await asyncio.to_thread(
            _tunnel.setup, topo.worker, pod, tunnel.network, vm, legacy_tag(topo.worker)
        )
        await node.release_vni(tunnel.vni)  # no lease: an older daemon's orphan
        removed = await node.sweep()
        assert removed.devices == 1
        assert await asyncio.to_thread(snapshot, pod) == before
    finally:
        await node.close()
        await store.close()
