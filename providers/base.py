"""The provider interface: the small surface every cloud (and `static`, `local`) implements.

A provider creates, deletes and lists the pod VMs it owns. Everything is async; SDK calls run in
threads inside each provider. Records are plain frozen dataclasses so they pickle, compare and log
cleanly; cloud-specific details go in `extra`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from providers.capacity import CapacityType

# Tag/label keys every VM carries (clouds that forbid dots map these to their own spelling).
TAG_OWNER = "peerpods-owner"
TAG_SANDBOX = "peerpods-sandbox"
TAG_POD_NAMESPACE = "peerpods-pod-namespace"
TAG_POD_NAME = "peerpods-pod-name"


@dataclass(frozen=True)
class Instance:
    """A pod VM as a provider reports it."""

    id: str
    name: str
    addresses: tuple[str, ...]
    instance_type: str
    zone: str = ""
    # Forwarder port when it is not the adaptor's --forwarder-port (the static provider's pool).
    port: int | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, str] = field(default_factory=dict)
    # What the cloud gave: "spot" or "on-demand" (providers.capacity.SPOT / ON_DEMAND).
    capacity_type: str = "on-demand"


@dataclass(frozen=True)
class VMSpec:
    """What StartVM asks a provider to create.

    `candidates` are instance types ranked best first (from selection); a provider tries them in
    order across zones on capacity errors. `user_data` is the cloud-init payload for the VM.
    """

    sandbox_id: str
    pod_namespace: str
    pod_name: str
    candidates: tuple[str, ...] = ()
    user_data: str = ""
    image: str = ""
    vcpus: int = 0
    memory_mib: int = 0
    gpus: int = 0
    tags: Mapping[str, str] = field(default_factory=dict)
    # candidate -> the only zones it may be created in (absent or empty: any configured zone),
    # e.g. a GCP N1 type whose attachable GPU exists in some zones only.
    zones: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Spot, on-demand, or Spot first with on-demand after Spot capacity errors everywhere.
    capacity_type: CapacityType = CapacityType.ON_DEMAND


@runtime_checkable
class Provider(Protocol):
    """Create, delete and list the pod VMs this adaptor owns."""

    name: str

    async def create(self, spec: VMSpec) -> Instance:
        """Create (or find, if a retried create already made it) the VM for `spec.sandbox_id`."""
        ...

    async def delete(self, instance_id: str) -> None:
        """Delete the VM and return once the cloud confirms; a missing VM is not an error."""
        ...

    async def list_owned(self) -> list[Instance]:
        """Every VM carrying this adaptor's owner tag."""
        ...
