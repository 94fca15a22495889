"""StopVM's tunnel teardown in two steps: the pod's traffic is cut off (the pod interface's
redirect gone, vxlan1 down) before `teardown` returns, and vxlan1's deletion, which the kernel
holds for an RCU grace period, then the NOTRACK element's finish in a task of PodNet's. Its VNI is
not handed out before the device is gone, StopVM forgets the sandbox (and its lease) only after
it, `close` waits for it, and a daemon killed in between leaves what the next start's sweep
removes.

The deletion is held at a gate (`GatedDelete`) so each of these moments can be looked at."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from adaptor.hypervisor.pod_network import PodNetworkHook
from adaptor.podnet import (
    VNI_POOL,
    PodNet,
    PodNetSettings,
    SandboxPodNetwork,
    Tunnel,
    VniExhausted,
    _netns,
    _nl,
    _service,
    _tunnel,
)
from adaptor.podnet._model import MAX_VNI, VXLAN_DEVICE
from adaptor.state import StateStore
from tests.podnet.leftovers import kernel_leftovers
from tests.podnet.test_manager import ANNOTATIONS, VmPool, close, manager
from tests.podnet.test_races import own_range
from tests.podnet.topology import Topology


class GatedDelete:
    """`_tunnel.delete` held until `open()`: `entered` is set once a deletion waits."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.finished = threading.Event()
        self.real = _tunnel.delete

    def __call__(self, doomed: _tunnel.Doomed) -> None:
        self.entered.set()
        self.gate.wait(30)
        self.real(doomed)
        self.finished.set()

    def open(self) -> None:
        self.gate.set()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[StateStore]:
    store = await StateStore.open(tmp_path / "state")
    yield store
    await store.close()


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> Iterator[GatedDelete]:
    gate = GatedDelete()
    monkeypatch.setattr(_tunnel, "delete", gate)
    yield gate
    gate.open()


def vxlan_state(pod: str) -> tuple[bool, bool] | None:
    """(up, redirect on the pod interface) of the pod's vxlan1; None when it is gone."""
    with _netns.entered(pod):
        sock = _nl.Netlink(_nl.NETLINK_ROUTE)
    with sock:
        try:
            (payload,) = sock.get(_nl.link_get(VXLAN_DEVICE))
        except OSError:
            return None
        up = bool(int.from_bytes(payload[8:12], "little") & _nl.IFF_UP)
        eth = [i for i, kind in map(_nl.tc_kind, sock.get(_nl.qdiscs_get())) if kind == "ingress"]
        vxlan = _nl.vxlan_of(payload)
        assert vxlan is not None
        return up, any(i != vxlan.index for i in eth)


async def test_traffic_is_cut_before_teardown_returns_and_the_vni_waits_for_the_device(
    topo: Topology, store: StateStore, gated: GatedDelete
) -> None:
    """A pool of one VNI: while the cut-off device is being deleted, its VNI is neither handed
    out (its lease already went, as with the record at StopVM) nor swept; `close` waits for the
    deletion, and nothing is left."""
    pod, _ip = await asyncio.to_thread(topo.add_pod)
    _vm, _podns, vm_ip = await asyncio.to_thread(topo.add_vm)
    podnet = PodNet(PodNetSettings(vxlan_min_id=MAX_VNI), store, host_netns=topo.worker)
    closed = False
    try:
        inspected = await podnet.inspect("sb0", pod)
        assert inspected is not None and inspected.vni == MAX_VNI
        tunnel = await podnet.setup(inspected, (vm_ip,))
        assert await asyncio.to_thread(vxlan_state, pod) == (True, True)
        await podnet.teardown(tunnel)
        await asyncio.to_thread(gated.entered.wait, 30)
        # Cut off: vxlan1 is down and the pod interface has no redirect; the rest is to go.
        assert await asyncio.to_thread(vxlan_state, pod) == (False, False)
        counts = await asyncio.to_thread(kernel_leftovers, topo.worker, [pod])
        assert counts == {
            "vxlan devices": 1,
            "ingress qdiscs": 1,
            "u32 redirects": 1,
            "NOTRACK elements": 1,
        }
        await podnet.release_vni(tunnel.vni)
        with pytest.raises(VniExhausted):
            await podnet.inspect("sb1", pod)
        assert await store.leases(VNI_POOL) == {}
        assert (await podnet.sweep()).total == 0
        gated.open()
        await podnet.close()
        closed = True
        assert not any((await asyncio.to_thread(kernel_leftovers, topo.worker, [pod])).values())
    finally:
        if not closed:
            gated.open()
            await podnet.close()
    # Once the device is gone, the VNI is free again.
    again = PodNet(PodNetSettings(vxlan_min_id=MAX_VNI), store, host_netns=topo.worker)
    try:
        assert await again.allocate_vni("sb1") == MAX_VNI
    finally:
        await again.close()


