"""Tunnels under races: StopVM landing while StartVM builds the tunnel, many sandboxes started
and stopped at once, and the network sweep that removes parts no sandbox holds. After each,
nothing is left: no VXLAN device, ingress qdisc, redirect or NOTRACK element, no record, no
lease."""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path

from adaptor.hypervisor import SandboxManager, StartAborted
from adaptor.podnet import VNI_POOL, PodNet, PodNetSettings, Tunnel, _netns, _tunnel
from adaptor.podnet._sweep import device_tag
from adaptor.state import StateStore
from providers.core.base import Instance, VMSpec
from tests.podnet.leftovers import kernel_leftovers
from tests.podnet.test_manager import ANNOTATIONS, VmPool, close, manager
from tests.podnet.topology import Topology, link_index

TRIALS = 40
CONCURRENT = 50


def own_range() -> PodNetSettings:
    """A VNI range of this test's own: the sweep keeps NOTRACK elements whose VNI a foreign device
    uses, and other tests' tunnels on this machine count as foreign."""
    return PodNetSettings(vxlan_min_id=random.randrange(1_000_000, 16_000_000, 1000))


class SlowPool(VmPool):
    """VMs that take 0-50 ms to appear, so StartVM's steps spread over time."""

    async def create(self, spec: VMSpec) -> Instance:
        await asyncio.sleep(random.uniform(0, 0.05))
        return await super().create(spec)


async def start_then_stop(m: SandboxManager, sandbox: str, netns: str, delay: float) -> None:
    """CreateVM, StartVM, and StopVM `delay` seconds after StartVM began."""
    await m.create_vm(sandbox, ANNOTATIONS, netns)
    start = asyncio.create_task(m.start_vm(sandbox))
    await asyncio.sleep(delay)
    await m.stop_vm(sandbox)
    with contextlib.suppress(StartAborted):
        await start


async def left(store: StateStore, topo: Topology, pods: list[str]) -> dict[str, int]:
    counts = await asyncio.to_thread(kernel_leftovers, topo.worker, pods)
    counts["records"] = len(await store.records())
    counts["leases"] = len(await store.leases(VNI_POOL))
    return counts


async def test_stopvm_racing_startvm_leaves_nothing(topo: Topology, tmp_path: Path) -> None:
    pods = [(await asyncio.to_thread(topo.add_pod))[0] for _ in range(4)]
    vms = [await asyncio.to_thread(topo.add_vm) for _ in range(4)]
    store = await StateStore.open(tmp_path / "state")
    pool = SlowPool()
    m = manager(tmp_path, store, pool, topo.worker)
    rng = random.Random(22)
    dirty = []
    try:
        for trial in range(TRIALS):
            sandbox = f"race{trial}"
            pool.addresses[sandbox] = vms[trial % 4][2]
            await start_then_stop(m, sandbox, pods[trial % 4], rng.uniform(0.02, 0.11))
            counts = await left(store, topo, pods)
            if any(counts.values()):
                dirty.append((trial, counts))
    finally:
        await close(m)
        await store.close()
    assert dirty == []


async def test_many_sandboxes_started_and_stopped_at_once(topo: Topology, tmp_path: Path) -> None:
    pods = [(await asyncio.to_thread(topo.add_pod))[0] for _ in range(CONCURRENT)]
    vms = [await asyncio.to_thread(topo.add_vm) for _ in range(CONCURRENT)]
    store = await StateStore.open(tmp_path / "state")
    pool = SlowPool()
    m = manager(tmp_path, store, pool, topo.worker)
    rng = random.Random(24)
    try:
        for i in range(CONCURRENT):
            pool.addresses[f"sb{i}"] = vms[i][2]
        await asyncio.gather(
            *(start_then_stop(m, f"sb{i}", pods[i], rng.uniform(0, 0.3)) for i in range(CONCURRENT))
        )
        counts = await left(store, topo, pods)
    finally:
        await close(m)
        await store.close()
    assert not any(counts.values()), counts


