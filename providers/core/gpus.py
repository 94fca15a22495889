"""Canonical GPU models and the one table of every name a GPU goes by.

Clouds, drivers and users name the same GPU differently: AWS says "A100" for both the 40 and the
80 GB part (only the memory tells them apart), Azure hides the model in a size name
(`NC24ads_A100_v4`), GCP says `nvidia-tesla-a100`, NVIDIA's DRA driver says
"NVIDIA A100-SXM4-80GB", users type `a100-80gb` or `H100 80GB`. Everything resolves here to one
`GpuModel` with a canonical id; catalogs and requests carry only canonical ids.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from providers.core.errors import InvalidRequest
from providers.core.mig import MIG_PROFILES, MigProfileSpec

__all__ = [
    "COMPUTE_CAPABILITY",
    "GPU_MODELS",
    "UNKNOWN_PREFIX",
    "GpuModel",
    "aws_gpu",
    "azure_size_gpu",
    "gcp_accelerator_gpu",
    "models_matching",
    "normalize",
    "require_nvidia",
    "resolve_gpu",
    "unknown_model_id",
]

GIB = 1024


@dataclass(frozen=True)
class GpuModel:
    """One GPU model with the facts selection needs."""

    id: str
    vendor: str
    product_name: str  # as NVIDIA's DRA driver publishes it
    architecture: str
    memory_mib: int  # per GPU, as the driver reports it (the one figure for every cloud)
    mig_profiles: tuple[MigProfileSpec, ...] = ()
    mig_capable: bool = False  # True also where the profile table is not known here

    @property
    def family(self) -> str:
        """The name users type for any variant ("a100" for both A100s)."""
        return _FAMILY.get(self.id, self.id)


def _model(
    id: str, vendor: str, product: str, arch: str, memory_mib: int, mig: bool = False
) -> GpuModel:
    profiles = MIG_PROFILES.get(id, ())
    return GpuModel(id, vendor, product, arch, memory_mib, profiles, mig or bool(profiles))


# Memory per GPU in MiB as the driver reports it, the one figure every cloud's catalog uses.
# "aws": EC2 DescribeInstanceTypes `GpuInfo.Gpus[].MemoryInfo.SizeInMiB` (moto bundles the real
# records; tests/providers/test_gpu_memory.py compares them). "spec": the GiB figure of the
# cloud's size table or NVIDIA's datasheet, where no cloud API reports one (Azure and GCP give
# none). NVIDIA's "180 GB" B200 and "186 GB" GB200 are decimal-ish marketing figures: the driver
# reports 183359 and 189440 MiB, never 180 or 186 GiB.
_ALL = (
    _model("b300", "NVIDIA", "NVIDIA B300 SXM6 AC", "Blackwell", 275040, mig=True),  # aws
    _model("b200", "NVIDIA", "NVIDIA B200", "Blackwell", 183359),  # aws p6-b200
    _model("gb200", "NVIDIA", "NVIDIA GB200", "Blackwell", 189440, mig=True),  # aws p6e-gb200
    _model("rtx-pro-6000", "NVIDIA", "NVIDIA RTX PRO 6000 Blackwell Server Edition",
           "Blackwell", 98304, mig=True),  # aws g7e
    _model("rtx-pro-4500", "NVIDIA", "NVIDIA RTX PRO 4500 Blackwell Server Edition",
           "Blackwell", 32 * GIB),  # spec
    _model("h200", "NVIDIA", "NVIDIA H200", "Hopper", 144384),  # aws p5e/p5en
    _model("gh200", "NVIDIA", "NVIDIA GH200 480GB", "Hopper", 96 * GIB, mig=True),  # spec
    _model("h100-80gb", "NVIDIA", "NVIDIA H100 80GB HBM3", "Hopper", 81920),  # aws p5
    _model("h100-nvl", "NVIDIA", "NVIDIA H100 NVL", "Hopper", 94 * GIB),  # spec (Azure NC H100 v5)
    _model("a100-80gb", "NVIDIA", "NVIDIA A100-SXM4-80GB", "Ampere", 81920),  # aws p4de
    _model("a100-40gb", "NVIDIA", "NVIDIA A100-SXM4-40GB", "Ampere", 40960),  # aws p4d
    _model("a30", "NVIDIA", "NVIDIA A30", "Ampere", 24 * GIB),  # spec
    _model("a10g", "NVIDIA", "NVIDIA A10G", "Ampere", 22888),  # aws g5
    _model("a10", "NVIDIA", "NVIDIA A10", "Ampere", 24 * GIB),  # spec (Azure NVadsA10 v5)
    _model("l40s", "NVIDIA", "NVIDIA L40S", "Ada Lovelace", 45776),  # aws g6e
    _model("l40", "NVIDIA", "NVIDIA L40", "Ada Lovelace", 48 * GIB),  # spec
    _model("l4", "NVIDIA", "NVIDIA L4", "Ada Lovelace", 22888),  # aws g6
    _model("t4", "NVIDIA", "Tesla T4", "Turing", 16384),  # aws g4dn
    _model("t4g", "NVIDIA", "NVIDIA T4G", "Turing", 16384),  # aws g5g
    _model("v100-32gb", "NVIDIA", "Tesla V100-SXM2-32GB", "Volta", 32768),  # aws p3dn
    _model("v100", "NVIDIA", "Tesla V100-SXM2-16GB", "Volta", 16 * GIB),  # spec
    _model("p100", "NVIDIA", "Tesla P100-PCIE-16GB", "Pascal", 16 * GIB),  # spec
    _model("p40", "NVIDIA", "Tesla P40", "Pascal", 24 * GIB),  # spec
    _model("p4", "NVIDIA", "Tesla P4", "Pascal", 8 * GIB),  # spec
    _model("m60", "NVIDIA", "Tesla M60", "Maxwell", 8 * GIB),  # spec
    _model("k80", "NVIDIA", "Tesla K80", "Kepler", 12 * GIB),  # spec
    _model("radeon-pro-v520", "AMD", "Radeon Pro V520", "RDNA", 8192),  # aws g4ad
    _model("radeon-instinct-mi25", "AMD", "Radeon Instinct MI25", "Vega", 16 * GIB),  # spec
    _model("mi300x", "AMD", "AMD Instinct MI300X", "CDNA3", 192 * GIB),  # spec
    _model("gaudi-hl-205", "Habana", "Gaudi HL-205", "Gaudi", 32768),  # aws dl1
)  # fmt: skip

GPU_MODELS: Mapping[str, GpuModel] = MappingProxyType({m.id: m for m in _ALL})

# CUDA compute capability per model (NVIDIA's DRA driver publishes it as a version attribute).
COMPUTE_CAPABILITY: Mapping[str, tuple[int, int, int]] = {
    "b300": (10, 3, 0), "b200": (10, 0, 0), "gb200": (10, 0, 0), "rtx-pro-6000": (12, 0, 0),
    "h200": (9, 0, 0), "gh200": (9, 0, 0), "h100-80gb": (9, 0, 0), "h100-nvl": (9, 0, 0),
    "a100-80gb": (8, 0, 0), "a100-40gb": (8, 0, 0), "a30": (8, 0, 0), "a10g": (8, 6, 0),
    "a10": (8, 6, 0), "l40s": (8, 9, 0), "l40": (8, 9, 0), "l4": (8, 9, 0), "t4": (7, 5, 0),
    "t4g": (7, 5, 0), "v100-32gb": (7, 0, 0), "v100": (7, 0, 0), "p100": (6, 0, 0),
    "p40": (6, 1, 0), "p4": (6, 1, 0), "m60": (5, 2, 0), "k80": (3, 7, 0),
}  # fmt: skip

# Family names: what a user means by the bare name (every variant), and which variant a bare
# name resolves to when one model must be picked without a memory figure.
_FAMILIES: dict[str, tuple[str, ...]] = {
    "a100": ("a100-40gb", "a100-80gb"),
    "h100": ("h100-80gb", "h100-nvl"),
    "v100": ("v100", "v100-32gb"),
    "t4": ("t4", "t4g"),  # T4G: the T4 of Graviton hosts
}
_FAMILY = {variant: family for family, variants in _FAMILIES.items() for variant in variants}

# Tokens that say nothing about which model it is (form factor, memory technology, vendor).
_NOISE = frozenset(
    [
        "nvidia",
        "tesla",
        "amd",
        "habana",
        "geforce",
        "sxm",
        "sxm2",
        "sxm3",
        "sxm4",
        "sxm5",
        "pcie",
        "hbm2",
        "hbm2e",
        "hbm3",
        "hbm3e",
        "gpu",
        "server",
        "edition",
        "vws",
    ]
)


def normalize(name: str) -> str:
    """A comparison key: lower case, `-` separated, vendor and form-factor words dropped."""
    tokens = re.split(r"[\s_/,-]+", name.strip().lower())
    return "-".join(t for t in tokens if t and t not in _NOISE)


# Every other spelling (already normalised, or written so normalize() maps it) -> model id.
_ALIASES: dict[str, str] = {
    # user shorthand and NVIDIA product names
    "h100-80gb": "h100-80gb", "h100-mega-80gb": "h100-80gb", "h100-mega": "h100-80gb",
    "h100-nvl": "h100-nvl", "h100-nvl-94gb": "h100-nvl", "h100-94gb": "h100-nvl",
    "h100-96gb": "gh200", "gh200-480gb": "gh200", "gh200": "gh200",
    "h200": "h200", "h200-141gb": "h200", "h200-nvl": "h200",
    "b200": "b200", "b200-180gb": "b200", "b300": "b300", "gb200": "gb200",
    "a100-80gb": "a100-80gb", "a100-40gb": "a100-40gb",
    "a30": "a30", "a30-24gb": "a30",
    "a10g": "a10g", "a10": "a10", "a10-24gb": "a10",
    "l40s": "l40s", "l40s-48gb": "l40s", "l40": "l40", "l4": "l4", "l4-24gb": "l4",
    "t4": "t4", "t4-16gb": "t4", "t4g": "t4g",
    "v100-16gb": "v100", "v100-32gb": "v100-32gb",
    "p100": "p100", "p100-16gb": "p100", "p40": "p40", "p4": "p4", "m60": "m60", "k80": "k80",
    "rtx-pro-6000": "rtx-pro-6000", "rtx-pro-6000-blackwell": "rtx-pro-6000",
    "rtx-pro-server-6000": "rtx-pro-6000",
    "rtx-pro-4500": "rtx-pro-4500", "rtx-pro-4500-blackwell": "rtx-pro-4500",
    "rtx-pro-server-4500": "rtx-pro-4500",
    "radeon-pro-v520": "radeon-pro-v520", "v520": "radeon-pro-v520",
    "radeon-instinct-mi25": "radeon-instinct-mi25", "mi25": "radeon-instinct-mi25",
    "instinct-mi300x": "mi300x", "mi300x": "mi300x",
    "gaudi-hl-205": "gaudi-hl-205", "gaudi": "gaudi-hl-205",
    # GCP accelerator types (normalize() drops "nvidia"/"tesla"/"vws")
    "a100": "a100-40gb",
    "h100": "h100-80gb",
    "v100": "v100",
}  # fmt: skip
for _m in _ALL:
    _ALIASES.setdefault(normalize(_m.product_name), _m.id)
    _ALIASES.setdefault(_m.id, _m.id)


def _by_memory(family: str, memory_mib: int) -> GpuModel | None:
    """The family variant whose nominal memory is nearest to a reported figure."""
    variants = [GPU_MODELS[v] for v in _FAMILIES.get(family, ())]
    if not variants:
        return None
    return min(variants, key=lambda m: (abs(m.memory_mib - memory_mib), m.id))


def resolve_gpu(name: str, memory_mib: int | None = None) -> GpuModel:
    """The canonical model for any name; `memory_mib` picks the variant of a family name."""
    key = normalize(name)
    if memory_mib and key in _FAMILIES:
        found = _by_memory(key, memory_mib)
        if found is not None:
            return found
    model_id = _ALIASES.get(key)
    if model_id is None:
        raise InvalidRequest(f"unknown GPU model {name!r}")
    return GPU_MODELS[model_id]


UNKNOWN_PREFIX = "unknown-"


def unknown_model_id(name: str) -> str:
    """The id a catalog records for a GPU this version does not know (`unknown-<name>`): the
    type stays listed, with its count and memory, but no request for a known model matches it
    and `nvidia.com/gpu` never selects it (only named, known NVIDIA models do)."""
    return UNKNOWN_PREFIX + (normalize(name) or "gpu")


def models_matching(name: str) -> frozenset[str]:
    """Canonical ids a user's name accepts: a family name ("a100", "h100") means every variant."""
    key = normalize(name)
    if key in _FAMILIES:
        return frozenset(_FAMILIES[key])
    return frozenset({resolve_gpu(name).id})


