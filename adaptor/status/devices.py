"""Per-container device status: what each container of a sandbox was planned to get, and whether
the agent accepted it.

pending  CreateContainer carried the devices; the agent has not answered yet
ready    CreateContainer carried the devices and the agent answered OK
failed   the rewrite refused the request or the agent answered an error (`reason` says which)

Kept in memory (it describes live proxy traffic); a restarted daemon reports a container again
once its CreateContainer passes through.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Any


class DeviceState(enum.StrEnum):
    PENDING = "pending"
    READY = "ready"
    FAILED = "failed"


@dataclass
class ContainerDeviceState:
    """One container's planned devices and their status."""

    devices: tuple[str, ...]
    state: DeviceState = DeviceState.PENDING
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"devices": list(self.devices), "state": self.state.value, "reason": self.reason}


@dataclass
class DeviceBook:
    """Device status of every sandbox, updated by the proxy's CreateContainer path."""

    _sandboxes: dict[str, dict[str, ContainerDeviceState]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set_devices(self, sandbox_id: str, container: str, devices: tuple[str, ...]) -> None:
        """A container's CreateContainer carried these devices: pending until the agent answers."""
        with self._lock:
            containers = self._sandboxes.setdefault(sandbox_id, {})
            containers[container] = ContainerDeviceState(devices)

    def mark(self, sandbox_id: str, container: str, state: DeviceState, reason: str = "") -> None:
        """Set one container's status (a container outside the plan is tracked with no devices)."""
        with self._lock:
            containers = self._sandboxes.setdefault(sandbox_id, {})
            entry = containers.setdefault(container, ContainerDeviceState(()))
            entry.state = state
            entry.reason = reason

    def forget(self, sandbox_id: str) -> None:
        with self._lock:
            self._sandboxes.pop(sandbox_id, None)

    def snapshot(self, sandbox_id: str) -> dict[str, dict[str, Any]]:
        """JSON-ready status of a sandbox's containers."""
        with self._lock:
            containers = self._sandboxes.get(sandbox_id, {})
            return {name: entry.to_dict() for name, entry in sorted(containers.items())}
