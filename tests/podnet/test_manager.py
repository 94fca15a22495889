"""The sandbox manager with pod networking on the real kernel: CreateVM, StartVM, a restart
(a new manager and PodNet over the same state), StopVM; bad netns input; a pod gone at restart."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest

from adaptor.hypervisor import ManagerConfig, SandboxManager
from adaptor.hypervisor.pod_network import PodNetworkHook
from adaptor.podnet import PodNet, PodNetSettings, SandboxPodNetwork, Tunnel, TunnelState, _netns
from adaptor.state import StateStore
from providers.core.base import Instance, VMSpec
from providers.core.errors import InvalidRequest
from tests.adaptor.fakes import FakeProxies
from tests.adaptor.test_pod_network_hooks import pod_network_manager
from tests.podnet.caa_decode import decode_apf
from tests.podnet.snapshot import snapshot
from tests.podnet.topology import Topology, link_index, podvm_setup, udp_roundtrip

ANNOTATIONS = {
    "io.kubernetes.cri.sandbox-name": "pod-a",
    "io.kubernetes.cri.sandbox-namespace": "default",
}


class VmPool:
    """A provider whose VMs are the pod VM netns of the topology (addresses in order)."""

    name = "static"

    def __init__(self) -> None:
        self.addresses: dict[str, str] = {}
        self.deleted: list[str] = []

    async def create(self, spec: VMSpec) -> Instance:
        address = self.addresses[spec.sandbox_id]
        return Instance(
            id=f"vm-{spec.sandbox_id}",
            name=spec.sandbox_id,
            addresses=(address,),
            instance_type="static",
        )

    async def delete(self, instance_id: str) -> None:
        self.deleted.append(instance_id)

    async def list_owned(self) -> list[Instance]:
        return []


def manager(root: Path, store: StateStore, pool: VmPool, worker: str) -> SandboxManager:
    podnet = PodNet(PodNetSettings(), store, host_netns=worker)
    return pod_network_manager(
        ManagerConfig(pods_dir=root / "pods", proxy_timeout_seconds=1),
        store,
        pool,
        FakeProxies(),
        SandboxPodNetwork(podnet, root / "pods"),
    )


async def close(m: SandboxManager) -> None:
    await m.close(0)
    (hook,) = (h for h in m.table.hooks.hooks if isinstance(h, PodNetworkHook))
    assert isinstance(hook.tunnels, SandboxPodNetwork)
    await hook.tunnels.podnet.close()


async def test_lifecycle_across_a_restart(topo: Topology, tmp_path: Path) -> None:
    store = await StateStore.open(tmp_path / "state")
    pool = VmPool()
    pods = [await asyncio.to_thread(topo.add_pod) for _ in range(3)]
    vms = [await asyncio.to_thread(topo.add_vm) for _ in range(3)]
    before = await asyncio.to_thread(snapshot, topo.worker)
    first = manager(tmp_path, store, pool, topo.worker)
    try:
        with pytest.raises(InvalidRequest, match="does not exist"):
            await first.create_vm("bad", ANNOTATIONS, "/run/netns/pp-nope")
        assert await store.get("bad") is None
        for i in range(2):
            pool.addresses[f"sb{i}"] = vms[i][2]
            await first.create_vm(f"sb{i}", ANNOTATIONS, pods[i][0])
            await first.start_vm(f"sb{i}")
            copy = tmp_path / "pods" / f"sb{i}" / "apf.json"
            assert stat.S_IMODE(os.stat(copy).st_mode) == 0o600
            apf = json.loads(copy.read_text())
            decode_apf(apf)
            await asyncio.to_thread(podvm_setup, vms[i][0], vms[i][1], apf)
    finally:
        await close(first)

    # The restart: a tunnel lost its device meanwhile; pod 1's netns is gone.
    def damage() -> None:
        with _netns.iproute(pods[0][0]) as ipr:
            ipr.link("del", index=link_index(ipr, "vxlan1"))

    await asyncio.to_thread(damage)
    await asyncio.to_thread(topo.remove, pods[1][0])
    second = manager(tmp_path, store, pool, topo.worker)
    try:
        await second.recover()
        record = await store.get("sb0")
        assert record is not None
        assert Tunnel.from_json(record.pod_network).state is TunnelState.READY
        assert await asyncio.to_thread(udp_roundtrip, vms[0][1], pods[0][1], topo.peer, b"hi")
        assert await store.get("sb1") is None and "vm-sb1" in pool.deleted
        # A new pod gets a VNI no live pod holds.
        pool.addresses["sb2"] = vms[2][2]
        await second.create_vm("sb2", ANNOTATIONS, pods[2][0])
        new = await store.get("sb2")
        assert new is not None and Tunnel.from_json(new.pod_network).vni == 555002
        await second.start_vm("sb2")
        for sandbox in ("sb0", "sb2"):
            await second.stop_vm(sandbox)
        assert not (tmp_path / "pods" / "sb0").exists()
    finally:
        await close(second)
        await store.close()
    after = await asyncio.to_thread(snapshot, topo.worker)
    # The deleted pod took its veth (and that veth's qdisc) with it; nothing else differs.
    gone = {e[0] for e in before["links"] if e[1] == "w-p2"}
    for key in ("links", "qdiscs", "addresses"):
        before[key] = [e for e in before[key] if e[0] not in gone]
        after[key] = [e for e in after[key] if e[0] not in gone]
    assert after == before
