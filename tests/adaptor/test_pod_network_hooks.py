"""The sandbox manager's pod network hooks: a failed teardown is retried and visible, never
dropped; settings refuse bad networking flags. (The real kernel path is tests/podnet.)"""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adaptor.hypervisor import ManagerConfig, SandboxManager, SandboxTable
from adaptor.hypervisor.pod_network import PodNetworkHook
from adaptor.node.settings import ServeSettings
from adaptor.planning.placement import Placement
from adaptor.podnet import PodNetError
from adaptor.state import SandboxRecord, SandboxState, StateStore
from providers.core.base import Instance
from providers.core.errors import InvalidRequest, PeerpodsError
from tests.adaptor.fakes import FakeProvider, FakeProxies
from tests.adaptor.test_sandboxes import ANNOTATIONS


def tunnel(sandbox_id: str, state: str) -> str:
    """A stand-in for adaptor.podnet.Tunnel JSON (the manager only stores it)."""
    return json.dumps({"sandbox": sandbox_id, "state": state})


class Tunnels:
    """A hook recording calls; `stop` fails while `failures` is positive."""

    def __init__(self) -> None:
        self.failures = 0
        self.calls: list[str] = []

    async def created(self, sandbox_id: str, netns: str) -> str:
        self.calls.append(f"created {netns}")
        return tunnel(sandbox_id, "inspected") if netns else ""

    async def forget(self, sandbox_id: str, pod_network: str) -> None:
        self.calls.append("forget")

    async def prepare(self, record: SandboxRecord, instance: Instance) -> str:
        return tunnel(record.id, "setting-up")

    async def started(self, record: SandboxRecord, instance: Instance) -> str:
        self.calls.append(f"started {instance.addresses[0]}")
        return tunnel(record.id, "ready")

    async def stop(self, record: SandboxRecord) -> str:
        self.calls.append("stop")
        if self.failures > 0:
            self.failures -= 1
            raise PodNetError("pod network teardown failed: nf_tables said no")
        return ""

    async def removed(self, sandbox_id: str) -> None:
        """Nothing to wait for: `stop` here leaves no deletion running."""

    async def recovered(self, record: SandboxRecord) -> str:
        self.calls.append("recovered")
        if json.loads(record.pod_network)["state"] == "teardown":
            return await self.stop(record)
        return record.pod_network

    @staticmethod
    def failed_teardown(record: SandboxRecord, error: str) -> str:
        return tunnel(record.id, "teardown")


@pytest.fixture
async def parts() -> AsyncIterator[tuple[Path, StateStore]]:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as root:
        store = await StateStore.open(Path(root) / "state")
        yield Path(root), store
        await store.close()


def pod_network_manager(
    config: ManagerConfig, store: StateStore, provider: Any, proxies: Any, tunnels: Any
) -> SandboxManager:
    """A manager with the pod network hook over `tunnels` and no selection (these tests need
    none)."""
    hooks = (PodNetworkHook(tunnels),)
    return SandboxManager(SandboxTable(config, store, provider, Placement(), proxies, hooks=hooks))


def manager(
    root: Path, store: StateStore, tunnels: Tunnels, provider: FakeProvider
) -> SandboxManager:
    config = ManagerConfig(pods_dir=root / "pods", proxy_timeout_seconds=1)
    return pod_network_manager(config, store, provider, FakeProxies(), tunnels)


async def test_failed_teardown_is_recorded_and_retried(parts: tuple[Path, StateStore]) -> None:
    root, store = parts
    tunnels, provider = Tunnels(), FakeProvider()
    m = manager(root, store, tunnels, provider)
    try:
        await m.create_vm("sb", ANNOTATIONS, "/var/run/netns/cni-1")
        await m.start_vm("sb")
        record = await store.get("sb")
        assert record is not None and record.pod_network == tunnel("sb", "ready")
        tunnels.failures = 1
        with pytest.raises(PeerpodsError, match=r"teardown failed.*retry StopVM"):
            await m.stop_vm("sb")
        record = await store.get("sb")
        assert record is not None and record.state is SandboxState.FAILED
        assert "nf_tables said no" in record.reason
        assert record.pod_network == tunnel("sb", "teardown")
        assert provider.deleted == ["vm-sb"]  # the VM does not wait for the tunnel
        await m.stop_vm("sb")  # the retry
        assert await store.get("sb") is None
    finally:
        await m.close(0)


