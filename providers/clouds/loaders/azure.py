"""The Azure catalog from Compute resource SKUs: every VM size usable in a location.

`resource_skus.list(filter="location eq '<region>'")` gives sizes with capabilities as strings and
a GPU count but never the GPU model, which comes from the size name (providers.core.gpus), as
does the
share of an A10 the NV*ads_A10_v5 sizes give. Restrictions are honoured: a size restricted in the
location is left out, zones restricted for it are dropped. RDMA sizes (RdmaEnabled, or an `r` in
the size's feature letters) have InfiniBand. Blocking: callers in an event loop use a thread.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from providers.clouds.loaders._common import Progress, import_sdk, report, require_region
from providers.core import prices
from providers.core.catalog import Arch, Catalog, GpuSpec, InstanceType
from providers.core.errors import CatalogError
from providers.core.gpus import azure_size_gpu, unknown_model_id
from providers.core.offers import apply_offer

__all__ = ["instance_type", "load_catalog"]

log = logging.getLogger(__name__)

# Standard_<series><vcpus><feature letters>[_<accelerator>][_v<n>]: the letters after the vCPU
# count (a, d, i, l, m, r, s, t, ...) say AMD, local disk, isolated, ..., RDMA.
_SIZE = re.compile(r"^(?:Standard_)?([A-Z]+)(\d+)(?:-\d+)?([a-z]*)(?:_.*)?$")


def load_catalog(
    region: str,
    *,
    client: Any = None,
    progress: Progress | None = None,
    subscription_id: str | None = None,
) -> Catalog:
    """Every VM size offered to this subscription in `region`, with GPUs, zones and RDMA."""
    require_region("azure", region, r"[a-z][a-z0-9]*", "eastus")
    if client is None:
        client = _client(subscription_id)
    errors = import_sdk("azure.core.exceptions", "azure")
    types: dict[str, InstanceType] = {}
    try:
        paged = client.resource_skus.list(filter=f"location eq '{region}'")
        for page in paged.by_page():
            items = list(page)
            report(progress, "resource SKUs", len(items))
            for sku in items:
                parsed = instance_type(sku, region)
                if parsed is None:
                    continue
                known = types.get(parsed.name)
                if known is not None:  # the same size listed twice: union the zones
                    zones = tuple(sorted(set(known.zones) | set(parsed.zones)))
                    parsed = known.model_copy(update={"zones": zones})
                types[parsed.name] = parsed
    except errors.AzureError as exc:
        raise CatalogError(f"azure {region}: listing resource SKUs failed: {exc}") from exc
    catalog = Catalog(
        cloud="azure",
        region=region,
        source="live",
        types=tuple(types[name] for name in sorted(types)),
    )
    return prices.with_prices(catalog)


def instance_type(sku: Any, region: str) -> InstanceType | None:
    """One ResourceSku as a catalog entry; None when it is not a VM size, not in `region` or is
    restricted there. A GPU whose model the size name does not tell is recorded as
    `unknown-<size>` (count known, memory 0), never dropped."""
    if _text(_get(sku, "resource_type", "resourceType")) != "virtualMachines":
        return None
    name = str(_get(sku, "name") or "")
    locations = {str(x).lower() for x in _get(sku, "locations") or ()}
    if not name or region.lower() not in locations:
        return None
    zones = _zones(sku, region)
    if zones is None:
        return None
    caps = _capabilities(_get(sku, "capabilities") or ())
    vcpus = _int(caps.get("vcpus"))
    memory_mib = round(_float(caps.get("memorygb")) * 1024)
    gpu_count = _int(caps.get("gpus"))
    gpu: GpuSpec | None = None
    if gpu_count > 0:
        found = azure_size_gpu(name)
        if found is None:
            model_id = unknown_model_id(re.sub(r"^Standard_", "", name))
            log.warning("azure: %s has %d GPUs of a model unknown here: recorded as %s",
                        name, gpu_count, model_id)  # fmt: skip
            gpu = GpuSpec(model=model_id, count=gpu_count, memory_mib=0)
        else:
            model, fraction = found
            gpu = GpuSpec(
                model=model.id,
                count=gpu_count,
                memory_mib=round(model.memory_mib * fraction),
                fraction=fraction,
            )
    parsed = InstanceType(
        name=name,
        vcpus=vcpus,
        memory_mib=memory_mib,
        arch=_arch(caps.get("cpuarchitecturetype", "")),
        gpu=gpu,
        rdma="infiniband" if _rdma(name, caps) else "",
        zones=zones,
        family=str(_get(sku, "family") or ""),
    )
    return apply_offer("azure", parsed)


def _zones(sku: Any, region: str) -> tuple[str, ...] | None:
    """Zones of `region` offering the size, minus restricted ones; None if the whole location is
    restricted. An empty tuple: the size is offered but not pinned to zones."""
    zones: set[str] = set()
    for info in _get(sku, "location_info", "locationInfo") or ():
        if str(_get(info, "location") or "").lower() == region.lower():
            zones.update(str(z) for z in _get(info, "zones") or ())
    for restriction in _get(sku, "restrictions") or ():
        kind = _text(_get(restriction, "type")).lower()
        info = _get(restriction, "restriction_info", "restrictionInfo")
        places = _get(info, "locations") or _get(restriction, "values") or ()
        where = {str(x).lower() for x in places}
        if where and region.lower() not in where:
            continue
        if kind == "location":
            return None
        if kind == "zone":
            zones.difference_update(str(z) for z in _get(info, "zones") or ())
    return tuple(sorted(zones))


def _rdma(name: str, caps: Mapping[str, str]) -> bool:
    if caps.get("rdmaenabled", "").lower() == "true":
        return True
    match = _SIZE.match(name)
    return bool(match and "r" in match.group(3))


def _arch(value: str) -> Arch:
    return "arm64" if value.lower() in ("arm64", "aarch64") else "x86_64"


def _capabilities(caps: Iterable[Any]) -> dict[str, str]:
    return {str(_get(c, "name")).lower(): str(_get(c, "value") or "") for c in caps}


def _get(obj: Any, *names: str) -> Any:
    """An attribute of an SDK model, or a key of its JSON form (recorded responses)."""
    if obj is None:
        return None
    for name in names:
        if isinstance(obj, Mapping):
            if name in obj:
                return obj[name]
        elif hasattr(obj, name):
            return getattr(obj, name)
    return None


def _text(value: Any) -> str:
    """A string field or the value of an SDK string enum."""
    return str(getattr(value, "value", value) or "")


def _int(value: str | None) -> int:
    try:
        return int(float(value or 0))
    except ValueError:
        return 0


def _float(value: str | None) -> float:
    try:
        return float(value or 0)
    except ValueError:
        return 0.0


def _client(subscription_id: str | None) -> Any:
    subscription = subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID", "")
    if not subscription:
        raise CatalogError("azure: set AZURE_SUBSCRIPTION_ID to list resource SKUs")
    compute = import_sdk("azure.mgmt.compute", "azure")
    identity = import_sdk("azure.identity", "azure")
    return compute.ComputeManagementClient(identity.DefaultAzureCredential(), subscription)
