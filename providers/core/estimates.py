"""Price estimates for instance types no price source covers, so they rank by what they carry.

An unpriced type used to rank after every priced one, so a 1-GPU type of unknown price lost to an
8-GPU type costing 20 times more. Now such a type is ranked by an estimate: its GPUs at a per-GPU
reference rate plus its vCPUs and memory at general-purpose rates. Candidates say when their price
is an estimate (`peerpods select` prints `~$`), and a real price always wins a tie.

The per-GPU reference rates are the on-demand list price of the smallest instance that carries
one such GPU, less its host share, from the public price lists named in docs/gpus.md (AWS
us-east-1 where AWS sells the GPU, else Azure eastus, else GCP us-central1). A GPU model with no
reference rate is estimated from its memory at the median rate per GiB of the models that have
one, so a bigger unknown GPU never looks cheaper than a smaller known one.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from providers.core.catalog import InstanceType
from providers.core.gpus import GPU_MODELS

__all__ = [
    "GIB_HOURLY_USD",
    "GPU_HOURLY_USD",
    "VCPU_HOURLY_USD",
    "catalog_gpu_rates",
    "estimate_price",
    "gpu_hourly_usd",
]

# Host share: general-purpose on-demand rates (AWS m7i: $0.2016/h for 4 vCPUs and 16 GiB, split
# as GCP's published N2 ratio of vCPU to GiB price, about 7.5 : 1).
VCPU_HOURLY_USD = 0.0315
GIB_HOURLY_USD = 0.0042


# USD per GPU-hour, on-demand list price of the smallest single-GPU (or per-GPU) offering, host
# share removed (see the module docstring for the sources).
def _less_host(price: float, vcpus: int, memory_gib: int, gpus: float = 1) -> float:
    """Per-GPU rate of a list price once the host's vCPUs and memory are taken out."""
    return round((price - vcpus * VCPU_HOURLY_USD - memory_gib * GIB_HOURLY_USD) / gpus, 4)


GPU_HOURLY_USD: Mapping[str, float] = MappingProxyType(
    {
        "b300": _less_host(142.416, 192, 4096, 8),  # AWS p6-b300.48xlarge
        "b200": _less_host(113.9328, 192, 2048, 8),  # AWS p6-b200.48xlarge
        "gb200": _less_host(113.9328, 192, 2048, 8),  # no list price found: the B200 rate
        "h200": _less_host(63.296, 192, 2048, 8),  # AWS p5en.48xlarge
        "h100-80gb": _less_host(6.88, 16, 256),  # AWS p5.4xlarge
        "h100-nvl": _less_host(6.98, 40, 320),  # Azure Standard_NC40ads_H100_v5
        "a100-80gb": _less_host(27.44705, 96, 1152, 8),  # AWS p4de.24xlarge
        "a100-40gb": _less_host(21.957642, 96, 1152, 8),  # AWS p4d.24xlarge
        "rtx-pro-6000": _less_host(3.36, 8, 64),  # AWS g7e.2xlarge (us-east-2)
        "l40s": _less_host(1.861, 4, 32),  # AWS g6e.xlarge
        "a10g": _less_host(1.006, 4, 16),  # AWS g5.xlarge
        "a10": _less_host(1.006, 4, 16),  # the A10G's rate (same silicon, PCIe)
        "l4": _less_host(0.8048, 4, 16),  # AWS g6.xlarge
        "t4": _less_host(0.526, 4, 16),  # AWS g4dn.xlarge
        "t4g": _less_host(0.526, 4, 16),
        "v100": 2.48,  # GCP nvidia-tesla-v100, per GPU
        "v100-32gb": _less_host(31.212, 96, 768, 8),  # AWS p3dn.24xlarge
        "p100": 1.46,  # GCP nvidia-tesla-p100, per GPU
        "p4": 0.60,  # GCP nvidia-tesla-p4, per GPU
        "radeon-pro-v520": _less_host(0.37853, 4, 16),  # AWS g4ad.xlarge
        "gaudi-hl-205": _less_host(13.10904, 96, 768, 8),  # AWS dl1.24xlarge
    }
)

_PER_GIB = statistics.median(
    rate / (GPU_MODELS[model].memory_mib / 1024)
    for model, rate in GPU_HOURLY_USD.items()
    if model in GPU_MODELS and GPU_MODELS[model].memory_mib
)


def gpu_hourly_usd(model: str, memory_mib: int = 0) -> float:
    """The reference on-demand USD per hour of one GPU of `model` (by memory when unknown)."""
    rate = GPU_HOURLY_USD.get(model)
    if rate is not None:
        return rate
    known = GPU_MODELS.get(model)
    memory = memory_mib or (known.memory_mib if known is not None else 0)
    return round(_PER_GIB * memory / 1024, 4)


def _host(t: InstanceType) -> float:
    return t.vcpus * VCPU_HOURLY_USD + t.memory_mib / 1024 * GIB_HOURLY_USD


def catalog_gpu_rates(types: Iterable[InstanceType]) -> dict[str, float]:
    """Per-GPU rates the catalog's own prices imply (cheapest priced whole-GPU type of each
    model, host share removed): an unpriced type is estimated at its own cloud's GPU rate
    where the catalog prices that GPU elsewhere (GCP's unpriced a3-megagpu-8g at the rate of its
    priced a3-highgpu-8g), not at another cloud's."""
    rates: dict[str, float] = {}
    for t in types:
        g = t.gpu
        if t.price_per_hour is None or g is None or g.fraction < 1 or g.count < 1:
            continue
        rate = max((t.price_per_hour - _host(t)) / g.count, 0.0)
        if rate and rate < rates.get(g.model, float("inf")):
            rates[g.model] = rate
    for t in types:  # attached GPUs (GCP N1) priced per GPU
        for a in t.attachable_gpus:
            if a.price_per_hour is not None:
                rates[a.model] = min(rates.get(a.model, a.price_per_hour), a.price_per_hour)
    return rates


def estimate_price(
    t: InstanceType,
    attach: int = 0,
    attach_model: str | None = None,
    rates: Mapping[str, float] | None = None,
) -> float:
    """An on-demand USD per hour for a type with no known price: host share plus its GPUs (or
    the `attach` GPUs of `attach_model` for a type that attaches them), each GPU at the catalog's
    own rate for its model (`rates`, from catalog_gpu_rates) else the reference rate."""
    rates = rates or {}
    price = _host(t)
    if t.gpu is not None:
        rate = rates.get(t.gpu.model) or gpu_hourly_usd(t.gpu.model, t.gpu.memory_mib)
        price += t.gpu.count * t.gpu.fraction * rate
    if attach and attach_model is not None:
        price += attach * (rates.get(attach_model) or gpu_hourly_usd(attach_model))
    return round(price, 4)
