"""The GCP catalog from Compute Engine machine types and accelerator types, zone by zone.

A2/A3/A4/G2 machine types carry their GPUs (`accelerators`); N1 types take GPUs attached at
creation instead: `attachable_gpus` lists the T4, V100, P100 and P4 the type's zones offer, with
the counts GCP allows (1, 2, 4, 8 up to the accelerator's `maximum_cards_per_instance`, and within
the vCPU and memory limits GCP sets for each count). Blocking: callers in an event loop use a
thread.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from providers.clouds.loaders._common import Progress, import_sdk, report, require_region
from providers.core import prices
from providers.core.catalog import Arch, AttachableGpu, Catalog, GpuSpec, InstanceType
from providers.core.errors import CatalogError, InvalidRequest
from providers.core.gpus import GPU_MODELS, GpuModel, gcp_accelerator_gpu, unknown_model_id
from providers.core.offers import apply_offer

__all__ = ["GcpClients", "instance_type", "load_catalog"]

log = logging.getLogger(__name__)

_ATTACH_COUNTS = (1, 2, 4, 8)
# GPUs an N1 machine type can attach, and per count the most vCPUs and memory (GB) the machine
# may have with them (GCP's N1 GPU limits).
_N1_LIMITS: dict[str, dict[int, tuple[int, int]]] = {
    "t4": {1: (48, 312), 2: (48, 312), 4: (96, 624)},
    "p4": {1: (24, 156), 2: (48, 312), 4: (96, 624)},
    "v100": {1: (12, 78), 2: (24, 156), 4: (48, 312), 8: (96, 624)},
    "p100": {1: (16, 104), 2: (32, 208), 4: (64, 208)},
}
_ARM_FAMILIES = frozenset({"t2a", "c4a", "a4x"})
# Machine series whose GPU NICs do GPUDirect RDMA over RoCE (GCP's A3 Ultra, A4 and A4X: the
# accelerator-optimized machine docs); the MachineType resource does not say so.
_ROCE_PREFIXES = ("a3-ultragpu-", "a4-highgpu-", "a4x-highgpu-")
_GONE = frozenset({"OBSOLETE", "DELETED"})


@dataclass(frozen=True)
class GcpClients:
    """The three `compute_v1` clients a listing needs (any object with their methods will do)."""

    regions: Any
    machine_types: Any
    accelerator_types: Any


def load_catalog(
    region: str,
    *,
    client: GcpClients | None = None,
    progress: Progress | None = None,
    project: str | None = None,
) -> Catalog:
    """Every machine type offered in the zones of `region`, with bundled or attachable GPUs."""
    require_region("gcp", region, r"[a-z]+-[a-z]+\d+", "us-central1")
    clients = client or _clients()
    exceptions = import_sdk("google.api_core.exceptions", "gcp")
    auth_exceptions = import_sdk("google.auth.exceptions", "gcp")
    project = project or _project()
    try:
        found = clients.regions.get(project=project, region=region)
        zones = sorted(str(z).rsplit("/", 1)[-1] for z in found.zones)
        raw_types: dict[str, Any] = {}
        type_zones: dict[str, list[str]] = {}
        attachable: dict[str, dict[str, int]] = {}  # zone -> GPU model id -> max cards
        for zone in zones:
            attachable[zone] = _accelerators(clients, project, zone, progress)
            for item in _listed(
                clients.machine_types.list(project=project, zone=zone),
                f"machine types {zone}",
                progress,
            ):
                if _deprecated(item):
                    continue
                raw_types.setdefault(item.name, item)
                type_zones.setdefault(item.name, []).append(zone)
    except (exceptions.GoogleAPIError, auth_exceptions.GoogleAuthError) as exc:
        raise CatalogError(f"gcp {region}: listing machine types failed: {exc}") from exc
    types = []
    for name in sorted(raw_types):
        parsed = instance_type(raw_types[name], tuple(type_zones[name]), attachable)
        if parsed is not None:
            types.append(parsed)
    catalog = Catalog(cloud="gcp", region=region, source="live", types=tuple(types))
    return prices.with_prices(catalog)


def instance_type(
    item: Any, zones: tuple[str, ...], attachable: dict[str, dict[str, int]] | None = None
) -> InstanceType | None:
    """One MachineType (with the zones listing it) as a catalog entry; a GPU this version does
    not know is recorded as `unknown-<type>`. `attachable` maps zone -> attachable GPU model id ->
    maximum cards."""
    name = str(item.name)
    family = name.split("-", 1)[0]
    gpu: GpuSpec | None = None
    accelerators = list(item.accelerators)
    if accelerators:
        first = accelerators[0]
        accelerator = str(first.guest_accelerator_type)
        try:
            model_id, memory = (m := gcp_accelerator_gpu(accelerator)).id, m.memory_mib
        except InvalidRequest:
            short = accelerator.rsplit("/", 1)[-1]
            if not short.lower().startswith("nvidia-"):  # a TPU host: no GPU a pod can use
                log.warning("gcp: skipping %s: accelerator %s is not a GPU", name, short)
                return None
            model_id, memory = unknown_model_id(short), 0
            log.warning("gcp: %s has accelerator %s, unknown here: recorded as %s",
                        name, accelerator, model_id)  # fmt: skip
        count = sum(int(a.guest_accelerator_count) for a in accelerators)
        if count > 0:
            gpu = GpuSpec(model=model_id, count=count, memory_mib=memory)
    memory_mib = int(item.memory_mb)
    vcpus = int(item.guest_cpus)
    attach: tuple[AttachableGpu, ...] = ()
    if family == "n1" and attachable:
        attach = _attachable(vcpus, memory_mib, zones, attachable)
    parsed = InstanceType(
        name=name,
        vcpus=vcpus,
        memory_mib=memory_mib,
        arch=_arch(str(getattr(item, "architecture", "") or ""), family),
        gpu=gpu,
        attachable_gpus=attach,
        rdma="roce" if name.startswith(_ROCE_PREFIXES) else "",
        zones=zones,
        family=family,
    )
    return apply_offer("gcp", parsed)


def _attachable(
    vcpus: int, memory_mib: int, zones: tuple[str, ...], attachable: dict[str, dict[str, int]]
) -> tuple[AttachableGpu, ...]:
    """The GPUs an N1 type can attach, each with its allowed counts and the zones offering it."""
    offered: dict[str, tuple[int, list[str]]] = {}
    for zone in zones:
        for model_id, max_cards in attachable.get(zone, {}).items():
            best, where = offered.get(model_id, (0, []))
            offered[model_id] = (max(best, max_cards), [*where, zone])
    result = []
    for model_id in sorted(offered):
        max_cards, where = offered[model_id]
        limits = _N1_LIMITS[model_id]
        counts = tuple(
            c
            for c in _ATTACH_COUNTS
            if c <= max_cards
            and c in limits
            and vcpus <= limits[c][0]
            and memory_mib <= limits[c][1] * 1024
        )
        if counts:
            model = GPU_MODELS[model_id]
            in_zones = () if len(where) == len(zones) else tuple(where)
            result.append(
                AttachableGpu(
                    model=model.id, memory_mib=model.memory_mib, counts=counts, zones=in_zones
                )
            )
    return tuple(result)


def _accelerators(
    clients: GcpClients, project: str, zone: str, progress: Progress | None
) -> dict[str, int]:
    """N1-attachable GPU model id -> maximum cards per instance, for one zone."""
    found: dict[str, int] = {}
    for item in _listed(
        clients.accelerator_types.list(project=project, zone=zone),
        f"accelerator types {zone}",
        progress,
    ):
        if _deprecated(item):
            continue
        try:
            model: GpuModel = gcp_accelerator_gpu(str(item.name))
        except InvalidRequest:
            continue  # a TPU or a GPU this version does not know: nothing to attach to N1
        if model.id in _N1_LIMITS:
            cards = int(item.maximum_cards_per_instance)
            found[model.id] = max(found.get(model.id, 0), cards)
    return found


def _listed(pager: Any, stage: str, progress: Progress | None) -> Iterable[Any]:
    """Items of a list pager, reporting each page."""
    pages = getattr(pager, "pages", None)
    if pages is None:  # a plain iterable
        items = list(pager)
        report(progress, stage, len(items))
        yield from items
        return
    for page in pages:
        items = list(page.items)
        report(progress, stage, len(items))
        yield from items


def _deprecated(item: Any) -> bool:
    deprecated = getattr(item, "deprecated", None)
    state = str(getattr(deprecated, "state", "") or "") if deprecated else ""
    return state in _GONE


def _arch(value: str, family: str) -> Arch:
    if value.upper() == "ARM64" or (value.upper() != "X86_64" and family in _ARM_FAMILIES):
        return "arm64"
    return "x86_64"


def _project() -> str:
    for var in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "GCLOUD_PROJECT"):
        if os.environ.get(var):
            return os.environ[var]
    auth = import_sdk("google.auth", "gcp")
    try:
        _credentials, project = auth.default()
    except Exception as exc:
        raise CatalogError(f"gcp: no credentials to list machine types: {exc}") from exc
    if not project:
        raise CatalogError("gcp: set GOOGLE_CLOUD_PROJECT to list machine types")
    return str(project)


def _clients() -> GcpClients:
    compute = import_sdk("google.cloud.compute_v1", "gcp")
    try:
        return GcpClients(
            regions=compute.RegionsClient(),
            machine_types=compute.MachineTypesClient(),
            accelerator_types=compute.AcceleratorTypesClient(),
        )
    except Exception as exc:  # google.auth.exceptions.DefaultCredentialsError and kin
        raise CatalogError(f"gcp: cannot create Compute Engine clients: {exc}") from exc
