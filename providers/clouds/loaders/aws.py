"""The AWS catalog from EC2's own listings: every instance type offered in a region's zones.

`describe_instance_types` has no server-side GPU filter, so every type is fetched (pages of 100)
and GPUs are read locally from `GpuInfo`; `describe_instance_type_offerings` by availability zone
says where each is offered, and a type offered in no zone of the region is left out. Blocking:
callers in an event loop run `load_catalog` in a thread.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from providers.clouds.loaders._common import Progress, import_sdk, report, require_region
from providers.core import prices
from providers.core.catalog import Arch, Catalog, GpuSpec, InstanceType
from providers.core.errors import CatalogError, InvalidRequest
from providers.core.gpus import aws_gpu, unknown_model_id
from providers.core.offers import apply_offer

__all__ = ["instance_type", "load_catalog"]

log = logging.getLogger(__name__)

_TYPES_PAGE = 100  # the API's maximum for DescribeInstanceTypes
_OFFERINGS_PAGE = 1000  # ... and for DescribeInstanceTypeOfferings


def load_catalog(region: str, *, client: Any = None, progress: Progress | None = None) -> Catalog:
    """Every EC2 instance type offered in `region`, with GPUs, EFA, zones and known prices."""
    require_region("aws", region, r"[a-z]{2}(-[a-z]+)+-\d+", "us-east-1")
    if client is None:
        client = _client(region)
    botocore = import_sdk("botocore.exceptions", "aws")
    try:
        zones = _offerings(client, progress)
        types = []
        listing = _pages(
            client.describe_instance_types,
            "InstanceTypes",
            _TYPES_PAGE,
            {},
            lambda n: report(progress, "instance types", n),
        )
        for raw in listing:
            offered = zones.get(raw.get("InstanceType", ""))
            if not offered:
                continue
            parsed = instance_type(raw, offered)
            if parsed is not None:
                types.append(parsed)
    except (botocore.BotoCoreError, botocore.ClientError) as exc:
        raise CatalogError(f"aws {region}: listing instance types failed: {exc}") from exc
    catalog = Catalog(
        cloud="aws", region=region, source="live", types=tuple(sorted(types, key=_name))
    )
    return prices.with_prices(catalog)


def instance_type(raw: Mapping[str, Any], zones: tuple[str, ...] = ()) -> InstanceType | None:
    """One `DescribeInstanceTypes` record as a catalog entry; None for a type no pod VM can use
    (Mac hosts). A GPU this version does not know is recorded as `unknown-<name>`, not dropped."""
    name = str(raw["InstanceType"])
    arch = _arch(raw.get("ProcessorInfo", {}).get("SupportedArchitectures", []))
    if arch is None:
        return None
    gpu = _gpu(raw.get("GpuInfo"), name)
    network = raw.get("NetworkInfo", {})
    efa = bool(network.get("EfaSupported"))
    parsed = InstanceType(
        name=name,
        vcpus=int(raw.get("VCpuInfo", {}).get("DefaultVCpus", 0)),
        memory_mib=int(raw.get("MemoryInfo", {}).get("SizeInMiB", 0)),
        arch=arch,
        gpu=gpu,
        rdma="efa" if efa else "",
        efa_interfaces=int(network.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0)) if efa else 0,
        zones=zones,
        family=name.split(".", 1)[0],
    )
    return apply_offer("aws", parsed)


def _arch(supported: list[str]) -> Arch | None:
    if "x86_64" in supported:
        return "x86_64"
    if "arm64" in supported:
        return "arm64"
    return None  # x86_64_mac, arm64_mac: dedicated Mac hosts


def _gpu(info: Mapping[str, Any] | None, type_name: str = "") -> GpuSpec | None:
    """GpuInfo as one GpuSpec. A partitioned GPU (g6f, gr6f) reports Count 0, LogicalGpuCount 1
    and a GpuPartitionSize: one GPU at that fraction, with the memory of the slice."""
    gpus = (info or {}).get("Gpus") or []
    if not gpus:
        return None
    first = gpus[0]
    memory_mib = int(first.get("MemoryInfo", {}).get("SizeInMiB", 0))
    try:
        model_id = aws_gpu(str(first.get("Name", "")), memory_mib).id
    except InvalidRequest:
        model_id = unknown_model_id(str(first.get("Name", "")))
        log.warning("aws: %s has GPU %r, unknown here: recorded as %s", type_name,
                    first.get("Name"), model_id)  # fmt: skip
    count = sum(int(g.get("Count", 0)) for g in gpus if g.get("Name") == first.get("Name"))
    fraction = float(first.get("GpuPartitionSize") or 1.0)
    if count == 0:
        count = max(int(first.get("LogicalGpuCount", 0)), 1)
        if fraction >= 1.0:
            return None  # no GPU after all
    return GpuSpec(model=model_id, count=count, memory_mib=memory_mib, fraction=min(fraction, 1.0))


def _offerings(client: Any, progress: Progress | None) -> dict[str, tuple[str, ...]]:
    """Instance type -> the availability zones of the client's region that offer it."""
    zones: dict[str, set[str]] = defaultdict(set)
    stage = "zone offerings"
    for offering in _pages(
        client.describe_instance_type_offerings,
        "InstanceTypeOfferings",
        _OFFERINGS_PAGE,
        {"LocationType": "availability-zone"},
        lambda n: report(progress, stage, n),
    ):
        zones[offering["InstanceType"]].add(offering["Location"])
    return {name: tuple(sorted(found)) for name, found in zones.items()}


def _pages(
    call: Any,
    key: str,
    page_size: int,
    kwargs: dict[str, Any],
    on_page: Callable[[int], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Follow NextToken to the end, yielding the items under `key`."""
    token: str | None = None
    seen: set[str] = set()
    while True:
        request = {**kwargs, "MaxResults": page_size}
        if token:
            request["NextToken"] = token
        page = call(**request)
        items = page.get(key, [])
        if on_page is not None:
            on_page(len(items))
        yield from items
        token = page.get("NextToken")
        if not token:
            return
        if token in seen:
            raise CatalogError(f"aws: {key} pagination repeats a NextToken")
        seen.add(token)


def _client(region: str) -> Any:
    boto3 = import_sdk("boto3", "aws")
    return boto3.client("ec2", region_name=region)


def _name(t: InstanceType) -> str:
    return t.name
