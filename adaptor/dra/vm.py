"""A pod VM planned from its allocated claims: the CreateVM annotations the adaptor plans from.

The webhook in the DRA-driver mode writes no GPUs (the scheduler had not allocated them yet);
at CreateVM the plugin's checkpoint has the claims prepared for the pod (the kubelet prepares
them before RunPodSandbox), and their devices become the VM's GPU count, model, product and,
for a share of a GPU, its memory: the same keys the annotation path writes, so placement,
selection and the device plan run unchanged. The pod's MIG devices stay on the annotation path;
one pod with both is refused (one VM is planned from one of them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from adaptor.dra.checkpoint import PreparedClaim
from providers.core.contract import (
    DEFAULT_GPU_MODEL,
    DEFAULT_GPUS,
    decode_capacity_type,
    decode_gpu_model,
    encode_gpu_model,
)
from providers.core.errors import InvalidRequest
from providers.dra.allocation import AllocatedDevice, gpu_intent

__all__ = ["dra_slot", "pod_devices", "with_allocated_gpus"]


def dra_slot(pool: str, device: str) -> str:
    """The device plan's name for one allocated device (never a container's name: those are
    DNS labels, without ':' or '/')."""
    return f"dra:{pool}/{device}"


def pod_devices(claims: Sequence[PreparedClaim]) -> list[AllocatedDevice]:
    """The pod's allocated devices in a fixed order (claims by UID, devices as allocated): the
    i-th is the VM's GPU i."""
    seen: set[tuple[str, str]] = set()
    out: list[AllocatedDevice] = []
    for claim in sorted(claims, key=lambda c: c.uid):
        for device in claim.devices:
            if (device.pool, device.device) not in seen:
                seen.add((device.pool, device.device))
                out.append(device)
    return out


def with_allocated_gpus(
    annotations: Mapping[str, str], claims: Sequence[PreparedClaim]
) -> dict[str, str]:
    """CreateVM's annotations with the GPUs of the pod's allocated devices (unchanged when it
    has none); InvalidRequest when they cannot be one VM's."""
    out = dict(annotations)
    devices = pod_devices(claims)
    if not devices:
        return out
    raw = annotations.get(DEFAULT_GPU_MODEL, "")
    written = decode_gpu_model(raw, int(annotations.get(DEFAULT_GPUS, "0") or 0))
    if written.mig or written.gpus:
        raise InvalidRequest(
            "the pod asks for GPUs through the device plugin's resources and has DRA-allocated "
            "GPUs; one pod VM is planned from one of them"
        )
    allocated = gpu_intent(devices)
    intent = written.model_copy(
        update={
            "gpus": allocated.gpus,
            "models": allocated.models,
            "products": allocated.products,
            "memory_mib": allocated.memory_mib,
            "fractional": allocated.fractional,
        }
    )
    out[DEFAULT_GPUS] = str(intent.gpus)
    encoded = encode_gpu_model(intent, decode_capacity_type(raw))
    if encoded:
        out[DEFAULT_GPU_MODEL] = encoded
    return out
