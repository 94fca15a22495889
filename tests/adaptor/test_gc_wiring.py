"""The daemon sweeps VMs it owns whose sandbox it does not know, and nothing else."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from adaptor.node.daemon import Daemon, StateLocked
from adaptor.node.settings import ServeSettings
from providers.core.base import TAG_OWNER, TAG_SANDBOX, Instance
from tests.adaptor.daemon_proc import daemon_settings
from tests.adaptor.fakes import FakeProvider, FakeProxies


def settings(root: Path, gc_interval: float) -> ServeSettings:
    return daemon_settings(root, gc_interval_seconds=gc_interval)


def vm(vm_id: str, owner: str, sandbox: str) -> Instance:
    return Instance(vm_id, vm_id, ("10.0.0.9",), "t", tags={TAG_OWNER: owner, TAG_SANDBOX: sandbox})


async def test_orphans_swept_foreign_and_known_kept(root: Path) -> None:
    provider = FakeProvider()
    provider.vms = {
        "orphan": vm("orphan", "node-a", "gone"),
        "foreign": vm("foreign", "node-b", "theirs"),
        "known": vm("known", "node-a", "sb-known"),
    }
    first = Daemon(settings(root, 0), provider=provider, proxy_factory=FakeProxies())
    await first.start()
    assert first.manager is not None
    await first.manager.create_vm(
        "sb-known",
        {"io.kubernetes.cri.sandbox-name": "p", "io.kubernetes.cri.sandbox-namespace": "n"},
    )
    await first.close()
    assert set(provider.vms) == {"orphan", "foreign", "known"}

    daemon = Daemon(settings(root, 60), provider=provider, proxy_factory=FakeProxies())
    await daemon.start()
    try:
        assert daemon.gc is not None
        for _ in range(200):  # the first sweep runs as the daemon starts
            if daemon.gc.sweeps:
                break
            await asyncio.sleep(0.01)
        assert set(provider.vms) == {"foreign", "known"}
        assert provider.deleted == ["orphan"]
    finally:
        await daemon.close()
    assert daemon.gc is None


async def test_gc_off_and_state_locked(root: Path) -> None:
    provider = FakeProvider()
    provider.vms = {"orphan": vm("orphan", "node-a", "gone")}
    first = Daemon(settings(root, 0), provider=provider, proxy_factory=FakeProxies())
    await first.start()
    try:
        assert first.gc is None
        refused = daemon_settings(root, gc_interval_seconds=0, take_over="never")
        second = Daemon(refused, provider=provider, proxy_factory=FakeProxies())
        with pytest.raises(StateLocked):
            await second.start()
        await asyncio.sleep(0)
        assert "orphan" in provider.vms
    finally:
        await first.close()
