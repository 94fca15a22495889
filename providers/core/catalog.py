"""The instance-type catalog: one normalised record per cloud instance type.

Loaders (providers/clouds/loaders/) turn each cloud's listing into these records; bundled snapshots
under
providers/snapshots/ are these records as JSON; selection reads nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from types import MappingProxyType
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

# The one spelling of the clouds and architectures; everything else derives from these.
Cloud = Literal["aws", "azure", "gcp"]
Arch = Literal["x86_64", "arm64"]
CLOUDS: tuple[Cloud, ...] = get_args(Cloud)
ARCHES: tuple[Arch, ...] = get_args(Arch)
Provisioning = Literal["on-demand", "spot", "flex-start", "capacity-block", "reservation"]
"""How a cloud sells a type: on demand; as Spot (AWS Spot, Azure Spot, GCP Spot VMs: cheaper,
reclaimable); GCP's Flex-start (Dynamic Workload Scheduler: queued, runs at most 7 days); AWS
Capacity Blocks for ML and GCP reservations (capacity bought in advance, used by naming it)."""
DEFAULT_PROVISIONING: tuple[Provisioning, ...] = ("on-demand", "spot")
RESERVED: frozenset[Provisioning] = frozenset({"capacity-block", "reservation"})
"""The ways that need capacity the operator bought in advance, named by its id."""


class GpuSpec(BaseModel):
    """The GPUs an instance type carries (all of one model)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(description="canonical GPU model id (providers.core.gpus), e.g. 'h100-80gb'")
    count: int = Field(ge=1, description="physical GPUs, or 1 for a partitioned GPU")
    memory_mib: int = Field(ge=0, description="memory per GPU as the cloud reports it, MiB")
    fraction: float = Field(1.0, gt=0, le=1, description="share of one GPU (g6f, NV*ads_A10_v5)")


class AttachableGpu(BaseModel):
    """A GPU model a machine type can attach (GCP N1), up to `max_count`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    memory_mib: int
    counts: tuple[int, ...] = Field(description="allowed attachment counts, e.g. (1, 2, 4)")
    zones: tuple[str, ...] = Field(
        (), description="zones where it can be attached; empty: every zone of the type"
    )
    price_per_hour: float | None = Field(
        None, ge=0, description="on-demand USD per hour for one attached GPU, when known"
    )
    spot_price_per_hour: float | None = Field(
        None, ge=0, description="Spot USD per hour for one attached GPU, when published"
    )


class InstanceType(BaseModel):
    """One instance type in one region."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    vcpus: int = Field(ge=0)
    memory_mib: int = Field(ge=0)
    arch: Arch = "x86_64"
    gpu: GpuSpec | None = None
    attachable_gpus: tuple[AttachableGpu, ...] = ()
    rdma: Literal["", "efa", "infiniband", "roce"] = Field(
        "", description="RDMA NICs: AWS EFA, Azure InfiniBand, GCP GPUDirect RDMA over RoCE"
    )
    efa_interfaces: int = 0
    zones: tuple[str, ...] = Field((), description="zones offering it; empty: region-wide/unknown")
    price_per_hour: float | None = Field(
        None, ge=0, description="on-demand USD per hour, when known (GCP N1: the machine alone)"
    )
    spot_price_per_hour: float | None = Field(
        None,
        ge=0,
        description="Spot USD per hour where the cloud publishes one (AWS: a recent average; "
        "Azure and GCP: the list price); None when unknown",
    )
    provisioning: tuple[Provisioning, ...] = Field(
        DEFAULT_PROVISIONING,
        description="how the cloud sells it; a type without 'on-demand' (GCP's 1-, 2- and 4-GPU "
        "A3 High: Spot and Flex-start only) is never a candidate for an on-demand pod",
    )
    zone_provisioning: tuple[tuple[str, tuple[Provisioning, ...]], ...] = Field(
        (),
        description="(zone, how it is sold there) for the zones where that differs from "
        "`provisioning`",
    )
    confidential: bool = Field(
        False,
        description="a confidential VM size (Azure NCC H100 v5): only for pods that ask for "
        "confidential computing",
    )
    family: str = ""

    @property
    def on_demand(self) -> bool:
        """Whether an on-demand VM of this type can be created."""
        return "on-demand" in self.provisioning

    def sold_in(self, zone: str) -> tuple[Provisioning, ...]:
        """How the type is sold in `zone` ("": in general)."""
        return next((ways for z, ways in self.zone_provisioning if z == zone), self.provisioning)

    def zones_selling(self, ways: frozenset[str]) -> tuple[str, ...] | None:
        """The zones where one of `ways` buys it; None: every zone offering it."""
        if not self.zone_provisioning:
            return None if ways & set(self.provisioning) else ()
        return tuple(z for z in self.zones if ways & set(self.sold_in(z)))


class Catalog(BaseModel):
    """Every instance type of one cloud region."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cloud: Cloud
    region: str
    source: str = Field("", description="how it was made: 'snapshot <date>', 'live', 'moto'")
    gpu_prices: dict[str, float] = Field(
        default_factory=dict,
        description="on-demand USD per hour of one GPU by model, where the cloud prices GPUs "
        "apart from machines (GCP): what an unpriced type's GPUs are estimated at",
    )
    types: tuple[InstanceType, ...] = ()

    @cached_property
    def _by_name(self) -> Mapping[str, InstanceType]:
        return MappingProxyType({t.name: t for t in self.types})

    def by_name(self) -> Mapping[str, InstanceType]:
        """Types by name (built once per catalog; a catalog is immutable)."""
        return self._by_name
