"""The sandbox manager's narrow view of pod networking: records in, tunnel JSON out.

The manager stores whatever string these calls return in `SandboxRecord.pod_network`, and knows
nothing else about VXLAN:

    created(id, netns)          CreateVM   -> tunnel JSON, or "" when the pod has no netns
    prepare(record, instance)   StartVM, once the VM exists -> tunnel JSON naming the VM's end,
                                stored before `started` makes the first part (write-ahead)
    started(record, instance)   StartVM, after `prepare` was stored -> tunnel JSON, ready
    stop(record)                StopVM (and an aborted StartVM): teardown, retried a few times;
                                PodNetError when something stays (the caller keeps the record
                                and says so; the next StopVM or restart tries again); the
                                device's deletion goes on while the VM is deleted
    removed(id)                 StopVM, once the VM is deleted: until that deletion has ended
    recovered(record)           restart -> tunnel JSON, repaired; NetnsGone when the pod is gone
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

from adaptor.podnet._errors import NetnsGone, PodNetError
from adaptor.podnet._model import Tunnel, TunnelState
from adaptor.podnet._service import PodNet
from adaptor.state import SandboxRecord
from providers.core.base import Instance

log = logging.getLogger(__name__)

APF_COPY_NAME = "apf.json"
TEARDOWN_ATTEMPTS = 3
TEARDOWN_BACKOFF_SECONDS = 0.2


def write_apf_copy(pods_dir: Path, sandbox_id: str, apf: dict[str, Any]) -> None:
    """The operator's copy of a pod VM's apf.json at <pods-dir>/<id>/apf.json, mode 0600 (it
    may hold the VM's TLS key). StopVM removes the directory. Blocking."""
    directory = pods_dir / sandbox_id
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / APF_COPY_NAME
    tmp = directory / f".{APF_COPY_NAME}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(apf, out, indent=4)
    os.replace(tmp, path)


def pod_network_section(record: SandboxRecord) -> dict[str, Any] | None:
    """apf.json's `pod-network` for a sandbox (None: the pod has no network namespace)."""
    if not record.pod_network:
        return None
    return Tunnel.from_json(record.pod_network).network.to_dict()


class SandboxPodNetwork:
    """PodNet bound to sandbox records and the pods dir."""

    def __init__(self, podnet: PodNet, pods_dir: Path) -> None:
        self.podnet = podnet
        self.pods_dir = pods_dir
        # sandbox id -> the VNI whose device `stop` left being deleted, until `removed`.
        self._stopped: dict[str, int] = {}

    async def created(self, sandbox_id: str, netns: str) -> str:
        tunnel = await self.podnet.inspect(sandbox_id, netns)
        return tunnel.to_json() if tunnel is not None else ""

    async def forget(self, sandbox_id: str, pod_network: str) -> None:
        """A CreateVM that failed after `created`: its VNI goes back."""
        if pod_network:
            await self.podnet.release_vni(Tunnel.from_json(pod_network).vni)

    async def prepare(self, record: SandboxRecord, instance: Instance) -> str:
        if not record.pod_network:
            return ""
        tunnel = Tunnel.from_json(record.pod_network)
        return (await self.podnet.prepare(tunnel, instance.addresses)).to_json()

    async def started(self, record: SandboxRecord, instance: Instance) -> str:
        if not record.pod_network:
            return ""
        tunnel = Tunnel.from_json(record.pod_network)
        ready = await self.podnet.setup(tunnel, instance.addresses)
        copy = self.pods_dir / record.id / APF_COPY_NAME
        if not await asyncio.to_thread(copy.exists):
            # Providers without user data (static, local): the copy holds what the VM must be
            # told, for whoever configures it.
            apf = {
                "pod-network": ready.network.to_dict(),
                "pod-namespace": record.pod_namespace,
                "pod-name": record.pod_name,
            }
            await asyncio.to_thread(write_apf_copy, self.pods_dir, record.id, apf)
        return ready.to_json()

    async def stop(self, record: SandboxRecord) -> str:
        """Teardown with retries; the tunnel JSON to keep ('' once nothing is left)."""
        if not record.pod_network:
            return ""
        tunnel = Tunnel.from_json(record.pod_network)
        if tunnel.state is TunnelState.INSPECTED and not tunnel.remote:
            return ""
        error: PodNetError | None = None
        for attempt in range(TEARDOWN_ATTEMPTS):
            try:
                await self.podnet.teardown(tunnel)
                self._stopped[record.id] = tunnel.vni
                return ""
            except PodNetError as exc:
                error = exc
                log.warning(
                    "sandbox %s: tunnel teardown attempt %d failed: %s", record.id, attempt + 1, exc
                )
                await asyncio.sleep(TEARDOWN_BACKOFF_SECONDS * (attempt + 1))
        assert error is not None
        raise PodNetError(f"pod network teardown failed: {error}") from error

    async def removed(self, sandbox_id: str) -> None:
        """Until the device the last `stop` of the sandbox left being deleted is gone (at once
        when there is none)."""
        vni = self._stopped.pop(sandbox_id, None)
        if vni is not None:
            await self.podnet.deleted(vni)

    async def recovered(self, record: SandboxRecord) -> str:
        """Repair after a restart; NetnsGone propagates (the caller cleans the sandbox up)."""
        if not record.pod_network:
            return ""
        tunnel = Tunnel.from_json(record.pod_network)
        if tunnel.state is TunnelState.INSPECTED:
            return record.pod_network
        if tunnel.state is TunnelState.SETTING_UP:
            # The daemon died inside StartVM (the sandbox is failed now): remove what it made,
            # and keep the VNI with the sandbox, as at CreateVM.
            try:
                await self.stop(record)
            except PodNetError as exc:
                return self.failed_teardown(record, str(exc))
            return tunnel.evolve(remote="", state=TunnelState.INSPECTED, error="").to_json()
        if tunnel.state is TunnelState.TEARDOWN:
            # A StopVM left remains: try again now, keep them recorded if they still stay.
            try:
                return await self.stop(record)
            except PodNetError as exc:
                return self.failed_teardown(record, str(exc))
        try:
            repaired = await self.podnet.repair(tunnel)
        except NetnsGone:
            raise
        except PodNetError as exc:
            log.error("sandbox %s: tunnel repair failed: %s", record.id, exc)
            return tunnel.evolve(state=TunnelState.FAILED, error=str(exc)).to_json()
        return repaired.to_json()

    @staticmethod
    def failed_teardown(record: SandboxRecord, error: str) -> str:
        """The tunnel JSON marking a teardown still owed (shown by the status API)."""
        tunnel = Tunnel.from_json(record.pod_network)
        return tunnel.evolve(state=TunnelState.TEARDOWN, error=error).to_json()