async def test_a_setup_on_the_tunnel_waits_for_its_deletion(
    topo: Topology, store: StateStore, gated: GatedDelete
) -> None:
    """A StartVM again on the same sandbox (its VNI kept) does not find the doomed vxlan1 and
    reuse it: it waits for the deletion, then builds a new one."""
    pod, _ip = await asyncio.to_thread(topo.add_pod)
    _vm, _podns, vm_ip = await asyncio.to_thread(topo.add_vm)
    podnet = PodNet(own_range(), store, host_netns=topo.worker)
    try:
        inspected = await podnet.inspect("sb0", pod)
        assert inspected is not None
        tunnel = await podnet.setup(inspected, (vm_ip,))
        await podnet.teardown(tunnel)
        await asyncio.to_thread(gated.entered.wait, 30)
        again = asyncio.create_task(podnet.setup(tunnel, (vm_ip,)))
        await asyncio.sleep(0)
        assert not again.done()
        gated.open()
        await again
        await podnet.deleted()
        # The new vxlan1 is up and redirected: the deletion took the old one only.
        assert await asyncio.to_thread(vxlan_state, pod) == (True, True)
        await podnet.teardown(tunnel)
        await podnet.deleted()
        assert not any((await asyncio.to_thread(kernel_leftovers, topo.worker, [pod])).values())
    finally:
        gated.open()
        await podnet.close()


async def test_stopvm_forgets_the_sandbox_only_once_the_device_is_gone(
    topo: Topology, tmp_path: Path, gated: GatedDelete, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the sandbox manager: while vxlan1 is being deleted, StopVM has not returned and
    the record and its VNI lease are still there; the record goes once the device has."""
    pod, _ip = await asyncio.to_thread(topo.add_pod)
    vm = await asyncio.to_thread(topo.add_vm)
    store = await StateStore.open(tmp_path / "other")
    forgotten: list[bool] = []
    delete = store.delete

    async def delete_record(sandbox_id: str) -> None:
        forgotten.append(gated.finished.is_set())
        await delete(sandbox_id)

    monkeypatch.setattr(store, "delete", delete_record)
    pool = VmPool()
    pool.addresses["sb0"] = vm[2]
    m = manager(tmp_path, store, pool, topo.worker)
    try:
        await m.create_vm("sb0", ANNOTATIONS, pod)
        await m.start_vm("sb0")
        stop = asyncio.create_task(m.stop_vm("sb0"))
        await asyncio.to_thread(gated.entered.wait, 30)
        assert not stop.done()
        assert await store.get("sb0") is not None
        assert list((await store.leases(VNI_POOL)).values()) == ["sb0"]
        gated.open()
        await stop
        assert forgotten == [True]
        assert await store.get("sb0") is None
        assert await store.leases(VNI_POOL) == {}
        assert not any((await asyncio.to_thread(kernel_leftovers, topo.worker, [pod])).values())
    finally:
        gated.open()
        await close(m)
        await store.close()


async def test_a_daemon_killed_between_cut_and_deletion_leaves_what_the_sweep_removes(
    topo: Topology, tmp_path: Path
) -> None:
    """The cut done and the device not yet deleted when the daemon dies (its record, and with
    it the lease, already gone): the next start's sweep removes the device and the rules."""
    pod, _ip = await asyncio.to_thread(topo.add_pod)
    _vm, _podns, vm_ip = await asyncio.to_thread(topo.add_vm)
    store = await StateStore.open(tmp_path / "other")
    podnet = PodNet(own_range(), store, host_netns=topo.worker)
    try:
        inspected = await podnet.inspect("sb0", pod)
        assert inspected is not None
        tunnel = await podnet.setup(inspected, (vm_ip,))
    finally:
        await podnet.close()
    doomed = await asyncio.to_thread(_tunnel.cut, topo.worker, pod, tunnel.network, vm_ip)
    doomed.close()  # killed: the deletion never comes
    await store.release_lease(VNI_POOL, str(tunnel.vni))
    left = await asyncio.to_thread(kernel_leftovers, topo.worker, [pod])
    assert (left["vxlan devices"], left["NOTRACK elements"]) == (1, 1)
    restarted = PodNet(own_range(), store, host_netns=topo.worker)
    try:

        async def known() -> list[str]:
            return []

        await restarted.scan(known)
        assert not any((await asyncio.to_thread(kernel_leftovers, topo.worker, [pod])).values())
    finally:
        await restarted.close()
        await store.close()


class RefusedDelete:
    """`_nl.link_delete` while `armed`: each RTM_DELLINK is sent for the netns's loopback
    instead, which the kernel refuses (EOPNOTSUPP: it has no rtnl_link_ops), so the deletion of
    the cut-off vxlan1 fails for real; `attempts` counts the refusals."""

    LOOPBACK = 1  # the ifindex of `lo` in every network namespace

    def __init__(self) -> None:
        self.armed = True
        self.attempts = 0
        self.real = _nl.link_delete

    def __call__(self, index: int) -> _nl.Message:
        if not self.armed:
            return self.real(index)
        self.attempts += 1
        return self.real(self.LOOPBACK)


@pytest.fixture
def refused(monkeypatch: pytest.MonkeyPatch) -> RefusedDelete:
    refusal = RefusedDelete()
    monkeypatch.setattr(_nl, "link_delete", refusal)
    monkeypatch.setattr(_service, "DELETE_BACKOFF_SECONDS", 0.0)
    return refusal


def deletion_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == _service.__name__ and r.levelno == logging.ERROR
    ]