def require_nvidia(names: tuple[str, ...]) -> tuple[str, ...]:
    """A pod's acceptable GPU models less those not NVIDIA's (AMD MI300X, Radeon, Gaudi): a
    pod's GPUs are NVIDIA devices end to end (`nvidia.com/gpu`, `gpu.nvidia.com` claims, CDI
    `nvidia.com/gpu=N`, NVML in the pod VM), so such a type could never serve it. When every
    model named is another vendor's the pod is refused (InvalidRequest) saying so."""
    kept: list[str] = []
    refused: GpuModel | None = None
    for name in names:
        models = [GPU_MODELS[m] for m in models_matching(name)]
        if models and all(m.vendor != "NVIDIA" for m in models):
            refused = refused or models[0]
        else:
            kept.append(name)
    if refused is not None and not kept:
        vendor = refused.vendor
        raise InvalidRequest(
            f"GPU model {refused.id!r} is {vendor}'s ({refused.product_name}): pod GPUs are "
            f"NVIDIA devices (nvidia.com/gpu, CDI nvidia.com/gpu), so no {vendor} instance "
            "type can serve this pod"
        )
    return tuple(kept)


def aws_gpu(name: str, memory_mib: int) -> GpuModel:
    """AWS `GpuInfo.Gpus[].Name` plus its `MemoryInfo.SizeInMiB` (p4d vs p4de: 40 vs 80 GB)."""
    key = normalize(name)
    if key in _FAMILIES and memory_mib:
        found = _by_memory(key, memory_mib)
        if found is not None:
            return found
    return resolve_gpu(name)


