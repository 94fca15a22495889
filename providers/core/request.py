"""What a pod needs from its VM: the typed input of instance selection.

The webhook builds one from a pod, the adaptor from CreateVM's annotations, the CLI from flags.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from providers.core.catalog import Arch

Provisioning = Literal["on-demand", "spot", "flex-start", "capacity-block"]


class InstanceRequest(BaseModel):
    """A request for one pod VM. Zero means "no requirement" for the numeric fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vcpus: int = Field(0, ge=0, description="minimum vCPUs")
    memory_mib: int = Field(0, ge=0, description="minimum memory in MiB")
    gpus: int = Field(0, ge=0, description="whole GPUs (or GPU shares when fractional)")
    gpu_models: tuple[str, ...] = Field((), description="acceptable GPU models (alternatives)")
    gpu_products: tuple[str, ...] = Field(
        (), description="acceptable GPU forms (providers.core.skus.product_key); empty: any"
    )
    gpu_memory_mib: int = Field(0, ge=0, description="minimum memory per GPU in MiB")
    mig: dict[str, int] = Field(default_factory=dict, description="MIG profile -> device count")
    fractional: bool = Field(False, description="a fraction of a GPU may serve one GPU")
    arch: Arch = "x86_64"
    rdma: bool = Field(False, description="RDMA (EFA / InfiniBand) required")
    rdma_devices: int = Field(0, ge=0, description="RDMA devices needed (EFA interfaces); 0: one")
    allow: tuple[str, ...] = Field((), description="only these instance types (empty: any)")
    deny: tuple[str, ...] = Field((), description="never these instance types")
    instance_type: str = Field("", description="an explicit instance type")
    zone: str = Field("", description="restrict to instance types offered in this zone")
    provisioning: Provisioning = Field(
        "on-demand",
        description="how the VM is bought: only types the cloud sells that way are candidates",
    )
    reservation: str = Field(
        "",
        max_length=256,
        description="a capacity reservation or block the operator named (AWS Capacity Block "
        "`cr-...`, GCP reservation): types sold only that way become candidates, launched into "
        "it; empty: none",
    )
    confidential: bool = Field(
        False,
        description="the pod asks for confidential computing: only confidential VM sizes "
        "(never chosen otherwise)",
    )

    @field_validator("mig")
    @classmethod
    def _positive_counts(cls, value: dict[str, int]) -> dict[str, int]:
        for profile, count in value.items():
            if count <= 0:
                raise ValueError(f"MIG profile {profile}: count must be positive, got {count}")
        return value

    @property
    def wants_gpu(self) -> bool:
        return (
            self.gpus > 0
            or bool(self.mig)
            or bool(self.gpu_models)
            or bool(self.gpu_products)
            or self.gpu_memory_mib > 0
        )
