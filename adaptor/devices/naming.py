"""The CDI names a pod VM's devices have, as templates (configurable per pod VM image).

The defaults are peerpods' own kind, `peerpods.io/gpu`: a whole GPU `peerpods.io/gpu=gpu0`, a MIG
device `peerpods.io/gpu=gpu1-mig0` (MIG device 0 of GPU 1, by start slot), RDMA devices
`rdma.peerpods.io/hca=0`. The plan sends every name with the device layout, and
`peerpods podvm prepare` in the pod VM binds each to the device it created, so names agree by
construction; being a kind of our own, they never clash with the `nvidia.com/gpu` spec that
`nvidia-ctk cdi generate` may also write there.

Pod VM images without `peerpods podvm` set the templates to nvidia-ctk's names
(`nvidia.com/gpu={index}`, `nvidia.com/gpu={gpu}:{mig}`); its MIG index is NVML's own, which
need not follow start slots (docs/podvm.md), so MIG names are only reliable with one MIG
device per GPU there.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

from adaptor.cdi import CdiError, parse_qualified_name
from adaptor.settings import CdiNames
from providers.core.errors import InvalidRequest

_DEFAULTS = CdiNames()


class CdiNaming(BaseModel):
    """Templates: `{index}` for GPUs and RDMA devices, `{gpu}` and `{mig}` for MIG devices."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # the defaults are the `serve` settings' (adaptor.settings.CdiNames), declared there once
    gpu: str = _DEFAULTS.cdi_gpu_name
    mig: str = _DEFAULTS.cdi_mig_name
    rdma: str = _DEFAULTS.cdi_rdma_name

    @field_validator("gpu", "mig", "rdma")
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