async def _orphan_foreign_and_live(
    topo: Topology, podnet: PodNet, pods: tuple[str, str, str], remotes: tuple[str, ...]
) -> tuple[Tunnel, Tunnel, Tunnel]:
    """Three tunnels: one of ours whose VNI lease is lost (a killed daemon's), CAA's (no device
    tag, its lease lost too) and a live one with its lease."""
    orphan_pod, caa_pod, live_pod = pods
    tunnels = [await podnet.inspect(f"sb{i}", p) for i, p in enumerate((orphan_pod, caa_pod))]
    orphan, caa = (t for t in tunnels if t is not None)
    tag = device_tag(topo.worker)
    await asyncio.to_thread(_tunnel.setup, topo.worker, orphan_pod, orphan.network, remotes[0], tag)
    await asyncio.to_thread(_tunnel.setup, topo.worker, caa_pod, caa.network, remotes[1], 0)
    for vni in (orphan.vni, caa.vni):
        await podnet.release_vni(vni)  # as lost as a killed daemon's
    live = await podnet.inspect("live", live_pod)
    assert live is not None
    await podnet.setup(live, (remotes[2],))
    return orphan, caa, live


async def test_sweep_removes_untracked_parts_of_ours_and_keeps_foreign_ones(
    topo: Topology, tmp_path: Path
) -> None:
    """What an interrupted older daemon leaves (a tunnel and NOTRACK elements with no record and
    no lease) is removed at start, and its VNI is handed out again; a tunnel that is not ours
    (CAA's: no device tag) and a leased one are kept."""
    (orphan_pod, _), (caa_pod, _), (live_pod, _) = [
        await asyncio.to_thread(topo.add_pod) for _ in range(3)
    ]
    vms = [await asyncio.to_thread(topo.add_vm) for _ in range(3)]
    store = await StateStore.open(tmp_path / "state")
    podnet = PodNet(own_range(), store, host_netns=topo.worker)
    try:
        pods = (orphan_pod, caa_pod, live_pod)
        remotes = tuple(vm[2] for vm in vms)
        orphan, caa, live = await _orphan_foreign_and_live(topo, podnet, pods, remotes)
        before = await asyncio.to_thread(kernel_leftovers, topo.worker, [orphan_pod])
        assert before["vxlan devices"] == 1 and before["NOTRACK elements"] == 3

        async def known() -> list[str]:
            return ["live"]

        # Another tunnel's VNI is skipped, ours is not (other tests' namespaces may add more).
        foreign = await podnet.scan(known)
        assert caa.vni in foreign and orphan.vni not in foreign and live.vni not in foreign
        orphan_left = await asyncio.to_thread(kernel_leftovers, topo.worker, [orphan_pod])
        assert orphan_left == {
            "vxlan devices": 0,
            "ingress qdiscs": 0,
            "u32 redirects": 0,
            "NOTRACK elements": 2,  # the foreign tunnel's and the live one's
        }
        caa_left = await asyncio.to_thread(kernel_leftovers, topo.worker, [caa_pod, live_pod])
        assert caa_left == {
            "vxlan devices": 2,
            "ingress qdiscs": 4,
            "u32 redirects": 4,
            "NOTRACK elements": 2,
        }
        # The orphan's VNI is free again (the cursor starts after the highest held).
        again = await podnet.inspect("next", orphan_pod)
        assert again is not None and again.vni not in (caa.vni, live.vni)
        await podnet.release_vni(again.vni)
        # The live tunnel went on working; the foreign one is still untouched by a second sweep.
        assert (await podnet.sweep()).total == 0
        await podnet.teardown(live.evolve(remote=vms[2][2]))
        await podnet.deleted()
        await asyncio.to_thread(_tunnel.teardown, topo.worker, caa_pod, caa.network, vms[1][2])
    finally:
        await podnet.close()
        await store.close()
    assert not any(
        (await asyncio.to_thread(kernel_leftovers, topo.worker, [orphan_pod, caa_pod])).values()
    )