async def test_a_deletion_the_kernel_refuses_is_retried_logged_and_left_to_the_sweep(
    topo: Topology,
    store: StateStore,
    refused: RefusedDelete,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pool of one VNI: vxlan1's deletion refused every time is tried once and retried
    DELETE_ATTEMPTS times, then logged (VNI and pod netns named) without raising to the waiter;
    the device and its rules stay and so does the VNI out of use, lease gone or not, until a
    sweep removes them (one the kernel refuses too does not free it); the VNI is then free."""
    caplog.set_level(logging.WARNING, logger=_service.__name__)
    pod, _ip = await asyncio.to_thread(topo.add_pod)
    _vm, _podns, vm_ip = await asyncio.to_thread(topo.add_vm)
    podnet = PodNet(PodNetSettings(vxlan_min_id=MAX_VNI), store, host_netns=topo.worker)
    try:
        inspected = await podnet.inspect("sb0", pod)
        assert inspected is not None
        tunnel = await podnet.setup(inspected, (vm_ip,))
        await podnet.teardown(tunnel)
        await podnet.deleted(tunnel.vni)  # ended, and raises nothing
        assert refused.attempts == 1 + _service.DELETE_ATTEMPTS
        (error,) = deletion_errors(caplog)
        assert f"VNI {MAX_VNI}" in error and pod in error and "sweep" in error
        left = await asyncio.to_thread(kernel_leftovers, topo.worker, [pod])
        assert (left["vxlan devices"], left["NOTRACK elements"]) == (1, 1)
        assert await asyncio.to_thread(vxlan_state, pod) == (False, False)
        await podnet.release_vni(tunnel.vni)  # as StopVM does once the deletion has ended
        with pytest.raises(VniExhausted):
            await podnet.allocate_vni("sb1")
        # A sweep the kernel refuses the device as well leaves the VNI out of use.
        assert (await podnet.sweep()).devices == 0
        assert (await asyncio.to_thread(kernel_leftovers, topo.worker, [pod]))["vxlan devices"]
        with pytest.raises(VniExhausted):
            await podnet.allocate_vni("sb1")
        refused.armed = False
        removed = await podnet.sweep()
        assert removed.devices == 1
        assert not any((await asyncio.to_thread(kernel_leftovers, topo.worker, [pod])).values())
        assert await podnet.allocate_vni("sb1") == MAX_VNI
    finally:
        refused.armed = False
        await podnet.close()


async def test_close_waits_for_a_refused_deletion_and_its_retries(
    topo: Topology,
    tmp_path: Path,
    refused: RefusedDelete,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`close` right after a teardown whose deletion the kernel refuses returns once every
    retry has been refused and the failure logged (it neither hangs nor drops the retries);
    the next start's sweep removes what is left."""
    caplog.set_level(logging.WARNING, logger=_service.__name__)
    pod, _ip = await asyncio.to_thread(topo.add_pod)
    _vm, _podns, vm_ip = await asyncio.to_thread(topo.add_vm)
    store = await StateStore.open(tmp_path / "other")
    podnet = PodNet(own_range(), store, host_netns=topo.worker)
    closed = False
    try:
        inspected = await podnet.inspect("sb0", pod)
        assert inspected is not None
        tunnel = await podnet.setup(inspected, (vm_ip,))
        await podnet.teardown(tunnel)
        # A bound that only a hang reaches: the retries take no backoff here.
        await asyncio.wait_for(podnet.close(), 30)
        closed = True
        assert refused.attempts == 1 + _service.DELETE_ATTEMPTS
        (error,) = deletion_errors(caplog)
        assert f"VNI {tunnel.vni}" in error
        await store.release_lease(VNI_POOL, str(tunnel.vni))
        refused.armed = False
        restarted = PodNet(own_range(), store, host_netns=topo.worker)
        try:

            async def known() -> list[str]:
                return []

            await restarted.scan(known)
            left = await asyncio.to_thread(kernel_leftovers, topo.worker, [pod])
            assert not any(left.values())
        finally:
            await restarted.close()
    finally:
        refused.armed = False
        if not closed:
            await podnet.close()
        await store.close()


async def test_stopvm_with_a_refused_deletion_returns_and_forgets_the_sandbox(
    topo: Topology,
    tmp_path: Path,
    refused: RefusedDelete,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through the sandbox manager: the pod's traffic was cut, so StopVM succeeds (a failure
    after the cut is the sweep's, docs/networking.md), after the retries, with the failure
    logged; the record and its lease go, and the VNI stays out of use until the sweep."""
    caplog.set_level(logging.WARNING, logger=_service.__name__)
    pod, _ip = await asyncio.to_thread(topo.add_pod)
    vm = await asyncio.to_thread(topo.add_vm)
    store = await StateStore.open(tmp_path / "other")
    pool = VmPool()
    pool.addresses["sb0"] = vm[2]
    m = manager(tmp_path, store, pool, topo.worker)
    (hook,) = (h for h in m.table.hooks.hooks if isinstance(h, PodNetworkHook))
    assert isinstance(hook.tunnels, SandboxPodNetwork)
    podnet = hook.tunnels.podnet
    try:
        await m.create_vm("sb0", ANNOTATIONS, pod)
        await m.start_vm("sb0")
        record = await store.get("sb0")
        assert record is not None
        vni = Tunnel.from_json(record.pod_network).vni
        await m.stop_vm("sb0")
        assert refused.attempts == 1 + _service.DELETE_ATTEMPTS
        assert pool.deleted == ["vm-sb0"]
        assert await store.get("sb0") is None
        assert await store.leases(VNI_POOL) == {}
        (error,) = deletion_errors(caplog)
        assert f"VNI {vni}" in error
        left = await asyncio.to_thread(kernel_leftovers, topo.worker, [pod])
        assert (left["vxlan devices"], left["NOTRACK elements"]) == (1, 1)
        refused.armed = False
        assert (await podnet.sweep()).devices == 1
        # (The rules' removal is the tests' above: this manager's VNI range is the default one,
        # which other tests' devices may use, and the sweep keeps rules a foreign device uses.)
        left = await asyncio.to_thread(kernel_leftovers, topo.worker, [pod])
        assert left["vxlan devices"] == 0
    finally:
        refused.armed = False
        await close(m)
        await store.close()
