"""What a restart or a full disk leaves owed, in process with a fake provider and proxies: a
recovered sandbox whose shim never comes back is abandoned after the grace, the shutdown drain
waits for the StopVMs of the shims it disconnects, and a StopVM whose writes the store refuses
still deletes the VM, says what is owed, and the owed writes land once the store takes them."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adaptor.hypervisor import ManagerConfig, SandboxManager, SandboxTable
from adaptor.hypervisor.sandboxes import ShuttingDown
from adaptor.planning.placement import Placement
from adaptor.runtime import metrics
from adaptor.state import SandboxRecord, SandboxState, StateError, StateStore
from providers.core.errors import ProviderError
from tests.adaptor.fakes import FakeProvider, FakeProxies
from tests.adaptor.test_sandboxes import ANNOTATIONS

GRACE = 0.3


class RefusingStore(StateStore):
    """A state store whose writes fail while `full` is set, as on a full disk (reads work)."""

    full = False

    async def put(self, record: SandboxRecord) -> SandboxRecord:
        self._refuse()
        return await super().put(record)

    async def delete(self, sandbox_id: str) -> None:
        self._refuse()
        await super().delete(sandbox_id)

    async def set_state(self, sandbox_id: str, state: SandboxState, reason: str) -> bool:
        self._refuse()
        return await super().set_state(sandbox_id, state, reason)

    def _refuse(self) -> None:
        if self.full:
            raise StateError(f"state database {self.path}: database or disk is full")


class Node:
    """One node's store, provider and proxies; `manager()` is a daemon's (re)start."""

    def __init__(self, root: Path, store: RefusingStore) -> None:
        self.root = root
        self.store = store
        self.provider = FakeProvider()
        self.proxies = FakeProxies()
        self.abandoned: list[tuple[str, str]] = []
        self.managers: list[SandboxManager] = []

    def manager(self, grace: float = GRACE) -> SandboxManager:
        manager = SandboxManager(
            SandboxTable(
                ManagerConfig(
                    pods_dir=self.root / "pods",
                    proxy_timeout_seconds=1,
                    delete_retry_seconds=0.02,
                    delete_retry_max_seconds=0.05,
                    reconnect_grace_seconds=grace,
                ),
                self.store,
                self.provider,
                Placement(),
                self.proxies,
                on_abandoned=lambda record, why: self.abandoned.append((record.id, why)),
            )
        )
        self.managers.append(manager)
        return manager

    async def running(self, manager: SandboxManager, *ids: str) -> None:
        for sandbox_id in ids:
            await manager.create_vm(sandbox_id, ANNOTATIONS)
            await manager.start_vm(sandbox_id)


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as root:
        store = await RefusingStore.open(Path(root) / "state")
        assert isinstance(store, RefusingStore)
        environment = Node(Path(root), store)
        yield environment
        store.full = False
        for manager in environment.managers:
            await manager.close(0)
        await store.close()


def abandoned_total() -> float:
    value = metrics.REGISTRY.get_sample_value(
        "peerpods_sandboxes_abandoned_total", {"provider": "fake"}
    )
    return value or 0.0


async def until(check: Any, seconds: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_shim_that_never_comes_back_is_abandoned_after_the_grace(node: Node) -> None:
    first = node.manager()
    await node.running(first, "gone", "back")
    await first.close(0)  # kill -9 or SIGTERM: records and VMs stay
    before = abandoned_total()

    restarted = node.manager()
    await restarted.recover()
    back = next(p for p in node.proxies.made[2:] if p.sandbox_id == "back")
    back.shim_connects()  # this shim reconnects (runtime-rs may); Kata's Go shim never does
    await asyncio.sleep(GRACE / 3)
    assert await node.store.get("gone") is not None, "abandoned before the grace"

    async def settled() -> bool:
        return await node.store.get("gone") is None

    await until(settled)
    assert sorted(node.provider.vms) == ["vm-back"]
    assert "vm-gone" in node.provider.deleted
    record = await node.store.get("back")
    assert record is not None and record.state is SandboxState.RUNNING
    assert abandoned_total() == before + 1
    assert [sandbox for sandbox, _ in node.abandoned] == ["gone"]
    assert "did not connect again within 0.3s" in node.abandoned[0][1]
    assert node.abandoned[0][1].startswith("abandoned: ")


async def test_a_zero_grace_waits_forever(node: Node) -> None:
    first = node.manager()
    await node.running(first, "kept")
    await first.close(0)
    restarted = node.manager(grace=0)
    await restarted.recover()
    await asyncio.sleep(GRACE * 2)
    record = await node.store.get("kept")
    assert record is not None and record.state is SandboxState.RUNNING
    assert node.abandoned == [] and "vm-kept" in node.provider.vms


async def test_shutdown_drain_takes_the_stopvms_of_disconnected_shims(node: Node) -> None:
    manager = node.manager()
    await node.running(manager, "a", "b", "idle")
    for proxy in node.proxies.made:
        if proxy.sandbox_id != "idle":
            proxy.shim_connects()
    held = await manager.release_agent_sockets()
    assert held == {"a", "b"}
    assert all("stop" in p.calls for p in node.proxies.made)
    with pytest.raises(ShuttingDown):
        await manager.create_vm("new", ANNOTATIONS)

    async def shim_stops(sandbox_id: str) -> None:
        await asyncio.sleep(0.1)  # the Go shim's StopVM comes about 0.1 s after the close
        await manager.stop_vm(sandbox_id)

    stops = [asyncio.create_task(shim_stops(s)) for s in ("a", "b")]
    assert await manager.drain(held, 5) == set()
    await asyncio.gather(*stops)
    assert sorted(node.provider.vms) == ["vm-idle"]
    assert [r.id for r in await node.store.records()] == ["idle"]
    # a shim that never sends its StopVM: the drain ends at its bound
    assert await manager.drain({"idle"}, 0.1) == {"idle"}


async def test_stopvm_on_a_full_store_deletes_the_vm_and_says_what_is_owed(node: Node) -> None:
    manager = node.manager()
    await node.running(manager, "sb")
    node.store.full = True
    with pytest.raises(ProviderError, match=r"VM is deleted.*disk is full.*removed once it can"):
        await manager.stop_vm("sb")
    assert node.provider.vms == {} and node.provider.deleted == ["vm-sb"]
    assert manager.owed() == {"sb": "record removal"}
    record = await node.store.get("sb")
    assert record is not None and record.state is SandboxState.RUNNING  # nothing could be written
    node.store.full = False

    async def forgotten() -> bool:
        return await node.store.get("sb") is None

    await until(forgotten)
    assert manager.owed() == {}


async def test_a_delete_that_fails_on_a_full_store_is_answered_and_retried(node: Node) -> None:
    manager = node.manager()
    await node.running(manager, "sb")
    node.store.full = True
    node.provider.fail_delete = True
    with pytest.raises(ProviderError, match="cloud said no; the delete is retried"):
        await manager.stop_vm("sb")
    assert "vm-sb" in node.provider.vms
    node.provider.fail_delete = False
    await asyncio.sleep(0.2)
    assert "vm-sb" not in node.provider.vms  # deleted though the store is still full
    node.store.full = False

    async def forgotten() -> bool:
        return await node.store.get("sb") is None and not manager.busy("sb")

    await until(forgotten)


async def test_owed_stopping_state_reaches_the_store_for_the_reaper(node: Node) -> None:
    """A teardown cut short while the store refused writes: once the store takes writes again,
    the record reads `stopping` (the reaper's), not `running`."""
    manager = node.manager()
    await node.running(manager, "sb")
    node.store.full = True
    node.provider.fail_delete = True
    with pytest.raises(ProviderError):
        await manager.stop_vm("sb")
    stop = manager.table.stops["sb"]
    assert stop.task is not None
    stop.task.cancel()  # the teardown ends without its VM deleted (as at shutdown)
    await asyncio.gather(stop.task, return_exceptions=True)
    assert manager.owed() == {"sb": "stopping"}
    node.store.full = False

    async def visible() -> bool:
        record = await node.store.get("sb")
        return record is not None and record.state is SandboxState.STOPPING

    await until(visible)
    assert manager.owed() == {}


async def test_created_and_failed_sandboxes_that_no_call_names_are_abandoned(node: Node) -> None:
    """Found created (CreateVM only) or caught in StartVM at start: the shim's next step is a
    hypervisor call; with none within the grace, VM, tunnel and record go."""
    first = node.manager()
    await first.create_vm("created", ANNOTATIONS)
    await first.create_vm("called", ANNOTATIONS)
    await node.running(first, "midstart")
    await node.store.set_state("midstart", SandboxState.STARTING, "")
    await first.close(0)

    restarted = node.manager()
    await restarted.recover()
    record = await node.store.get("midstart")
    assert record is not None and record.state is SandboxState.FAILED
    await restarted.start_vm("called")  # this shim is still there

    async def settled() -> bool:
        return [r.id for r in await node.store.records()] == ["called"]

    await until(settled)
    assert "vm-midstart" in node.provider.deleted
    assert sorted(s for s, _ in node.abandoned) == ["created", "midstart"]
    assert all("no hypervisor call for it within 0.3s" in why for _, why in node.abandoned)
