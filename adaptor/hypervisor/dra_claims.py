"""The DRA-driver mode's step in the sandbox lifecycle: the VM is planned from the pod's
allocated claims, and each allocated device becomes a slot of the device plan.

At CreateVM the kubelet has prepared the pod's claims (NodePrepareResources returns before
RunPodSandbox), so the plugin's checkpoint holds them, found by the pod's namespace and name
(CreateVM carries those, not the pod's UID). Their devices set the VM's GPUs in the record's
annotations (adaptor.dra.vm); once the VM exists its device plan gets one slot per allocated
device (adaptor.devices.dra), which CreateContainer fills from each container's CDI environment.
"""

from __future__ import annotations

import asyncio
import logging

from adaptor.devices.dra import assign_allocated
from adaptor.devices.plan import DevicePlan
from adaptor.dra.checkpoint import Checkpoint, PreparedClaim
from adaptor.dra.vm import pod_devices, with_allocated_gpus
from adaptor.hypervisor.hooks import SandboxHook, SaveRecord
from adaptor.state import SandboxRecord

__all__ = ["DraClaimsHook"]

log = logging.getLogger(__name__)


class DraClaimsHook(SandboxHook):
    """Plans a pod's VM from the claims the kubelet plugin prepared for it."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint

    async def _claims(self, record: SandboxRecord) -> list[PreparedClaim]:
        return await asyncio.to_thread(
            self.checkpoint.for_pod_name, record.pod_namespace, record.pod_name
        )

    async def sandbox_created(self, record: SandboxRecord) -> SandboxRecord:
        claims = await self._claims(record)
        if not claims:
            return record
        annotations = with_allocated_gpus(record.annotations, claims)
        log.info(
            "pod %s/%s: VM planned from %d allocated devices of %d claims",
            record.pod_namespace,
            record.pod_name,
            len(pod_devices(claims)),
            len(claims),
        )
        return record.evolve(annotations=annotations)

    async def vm_created(self, record: SandboxRecord, save: SaveRecord) -> SandboxRecord:
        if not record.device_plan:
            return record
        devices = pod_devices(await self._claims(record))
        if not devices:
            return record
        plan = assign_allocated(DevicePlan.from_json(record.device_plan), devices)
        return record.evolve(device_plan=plan.to_json())