async def test_a_lease_without_a_sandbox_is_freed_at_start(topo: Topology, tmp_path: Path) -> None:
    """A daemon killed inside CreateVM's netns read holds a lease for a sandbox never
    recorded: the next start frees it."""
    store = await StateStore.open(tmp_path / "state")
    podnet = PodNet(own_range(), store, host_netns=topo.worker)
    try:
        assert await store.acquire_lease(VNI_POOL, "ghost", ["555000"]) == "555000"
        await store.acquire_lease(VNI_POOL, "kept", ["555001"])

        async def known() -> list[str]:
            return ["kept"]

        await podnet.scan(known)
        assert await store.leases(VNI_POOL) == {"555001": "kept"}
    finally:
        await podnet.close()
        await store.close()


async def test_a_repeated_setup_adds_no_second_part(topo: Topology, tmp_path: Path) -> None:
    """Setup twice on the same tunnel (a retried StartVM, a repair): one device, one qdisc and
    one redirect per device, one NOTRACK element; one teardown leaves nothing."""
    pod, _ip = await asyncio.to_thread(topo.add_pod)
    _vm, _podns, vm_ip = await asyncio.to_thread(topo.add_vm)
    store = await StateStore.open(tmp_path / "state")
    podnet = PodNet(own_range(), store, host_netns=topo.worker)
    try:
        inspected = await podnet.inspect("sb", pod)
        assert inspected is not None
        ready = await podnet.setup(inspected, (vm_ip,))
        tag = device_tag(topo.worker)
        await asyncio.to_thread(_tunnel.setup, topo.worker, pod, ready.network, vm_ip, tag, False)
        assert await asyncio.to_thread(kernel_leftovers, topo.worker, [pod]) == {
            "vxlan devices": 1,
            "ingress qdiscs": 2,
            "u32 redirects": 2,
            "NOTRACK elements": 1,
        }
        await podnet.teardown(ready)
        await podnet.deleted()
        assert not any((await asyncio.to_thread(kernel_leftovers, topo.worker, [pod])).values())
    finally:
        await podnet.close()
        await store.close()


async def test_sweep_removes_a_redirect_of_ours_left_pointing_nowhere(
    topo: Topology, tmp_path: Path
) -> None:
    """vxlan1 deleted under a tunnel (by hand, or a half teardown of an older daemon): the pod
    interface's redirect points nowhere and the sweep removes it; a redirect of another shape
    (someone else's, at another prio) pointing nowhere is left alone."""
    (ours, _), (theirs, _) = [await asyncio.to_thread(topo.add_pod) for _ in range(2)]
    vms = [await asyncio.to_thread(topo.add_vm) for _ in range(2)]
    store = await StateStore.open(tmp_path / "state")
    podnet = PodNet(own_range(), store, host_netns=topo.worker)
    try:
        tunnel = await podnet.inspect("sb", ours)
        assert tunnel is not None
        ready = await podnet.setup(tunnel, (vms[0][2],))

        def cut() -> None:
            with _netns.iproute(ours) as ipr:
                ipr.link("del", index=link_index(ipr, "vxlan1"))
            with _netns.iproute(theirs) as ipr:
                ipr.link("add", ifname="gone", kind="veth", peer="gone-peer")
                eth, gone = link_index(ipr, "eth0"), link_index(ipr, "gone")
                ipr.tc("add", "ingress", eth, "ffff:")
                ipr.tc(
                    "add-filter",
                    "u32",
                    eth,
                    parent=0xFFFF0000,
                    prio=5,
                    protocol=3,
                    target=0x10001,
                    keys=["0x0/0x0+0"],
                    action={
                        "kind": "mirred",
                        "direction": "egress",
                        "action": "redirect",
                        "ifindex": gone,
                    },
                )
                ipr.link("del", index=gone)

        await asyncio.to_thread(cut)
        await podnet.release_vni(ready.vni)  # nothing holds it now
        removed = await podnet.sweep()
        assert removed.redirects == 1 and removed.devices == 0 and removed.rules == 1
        assert not any((await asyncio.to_thread(kernel_leftovers, topo.worker, [ours])).values())
        kept = await asyncio.to_thread(kernel_leftovers, topo.worker, [theirs])
        assert kept["ingress qdiscs"] == 1 and kept["u32 redirects"] == 1
    finally:
        await podnet.close()
        await store.close()
