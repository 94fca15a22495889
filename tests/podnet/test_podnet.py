"""The pod network module on the real kernel: bad input, VNIs, the apf.json schema, 50 pods,
repair after damage."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from adaptor.podnet import (
    VNI_POOL,
    BadNetns,
    NetnsGone,
    PodNet,
    PodNetSettings,
    Tunnel,
    TunnelError,
    TunnelState,
    VniExhausted,
    _netns,
)
from adaptor.state import StateStore
from tests.podnet.caa_decode import decode_apf
from tests.podnet.snapshot import snapshot
from tests.podnet.topology import (
    Topology,
    link_index,
    podvm_setup,
    tcp_roundtrip,
    udp_roundtrip,
)


def apf(tunnel: Tunnel) -> dict[str, object]:
    text = json.dumps(
        {"pod-network": tunnel.network.to_dict(), "pod-namespace": "ns", "pod-name": "p"}
    )
    decoded: dict[str, object] = json.loads(text)
    return decoded


@pytest.fixture
async def store(tmp_path: Path) -> StateStore:
    store = await StateStore.open(tmp_path)
    yield store  # type: ignore[misc]
    await store.close()


async def test_bad_netns_paths_fail_clearly_holding_nothing(
    topo: Topology, store: StateStore, tmp_path: Path
) -> None:
    settings = PodNetSettings(netns_dirs=(str(tmp_path), *_netns.NETNS_DIRS))
    podnet = PodNet(settings, store, host_netns=topo.worker)
    pod, ip = await asyncio.to_thread(topo.add_pod)
    pod2, _ = await asyncio.to_thread(topo.add_pod)
    before = await asyncio.to_thread(snapshot, topo.worker)
    plain = tmp_path / "file"
    plain.write_text("")
    cases = {
        str(tmp_path / "missing"): "does not exist",
        str(plain): "is not a network namespace",
        "/proc/self/ns/uts": "is not a file directly in",
    }
    try:
        for path, message in cases.items():
            with pytest.raises(BadNetns, match=message):
                await podnet.inspect("sb", path)
        # An interface with two IPv4 addresses, then one with none.

        def change(add: bool) -> None:
            with _netns.iproute(pod) as ipr:
                index = link_index(ipr, "eth0")
                if add:
                    ipr.addr("add", index=index, address="10.128.0.99", prefixlen=24)
                else:
                    ipr.addr("del", index=index, address=ip, prefixlen=24)

        await asyncio.to_thread(change, True)
        with pytest.raises(BadNetns, match=r"exactly one IPv4 address \(found 10.128"):
            await podnet.inspect("sb", pod)
        await asyncio.to_thread(change, False)

        def strip(ns: str) -> None:
            with _netns.iproute(ns) as ipr:
                index = link_index(ipr, "eth0")
                for address in ipr.get_addr(family=2, index=index):
                    ipr.addr(
                        "del",
                        index=index,
                        address=address.get_attr("IFA_ADDRESS"),
                        prefixlen=address["prefixlen"],
                    )
                ipr.route("add", dst="0.0.0.0/0", oif=index)

        await asyncio.to_thread(strip, pod2)
        with pytest.raises(BadNetns, match="found none"):
            await podnet.inspect("sb", pod2)
        assert await store.leases(VNI_POOL) == {}
        assert await asyncio.to_thread(snapshot, topo.worker) == before
        # "" is no pod network at all.
        assert await podnet.inspect("sb", "") is None
        assert await store.leases(VNI_POOL) == {}
    finally:
        await podnet.close()


async def test_vnis_unique_while_held_and_fresh_after_restart(store: StateStore) -> None:
    settings = PodNetSettings(vxlan_min_id=16777213)
    first = PodNet(settings, store)
    try:
        assert await first.allocate_vni("a") == 16777213
        assert await first.allocate_vni("a") == 16777213
        assert await first.allocate_vni("b") == 16777214
    finally:
        await first.close()
    # A restarted daemon (a new PodNet over the same store) continues after the highest held.
    second = PodNet(settings, store)
    try:
        assert await second.allocate_vni("c") == 16777215
        with pytest.raises(VniExhausted):
            await second.allocate_vni("d")
        await store.delete("b")  # the sandbox goes, and its lease with it
        assert await second.allocate_vni("d") == 16777214
        assert sorted(await store.leases(VNI_POOL)) == ["16777213", "16777214", "16777215"]
    finally:
        await second.close()


async def test_concurrent_allocations_never_share(store: StateStore) -> None:
    podnet = PodNet(PodNetSettings(), store)
    try:
        vnis = await asyncio.gather(*(podnet.allocate_vni(f"s{i}") for i in range(40)))
        assert sorted(vnis) == list(range(555000, 555040))
    finally:
        await podnet.close()


def _add_permanent_neighbour(pod: str, ip: str, mac: str) -> None:
    with _netns.iproute(pod) as ipr:
        ipr.neigh("add", dst=ip, lladdr=mac, ifindex=link_index(ipr, "eth0"), state=0x80)


async def test_apf_json_is_caa_schema_with_subnets_and_neighbours(
    topo: Topology, store: StateStore
) -> None:
    settings = PodNetSettings(
        vxlan_port=8472, pod_subnet_cidrs=("10.96.0.0/12",), ext_network_via_podvm=True
    )
    podnet = PodNet(settings, store, host_netns=topo.worker)
    try:
        pod, ip = await asyncio.to_thread(topo.add_pod, "32:b9:59:6b:f0:d5")
        await asyncio.to_thread(_add_permanent_neighbour, pod, "10.128.0.77", "aa:bb:cc:dd:ee:ff")
        tunnel = await podnet.inspect("sb", pod)
        assert tunnel is not None
        config = apf(tunnel)
        decode_apf(config)
        net = config["pod-network"]
        assert net == {
            "podip": f"{ip}/24",
            "pod-hw-addr": "32:b9:59:6b:f0:d5",
            "interface": "eth0",
            "worker-node-ip": "192.168.0.2/16",
            "tunnel-type": "vxlan",
            "routes": [
                {"dst": "0.0.0.0/0", "gw": "10.128.0.1", "dev": "eth0", "protocol": "static"},
                {
                    "dst": "10.128.0.0/24",
                    "gw": "",
                    "dev": "eth0",
                    "protocol": "kernel",
                    "scope": "link",
                },
                {"dst": "10.96.0.0/12", "gw": "10.128.0.1", "dev": "eth0"},
            ],
            "neighbors": [
                {
                    "ip": "10.128.0.77",
                    "hw-addr": "aa:bb:cc:dd:ee:ff",
                    "dev": "eth0",
                    "state": "permanent",
                }
            ],
            "mtu": 1450,
            "index": 0,
            "vxlan-port": 8472,
            "vxlan-id": 555000,
            "dedicated": False,
            "external-net-via-pod-vm": True,
        }
        # Stored and read back, the tunnel is the same.
        assert Tunnel.from_json(tunnel.to_json()) == tunnel
    finally:
        await podnet.close()


async def test_fifty_pods_at_once_then_all_gone(topo: Topology, store: StateStore) -> None:
    count = 50
    podnet = PodNet(PodNetSettings(), store, host_netns=topo.worker)
    peer = topo.peer
    try:
        pods = [await asyncio.to_thread(topo.add_pod) for _ in range(count)]
        vms = [await asyncio.to_thread(topo.add_vm) for _ in range(count)]
        before = await asyncio.to_thread(snapshot, topo.worker)
        inspected = await asyncio.gather(
            *(podnet.inspect(f"sb{i}", pods[i][0]) for i in range(count))
        )
        tunnels = await asyncio.gather(
            *(podnet.setup(t, (vms[i][2],)) for i, t in enumerate(inspected) if t is not None)
        )
        assert len({t.vni for t in tunnels}) == count
        for tunnel, (vm, podns, _ip) in zip(tunnels, vms, strict=True):
            await asyncio.to_thread(podvm_setup, vm, podns, apf(tunnel))
        for (_pod, ip), (_vm, podns, _vip) in zip(pods, vms, strict=True):
            assert await asyncio.to_thread(udp_roundtrip, podns, ip, peer, b"hello") == b"hello"
        # Two pods of the node reach each other through both tunnels.
        (ip_a, podns_b) = pods[0][1], vms[1][1]
        assert await asyncio.to_thread(tcp_roundtrip, vms[0][1], ip_a, podns_b, b"ab" * 5000)
        await asyncio.gather(*(podnet.teardown(t) for t in tunnels))
        await podnet.deleted()
        assert await asyncio.to_thread(snapshot, topo.worker) == before
    finally:
        await podnet.close()


async def test_repair_recreates_missing_parts_and_reports_a_gone_netns(
    topo: Topology, store: StateStore
) -> None:
    podnet = PodNet(PodNetSettings(), store, host_netns=topo.worker)
    peer = topo.peer
    try:
        pod, ip = await asyncio.to_thread(topo.add_pod)
        vm, podns, vm_ip = await asyncio.to_thread(topo.add_vm)
        inspected = await podnet.inspect("sb", pod)
        assert inspected is not None
        tunnel = await podnet.setup(inspected, (vm_ip,))
        await asyncio.to_thread(podvm_setup, vm, podns, apf(tunnel))

        def damage() -> None:
            with _netns.iproute(pod) as ipr:
                ipr.link("del", index=link_index(ipr, "vxlan1"))

        await asyncio.to_thread(damage)
        repaired = await podnet.repair(tunnel)
        assert repaired.state is TunnelState.READY
        assert await asyncio.to_thread(udp_roundtrip, podns, ip, peer, b"again") == b"again"
        await podnet.teardown(repaired)
        await asyncio.to_thread(topo.remove, pod)
        with pytest.raises(NetnsGone):
            await podnet.repair(tunnel)
    finally:
        await podnet.close()


async def test_vnis_of_tunnels_this_daemon_did_not_make_are_skipped(
    topo: Topology, store: StateStore
) -> None:
    """A node taken over from CAA: its pod already has vxlan1 with VNI 555000 on port 4789."""
    pod, _ip = await asyncio.to_thread(topo.add_pod)

    def caa_tunnel() -> None:
        with _netns.iproute(pod) as ipr:
            ipr.link(
                "add",
                ifname="vxlan1",
                kind="vxlan",
                vxlan_id=555000,
                vxlan_group="192.168.1.200",
                vxlan_port=4789,
            )

    await asyncio.to_thread(caa_tunnel)
    podnet = PodNet(PodNetSettings(), store, host_netns=topo.worker)
    try:
        # Other tunnels on this machine (other tests' namespaces) are skipped as well.
        foreign = await podnet.scan()
        assert 555000 in foreign
        new = await podnet.allocate_vni("new")
        assert new > 555000 and new not in foreign
    finally:
        await podnet.close()


async def test_a_failed_setup_leaves_nothing_behind(topo: Topology, store: StateStore) -> None:
    """The worker netns already has a VXLAN device with the VNI (unknown to this daemon, no scan
    ran): the kernel refuses ours, and the NOTRACK element setup had added goes again."""
    pod, _ip = await asyncio.to_thread(topo.add_pod)
    _vm, _podns, vm_ip = await asyncio.to_thread(topo.add_vm)

    def foreign() -> None:
        with _netns.iproute(topo.worker) as ipr:
            ipr.link("add", ifname="other", kind="vxlan", vxlan_id=555000, vxlan_port=4789)

    await asyncio.to_thread(foreign)
    worker, pod_before = await asyncio.gather(
        asyncio.to_thread(snapshot, topo.worker), asyncio.to_thread(snapshot, pod)
    )
    podnet = PodNet(PodNetSettings(), store, host_netns=topo.worker)
    try:
        tunnel = await podnet.inspect("sb", pod)
        assert tunnel is not None
        with pytest.raises(TunnelError, match="VNI 555000 on UDP port 4789 is already used"):
            await podnet.setup(tunnel, (vm_ip,))
        assert await asyncio.to_thread(snapshot, topo.worker) == worker
        assert await asyncio.to_thread(snapshot, pod) == pod_before
    finally:
        await podnet.close()