async def test_restart_retries_an_owed_teardown(parts: tuple[Path, StateStore]) -> None:
    root, store = parts
    tunnels, provider = Tunnels(), FakeProvider()
    first = manager(root, store, tunnels, provider)
    await first.create_vm("sb", ANNOTATIONS, "/var/run/netns/cni-1")
    await first.start_vm("sb")
    tunnels.failures = 1
    with pytest.raises(PeerpodsError):
        await first.stop_vm("sb")
    await first.close(0)
    second = manager(root, store, tunnels, provider)
    try:
        await second.recover()
        record = await store.get("sb")
        assert record is not None and record.pod_network == ""
    finally:
        await second.close(0)


async def test_no_netns_means_no_tunnel_calls(parts: tuple[Path, StateStore]) -> None:
    root, store = parts
    tunnels = Tunnels()
    m = manager(root, store, tunnels, FakeProvider())
    try:
        await m.create_vm("sb", ANNOTATIONS, "")
        await m.start_vm("sb")
        await m.stop_vm("sb")
        assert tunnels.calls == ["created "]
    finally:
        await m.close(0)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("vxlan_min_id", 0, "vxlan_min_id"),
        ("vxlan_min_id", 1 << 24, "vxlan_min_id"),
        ("vxlan_port", 70000, "vxlan_port"),
        ("pod_subnet_cidrs", "10.96.0.0/12,nope", "'nope' is not an IPv4 CIDR"),
    ],
)
def test_bad_networking_flags_are_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        ServeSettings.build(**{field: value})


def test_pod_subnet_cidrs_parse_as_a_list() -> None:
    settings = ServeSettings.build(pod_subnet_cidrs="10.96.0.0/12, 10.0.0.0/8,")
    assert settings.pod_subnet_cidrs == ("10.96.0.0/12", "10.0.0.0/8")


class WrittenStore(StateStore):
    """A store noting each record written: its state, tunnel state, and whether its VM and
    device plan were in it."""

    written: list[tuple[str, str, bool, bool]]

    async def put(self, record: SandboxRecord) -> SandboxRecord:
        tunnel_state = json.loads(record.pod_network)["state"] if record.pod_network else ""
        with_vm = record.instance is not None
        self.written.append((record.state.value, tunnel_state, with_vm, bool(record.device_plan)))
        return await super().put(record)


async def written_store(path: Path) -> WrittenStore:
    store = await WrittenStore.open(path)
    assert isinstance(store, WrittenStore)
    store.written = []
    return store


async def test_each_start_step_is_written_before_it_is_taken_and_once(tmp_path: Path) -> None:
    """The record order recovery relies on: starting before the VM is created, the VM with its
    device plan as soon as it exists, the tunnel's VM end before any part of it is made, and the
    ready tunnel with the state running; no write beyond those."""
    store = await written_store(tmp_path / "state")
    tunnels, provider = Tunnels(), FakeProvider()
    m = manager(tmp_path, store, tunnels, provider)
    try:
        await m.create_vm("sb", ANNOTATIONS, "/var/run/netns/cni-1")
        await m.start_vm("sb")
        assert store.written == [
            ("created", "inspected", False, False),
            ("starting", "inspected", False, False),
            ("starting", "inspected", True, True),
            ("starting", "setting-up", True, True),
            ("running", "ready", True, True),
        ]
    finally:
        await m.close(0)
        await store.close()


async def test_a_start_failing_after_the_tunnel_tears_down_what_was_written_ahead(
    tmp_path: Path,
) -> None:
    """The ready tunnel is never written when the forwarder cannot be reached: the teardown of
    the failed start works from the VM end written ahead, and leaves the sandbox failed."""
    store = await written_store(tmp_path / "state")
    tunnels, provider = Tunnels(), FakeProvider()
    config = ManagerConfig(pods_dir=tmp_path / "pods", proxy_timeout_seconds=1)
    proxies = FakeProxies()
    proxies.connect_error = PeerpodsError("forwarder unreachable")
    m = pod_network_manager(config, store, provider, proxies, tunnels)
    try:
        await m.create_vm("sb", ANNOTATIONS, "/var/run/netns/cni-1")
        with pytest.raises(PeerpodsError, match="forwarder unreachable"):
            await m.start_vm("sb")
        assert ("running", "ready", True, True) not in store.written
        assert tunnels.calls[-2:] == ["started 10.0.0.7", "stop"]
        assert provider.deleted == ["vm-sb"]
        record = await store.get("sb")
        assert record is not None and record.state is SandboxState.FAILED
        assert record.instance is None and record.pod_network == ""
    finally:
        await m.close(0)
        await store.close()
