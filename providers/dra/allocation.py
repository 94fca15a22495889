"""From allocated devices of gpu.peerpods.io to the pod VM's GPUs.

What the scheduler allocated (a claim's `status.allocation.devices.results`: pool and device
names) is looked up in the published slices (`device_facts`: model, product, memory, shared),
and the devices of one pod become the VM's GPU intent (`gpu_intent`), the same intent the
annotation path writes: so `peerpods plan --dra-driver` and the adaptor at CreateVM choose the
same instance type for the same allocation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from providers.core.contract import GpuIntent
from providers.core.errors import InvalidRequest
from providers.core.skus import product_key
from providers.dra.slices import DRIVER

__all__ = ["AllocatedDevice", "device_facts", "gpu_intent"]

_MIB = 1 << 20


@dataclass(frozen=True)
class AllocatedDevice:
    """One device a claim was allocated, with the facts its published entry carries."""

    pool: str
    device: str
    model: str
    product: str
    memory_mib: int
    shared: bool = False
    consumed_mib: int = 0  # a shared device: the memory the claim took of it
    request: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AllocatedDevice:
        try:
            return cls(
                pool=str(data["pool"]),
                device=str(data["device"]),
                model=str(data["model"]),
                product=str(data["product"]),
                memory_mib=int(data["memory_mib"]),
                shared=bool(data.get("shared", False)),
                consumed_mib=int(data.get("consumed_mib", 0)),
                request=str(data.get("request", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequest(f"an allocated device record is malformed: {exc}") from None


def _value(attribute: Mapping[str, Any]) -> Any:
    for kind in ("string", "int", "bool", "version"):
        if kind in attribute:
            return attribute[kind]
    return None


def _attributes(device: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, attribute in (device.get("attributes") or {}).items():
        short = name.removeprefix(f"{DRIVER}/")
        if isinstance(attribute, Mapping):
            out[short] = _value(attribute)
    return out


def _bytes(text: Any) -> int:
    from providers.core.quantity import parse_quantity

    return int(parse_quantity(str(text)))


def device_facts(
    slices: Iterable[Mapping[str, Any]],
    pool: str,
    device: str,
    request: str = "",
    consumed: Mapping[str, Any] | None = None,
) -> AllocatedDevice | None:
    """The published facts of `device` in `pool` (highest generation), None when not found."""
    candidates = [
        s
        for s in slices
        if (s.get("spec") or {}).get("driver") == DRIVER
        and ((s.get("spec") or {}).get("pool") or {}).get("name") == pool
    ]
    if not candidates:
        return None
    top = max(int(s["spec"]["pool"].get("generation", 0)) for s in candidates)
    for slice_ in candidates:
        if int(slice_["spec"]["pool"].get("generation", 0)) != top:
            continue
        for entry in slice_["spec"].get("devices") or []:
            if entry.get("name") != device:
                continue
            attributes = _attributes(entry)
            memory = ((entry.get("capacity") or {}).get("memory") or {}).get("value", "0")
            took = (consumed or {}).get("memory")
            return AllocatedDevice(
                pool=pool,
                device=device,
                model=str(attributes.get("model", "")),
                product=str(attributes.get("productName", "")),
                memory_mib=_bytes(memory) // _MIB,
                shared=bool(entry.get("allowMultipleAllocations", False)),
                consumed_mib=_bytes(took) // _MIB if took is not None else 0,
                request=request,
            )
    return None


def gpu_intent(devices: Sequence[AllocatedDevice]) -> GpuIntent:
    """The GPUs a pod VM must carry for `devices` (all of one pod): one GPU per whole device,
    one fractional GPU with at least the memory taken per shared allocation. A VM carries one
    GPU model, so devices of two models are refused."""
    if not devices:
        return GpuIntent()
    models = sorted({d.model for d in devices})
    if len(models) > 1:
        raise InvalidRequest(
            f"the pod was allocated GPUs of models {', '.join(models)}; a pod VM carries one"
        )
    products = sorted({product_key(d.product) for d in devices if d.product})
    shared = [d for d in devices if d.shared]
    whole = [d for d in devices if not d.shared]
    if shared and whole:
        raise InvalidRequest(
            "the pod was allocated whole GPUs and shares of one; a VM has one kind"
        )
    if shared:
        need = max(d.consumed_mib or d.memory_mib for d in shared)
        return GpuIntent(
            gpus=len(shared), models=tuple(models), products=tuple(products), memory_mib=need,
            fractional=True,
        )  # fmt: skip
    return GpuIntent(gpus=len(whole), models=tuple(models), products=tuple(products))
