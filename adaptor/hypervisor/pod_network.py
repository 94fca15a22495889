"""The pod network as one of the sandbox hooks: the pod's tunnel to its VM is inspected at
CreateVM, made (written ahead) once the VM exists, torn down before the VM is deleted and
repaired after a restart, all through the hook points every other step uses.

The tunnel's state travels as JSON in the record's `pod_network` (adaptor.podnet's Tunnel); the
tunnels themselves are adaptor.podnet.SandboxPodNetwork's (`PodTunnels` is what is asked of it).
"""

from __future__ import annotations

import logging
from typing import Protocol

from adaptor.hypervisor.hooks import PodGone, SandboxHook, SaveRecord, TeardownOwed
from adaptor.podnet import NetnsGone
from adaptor.state import SandboxRecord
from providers.core.base import Instance
from providers.core.errors import PeerpodsError

log = logging.getLogger(__name__)


class PodTunnels(Protocol):
    """A sandbox's tunnel steps (adaptor.podnet.SandboxPodNetwork); each returns its JSON."""

    async def created(self, sandbox_id: str, netns: str) -> str: ...

    async def forget(self, sandbox_id: str, pod_network: str) -> None: ...

    async def prepare(self, record: SandboxRecord, instance: Instance) -> str: ...

    async def started(self, record: SandboxRecord, instance: Instance) -> str: ...

    async def stop(self, record: SandboxRecord) -> str: ...

    async def removed(self, sandbox_id: str) -> None: ...

    async def recovered(self, record: SandboxRecord) -> str: ...

    @staticmethod
    def failed_teardown(record: SandboxRecord, error: str) -> str: ...


class PodNetworkHook(SandboxHook):
    """The pod's tunnel, kept in step with its sandbox."""

    def __init__(self, tunnels: PodTunnels) -> None:
        self.tunnels = tunnels

    async def sandbox_created(self, record: SandboxRecord) -> SandboxRecord:
        """The pod's netns inspected and a VNI leased (nothing when the pod has no netns)."""
        tunnel = await self.tunnels.created(record.id, record.network_namespace)
        return record.evolve(pod_network=tunnel)

    async def create_failed(self, record: SandboxRecord) -> None:
        """The VNI goes back."""
        await self.tunnels.forget(record.id, record.pod_network)

    async def vm_created(self, record: SandboxRecord, save: SaveRecord) -> SandboxRecord:
        """The tunnel to the VM. Write-ahead: its VM end is stored before its first part is
        made, so a teardown after any interruption (StopVM, a kill) knows what to remove."""
        if not record.pod_network:
            return record
        instance = record.instance
        assert instance is not None, "vm_created runs once the VM is recorded"
        ahead = await self.tunnels.prepare(record, instance)
        record = await save(record.evolve(pod_network=ahead))
        tunnel = await self.tunnels.started(record, instance)
        return record.evolve(pod_network=tunnel)

    async def vm_stopping(self, record: SandboxRecord) -> SandboxRecord:
        """The tunnel torn down (retried); one that stays is recorded as owed."""
        if not record.pod_network:
            return record
        try:
            remaining = await self.tunnels.stop(record)
        except PeerpodsError as exc:
            owed = str(exc)
            log.error("sandbox %s: %s", record.id, owed)
            kept = record.evolve(pod_network=self.tunnels.failed_teardown(record, owed))
            raise TeardownOwed(owed, kept) from exc
        return record.evolve(pod_network=remaining)

    async def vm_deleted(self, record: SandboxRecord) -> None:
        """The tunnel's device, whose deletion `vm_stopping` left running while the VM was
        deleted, is gone before the record (and with it the VNI lease) is."""
        await self.tunnels.removed(record.id)

    async def vm_reaped(self, record: SandboxRecord) -> SandboxRecord:
        """The tunnel stays with the failed sandbox's record (a later StartVM or StopVM uses it,
        or the restart repairs it)."""
        return record

    async def recovered(self, record: SandboxRecord) -> SandboxRecord:
        """The recorded tunnel repaired (PodGone when the pod's netns is gone)."""
        if not record.pod_network:
            return record
        try:
            tunnel = await self.tunnels.recovered(record)
        except NetnsGone as exc:
            raise PodGone("pod network namespace is gone") from exc
        return record.evolve(pod_network=tunnel)