# Azure size names: Standard_<series><vcpus><features>_<gpu>_<version>; the model is named in
# the size except in older series, listed by pattern here (first match wins).
_AZURE_SERIES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), model)
    for pattern, model in (
        (r"^ND\d+asr_v4$", "a100-40gb"),
        (r"^ND\d+a?m?sr_A100_v4$", "a100-80gb"),
        (r"^NC\d+ads_A100_v4$", "a100-80gb"),
        (r"^NCC?\d+a?d?i?s_H100_v5$", "h100-nvl"),
        (r"^ND\d+i?s?r_H100_v5$", "h100-80gb"),
        (r"^ND\d+i?s?r_H200_v5$", "h200"),
        (r"^ND\d+i?s?r_MI300X_v5$", "mi300x"),
        (r"^ND\d+i?s?r_(?:NDR_)?GB200_v6$", "gb200"),
        (r"^NC\d+as_T4_v3$", "t4"),
        (r"^NC\d+ads_A10_v4$", "a10"),
        (r"^NV\d+ads_A10_v5$", "a10"),
        (r"^NC\d+r?s_v3$", "v100"),
        (r"^ND\d+r?s_v2$", "v100-32gb"),
        (r"^NC\d+r?s_v2$", "p100"),
        (r"^ND\d+r?s$", "p40"),
        (r"^NC\d+r?$", "k80"),
        (r"^NV\d+s?_v3$", "m60"),
        (r"^NV\d+$", "m60"),
        (r"^NV\d+as_v4$", "radeon-instinct-mi25"),
    )
)
# NV*ads_A10_v5 slices one A10 by vCPU count (docs/gpus.md, section 2):
# 6 -> 1/6, 12 -> 1/3, 18 -> 1/2.
_A10_V5_FRACTION = {6: 1 / 6, 12: 1 / 3, 18: 1 / 2}


def azure_size_gpu(size_name: str) -> tuple[GpuModel, float] | None:
    """GPU model and the share of one GPU a size gives, from its name; None if it has no GPU."""
    size = re.sub(r"^Standard_", "", size_name.strip(), flags=re.IGNORECASE)
    for pattern, model_id in _AZURE_SERIES:
        if pattern.match(size):
            fraction = 1.0
            match = re.match(r"^NV(\d+)ads_A10_v5$", size, re.IGNORECASE)
            if match:
                fraction = _A10_V5_FRACTION.get(int(match.group(1)), 1.0)
            return GPU_MODELS[model_id], fraction
    return None


def gcp_accelerator_gpu(accelerator_type: str) -> GpuModel:
    """The model behind a GCP accelerator type (`nvidia-tesla-a100` is the 40 GB part)."""
    name = accelerator_type.strip().rsplit("/", 1)[-1]
    if not name.lower().startswith("nvidia-"):
        raise InvalidRequest(f"unknown GPU model {accelerator_type!r}")
    return resolve_gpu(name)
