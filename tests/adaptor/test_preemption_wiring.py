"""The daemon watches running sandboxes for lost VMs when its provider can inspect them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from adaptor.hypervisor.preemption import DroppedConnections, PreemptionWatcher
from adaptor.hypervisor.sandboxes import SandboxManager
from adaptor.node.daemon import Daemon
from adaptor.state import SandboxRecord, SandboxState
from providers.core.base import Instance
from providers.core.markets import Inspectable, VMCondition
from tests.adaptor.daemon_proc import daemon_settings
from tests.adaptor.fakes import FakeProvider, FakeProxies

ANNOTATIONS = {"io.kubernetes.cri.sandbox-name": "p", "io.kubernetes.cri.sandbox-namespace": "n"}


class InspectableFake(FakeProvider):
    """A fake cloud where a VM can be taken away behind the adaptor's back."""

    def __init__(self) -> None:
        super().__init__()
        self.purged: list[str] = []

    async def inspect(self, instance_id: str) -> VMCondition:
        if instance_id in self.vms:
            return VMCondition(True)
        return VMCondition(False, f"{instance_id} was preempted")

    async def purge(self, instance: Instance) -> None:
        self.purged.append(instance.id)
        await self.delete(instance.id)


async def _started(manager: SandboxManager, sandbox: str) -> SandboxRecord:
    """Create and start `sandbox`; its record once started."""
    await manager.create_vm(sandbox, ANNOTATIONS)
    await manager.start_vm(sandbox)
    record = await manager.store.get(sandbox)
    assert record is not None
    return record


async def test_sweeps_find_a_lost_vm_and_stop_vm_then_succeeds(root: Path) -> None:
    provider = InspectableFake()
    assert isinstance(provider, Inspectable)
    settings = daemon_settings(root, preemption_check_interval_seconds=0.05)
    daemon = Daemon(settings, provider=provider, proxy_factory=FakeProxies())
    await daemon.start()
    try:
        assert daemon.manager is not None and daemon.watcher is not None
        record = await _started(daemon.manager, "sb1")
        assert record.instance is not None
        provider.vms.clear()  # the cloud takes the VM
        async with asyncio.timeout(30):  # the watcher's own sweeps find it (bounded wait)
            while record.state is not SandboxState.PREEMPTED:
                await asyncio.sleep(0.02)
                record = await daemon.manager.store.get("sb1")
                assert record is not None
        assert "was preempted" in record.reason and provider.purged == [record.instance.id]
        await daemon.manager.stop_vm("sb1")
        assert await daemon.manager.store.get("sb1") is None
    finally:
        await daemon.close()
    assert daemon.watcher is None


async def test_no_watcher_for_a_provider_that_cannot_inspect(root: Path) -> None:
    daemon = Daemon(daemon_settings(root), provider=FakeProvider(), proxy_factory=FakeProxies())
    await daemon.start()
    try:
        assert daemon.watcher is None
    finally:
        await daemon.close()


async def test_concurrent_checks_count_a_preemption_once(root: Path) -> None:
    provider = InspectableFake()
    daemon = Daemon(daemon_settings(root), provider=provider, proxy_factory=FakeProxies())
    await daemon.start()
    try:
        assert daemon.manager is not None and daemon.watcher is not None
        record = await _started(daemon.manager, "sb1")
        provider.vms.clear()
        found = await asyncio.gather(*(daemon.watcher.check(record) for _ in range(3)))
        assert sorted(found) == [False, False, True]
        assert len(provider.purged) == 1
        marked = await daemon.manager.store.get("sb1")
        assert marked is not None and marked.state is SandboxState.PREEMPTED
        assert "disks and NICs deleted" in marked.reason
    finally:
        await daemon.close()


async def test_a_dropped_connection_is_checked_without_any_sweep(root: Path) -> None:
    provider = InspectableFake()
    # no sweeps (interval 0): only the dropped connection can start the check
    daemon = Daemon(daemon_settings(root), provider=provider, proxy_factory=FakeProxies())
    await daemon.start()
    dropped = DroppedConnections()
    watcher: PreemptionWatcher | None = None
    try:
        assert daemon.manager is not None
        record = await _started(daemon.manager, "sb1")
        provider.vms.clear()
        dropped.tell("sb1")  # told before the watcher runs: still checked once it does
        watcher = PreemptionWatcher(daemon.manager, provider, 0, dropped=dropped)
        watcher.start()
        async with asyncio.timeout(30):  # bounded wait for the check the drop started
            while record.state is not SandboxState.PREEMPTED:
                await asyncio.sleep(0.02)
                found = await daemon.manager.store.get("sb1")
                assert found is not None
                record = found
        assert provider.purged == [record.instance.id if record.instance else ""]
    finally:
        if watcher is not None:
            await watcher.stop()
        await daemon.close()
