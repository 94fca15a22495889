"""The CDI names a pod VM's devices have, as templates (configurable per pod VM image).

The defaults follow `nvidia-ctk cdi generate` (kind `nvidia.com/gpu`): a whole GPU by index
(`nvidia.com/gpu=0`), a MIG device by `<gpu>:<mig>` (`nvidia.com/gpu=1:0`), every GPU as
`nvidia.com/gpu=all`. RDMA devices have no vendor-standard CDI name, so the default template
(`rdma.peerpods.io/hca=<index>`) must match whatever spec the pod VM image ships.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

from adaptor.cdi import CdiError, parse_qualified_name
from providers.errors import InvalidRequest


class CdiNaming(BaseModel):
    """Templates: `{index}` for GPUs and RDMA devices, `{gpu}` and `{mig}` for MIG devices."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: str = "nvidia.com/gpu={index}"
    mig: str = "nvidia.com/gpu={gpu}:{mig}"
    all_gpus: str = "nvidia.com/gpu=all"
    rdma: str = "rdma.peerpods.io/hca={index}"

    @field_validator("gpu", "mig", "all_gpus", "rdma")
    @classmethod
    def _qualified(cls, template: str) -> str:
        try:
            parse_qualified_name(template.format(index=0, gpu=0, mig=0))
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"bad template {template!r}: {exc}") from None
        except CdiError as exc:
            raise ValueError(f"template {template!r} does not make a CDI name: {exc}") from None
        return template

    def gpu_name(self, index: int) -> str:
        return self.gpu.format(index=index)

    def mig_name(self, gpu: int, mig: int) -> str:
        return self.mig.format(gpu=gpu, mig=mig)

    def rdma_name(self, index: int) -> str:
        return self.rdma.format(index=index)


def naming_from_flags(gpu: str, mig: str, rdma: str) -> CdiNaming:
    """Build the naming from flag values; a bad template is an InvalidRequest naming it."""
    try:
        return CdiNaming(gpu=gpu, mig=mig, rdma=rdma)
    except ValueError as exc:
        first = exc.errors()[0]["msg"] if hasattr(exc, "errors") else str(exc)
        raise InvalidRequest(f"CDI naming: {first}") from None
