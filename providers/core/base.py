"""The provider interface: the small surface every cloud (and `static`, `local`) implements.

A provider creates, deletes and lists the pod VMs it owns, and says where it may create them
(`region`, `zones`, `allowed_types`, `default_type`): selection reads those, applies the allow
list once, and hands the provider typed `VMCandidate`s it trusts. Everything is async; SDK calls
run in threads inside each provider. Records are plain frozen dataclasses so they pickle, compare
and log cleanly; cloud-specific details go in `extra`.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from providers.core.capacity import CapacityType
from providers.core.errors import InvalidRequest

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
    # What the cloud gave: "spot" or "on-demand" (providers.core.capacity.SPOT / ON_DEMAND).
    capacity_type: str = "on-demand"


# Maps a created VM to the address the adaptor dials (tests point every VM at 127.0.0.1).
Resolver = Callable[[Instance], Instance]


def identity(instance: Instance) -> Instance:
    """The default resolver: dial the VM's own addresses."""
    return instance


def sandbox_hash(sandbox_id: str, length: int = 16) -> str:
    """A short, stable, lowercase name part for a sandbox (deterministic VM names)."""
    return hashlib.sha256(sandbox_id.encode()).hexdigest()[:length]


@dataclass(frozen=True)
class Accelerator:
    """GPUs attached to a VM at create (GCP N1), by canonical model id (providers.core.gpus)."""

    model: str
    count: int


@dataclass(frozen=True)
class VMCandidate:
    """One instance type a provider may create, as selection decided it.

    `zones` are the only zones it may be created in (empty: any zone the provider is configured
    with), e.g. an N1 type whose attachable GPU exists in some zones only; `accelerator` is the
    GPUs to attach at create. Providers take these as given: the allow list was applied already.
    """

    instance_type: str
    zones: tuple[str, ...] = ()
    accelerator: Accelerator | None = None
    price_per_hour: float | None = None
    # the operator's capacity reservation or block to launch into: set only for a type the
    # cloud does not sell the way the pod buys (AWS P6e-GB200, GCP A4 on demand)
    reservation: str = ""

    def __str__(self) -> str:
        if self.accelerator is None:
            return self.instance_type
        return f"{self.instance_type} with {self.accelerator.count} {self.accelerator.model}"


@dataclass(frozen=True)
class UserDataLimit:
    """A cloud's limit on a VM's user data: bytes, counted raw or after base64."""

    max_bytes: int
    counted: Literal["raw", "base64"]
    what: str  # the cloud's name for it, for the error

    def size(self, user_data: str) -> int:
        """The size the limit applies to."""
        raw = user_data.encode()
        return len(base64.b64encode(raw)) if self.counted == "base64" else len(raw)

    def check(self, user_data: str, what: str = "pod VM") -> None:
        """InvalidRequest, naming the limit, when `user_data` is too large."""
        size = self.size(user_data)
        if size > self.max_bytes:
            raise InvalidRequest(
                f"{what} user data is {size} bytes, over the {self.what} limit of "
                f"{self.max_bytes} bytes"
            )


@dataclass(frozen=True)
class VMSpec:
    """What StartVM asks a provider to create.

    `candidates` are ranked best first (from selection); a provider tries them in order across
    zones on capacity errors. `user_data` is the cloud-init payload for the VM.
    """

    sandbox_id: str
    pod_namespace: str
    pod_name: str
    candidates: tuple[VMCandidate, ...] = ()
    user_data: str = ""
    image: str = ""
    vcpus: int = 0
    memory_mib: int = 0
    gpus: int = 0
    tags: Mapping[str, str] = field(default_factory=dict)
    # Spot, on-demand, or Spot first with on-demand after Spot capacity errors everywhere.
    capacity_type: CapacityType = CapacityType.ON_DEMAND


@runtime_checkable
class Provider(Protocol):
    """Create, delete and list the pod VMs this adaptor owns."""

    name: str

    # Where and what it may create: what selection needs of it ("" and () where not applicable).
    @property
    def region(self) -> str:
        """The region (Azure: location) its VMs are created in; its catalog's region."""
        ...

    @property
    def zones(self) -> tuple[str, ...]:
        """The zones it creates VMs in, in order (empty: the cloud chooses)."""
        ...

    @property
    def allowed_types(self) -> tuple[str, ...]:
        """Instance type globs pod VMs may use (fnmatch; empty: any)."""
        ...

    @property
    def default_type(self) -> str:
        """The type to create when there is no catalog to select from ("" for none)."""
        ...

    async def create(self, spec: VMSpec) -> Instance:
        """Create (or find, if a retried create already made it) the VM for `spec.sandbox_id`."""
        ...

    async def delete(self, instance_id: str) -> None:
        """Delete the VM and return once the cloud confirms; a missing VM is not an error."""
        ...

    async def list_owned(self) -> list[Instance]:
        """Every VM carrying this adaptor's owner tag."""
        ...
