"""Sandbox records: what the daemon must remember about a sandbox across restarts.

A record is written before CreateVM answers and updated at every step of StartVM and StopVM, so a
restarted daemon knows which VMs exist, which agent sockets to serve again and which deletes are
still owed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from providers.core.base import Instance


class SandboxState(enum.StrEnum):
    """Where a sandbox is in its life.

    created   CreateVM recorded it; no VM yet
    starting  StartVM is creating the VM or waiting for its forwarder
    running   the VM exists and its agent socket is served
    stopping  StopVM is tearing it down
    failed    a step failed; `reason` says which, `instance` is set while a VM may still exist
    preempted the cloud took the running VM away (Spot preemption, eviction, deletion);
              `reason` says what the cloud reported; agent calls fail until StopVM
    """

    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    FAILED = "failed"
    PREEMPTED = "preempted"


@dataclass(frozen=True)
class SandboxRecord:
    """One sandbox as stored; `instance` is set from the moment the provider returns a VM."""

    id: str
    pod_namespace: str
    pod_name: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    network_namespace: str = ""
    agent_socket: str = ""
    state: SandboxState = SandboxState.CREATED
    reason: str = ""
    instance: Instance | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    # The sandbox's device plan (adaptor.devices.DevicePlan JSON), fixed once its VM exists.
    device_plan: str = ""
    # The sandbox's pod network tunnel (adaptor.podnet.Tunnel JSON), from CreateVM on; '' for none.
    pod_network: str = ""

    def evolve(self, **changes: Any) -> SandboxRecord:
        """A copy with `changes` applied (records are immutable)."""
        return replace(self, **changes)


def instance_to_dict(instance: Instance | None) -> dict[str, Any] | None:
    """A JSON-ready form of an Instance (tuples and mappings made plain)."""
    if instance is None:
        return None
    return {
        "id": instance.id,
        "name": instance.name,
        "addresses": list(instance.addresses),
        "instance_type": instance.instance_type,
        "zone": instance.zone,
        "port": instance.port,
        "tags": dict(instance.tags),
        "extra": dict(instance.extra),
        "capacity_type": instance.capacity_type,
    }


def instance_from_dict(data: Mapping[str, Any] | None) -> Instance | None:
    """The inverse of `instance_to_dict`."""
    if data is None:
        return None
    port = data.get("port")
    return Instance(
        id=str(data["id"]),
        name=str(data.get("name", "")),
        addresses=tuple(str(a) for a in data.get("addresses", ())),
        instance_type=str(data.get("instance_type", "")),
        zone=str(data.get("zone", "")),
        port=int(port) if port is not None else None,
        tags={str(k): str(v) for k, v in dict(data.get("tags", {})).items()},
        extra={str(k): str(v) for k, v in dict(data.get("extra", {})).items()},
        capacity_type=str(data.get("capacity_type", "on-demand")),
    )
