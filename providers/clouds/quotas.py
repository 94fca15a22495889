"""Reading the cloud account's quotas and their usage, where each cloud's API offers them.

AWS: Service Quotas `GetServiceQuota` for EC2's running On-Demand vCPU quotas per instance class
(P; G and VT; DL; Standard), usage counted from the account's pending and running instances (the
quota counts every instance of the account in the region, not only this adaptor's). Azure:
`usage.list(location)`, the vCPU limit and current value of each VM family and of the region.
GCP: the region resource's `quotas` (`NVIDIA_H100_GPUS`, `PREEMPTIBLE_NVIDIA_H100_GPUS`, ...).
Blocking SDK calls: callers in an event loop use `AccountQuotaCache` (a thread). A quota the API
does not offer (an account without Service Quotas access, a test double without the service) is
a note, not an error: the per-node pool and the cloud's own refusal remain.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from providers.core.account_quota import AccountLimit, AccountQuota, instance_class
from providers.core.catalog import Catalog

__all__ = [
    "AWS_VCPU_QUOTAS",
    "GCP_GPU_METRICS",
    "account_reader",
    "aws_quota",
    "azure_quota",
    "gcp_quota",
]

log = logging.getLogger(__name__)

_STANDARD = ("a", "c", "d", "h", "i", "m", "r", "t", "z")
# EC2 quota code -> (instance classes it counts, its name, whether it counts Spot): Service
# Quotas, EC2 "Running On-Demand ... instances" and "All ... Spot Instance Requests", in vCPUs.
AWS_VCPU_QUOTAS: Mapping[str, tuple[tuple[str, ...], str, bool]] = {
    "L-417A185B": (("p",), "Running On-Demand P instances", False),
    "L-DB2E81BA": (("g", "gr", "vt"), "Running On-Demand G and VT instances", False),
    "L-1216C47A": (_STANDARD, "Running On-Demand Standard instances", False),
    "L-7212CCBC": (("p",), "All P Spot Instance Requests", True),
    "L-3819A6DF": (("g", "gr", "vt"), "All G and VT Spot Instance Requests", True),
    "L-34B43A08": (_STANDARD, "All Standard Spot Instance Requests", True),
    # DL (dl1, Gaudi): its own class, in none of the quotas above
    "L-6E869C2A": (("dl",), "Running On-Demand DL instances", False),
    "L-85EED4F7": (("dl",), "All DL Spot Instance Requests", True),
}

# GCP region quota metric (without PREEMPTIBLE_) -> canonical GPU model id.
GCP_GPU_METRICS: Mapping[str, str] = {
    "NVIDIA_T4_GPUS": "t4",
    "NVIDIA_V100_GPUS": "v100",
    "NVIDIA_P100_GPUS": "p100",
    "NVIDIA_P4_GPUS": "p4",
    "NVIDIA_A100_GPUS": "a100-40gb",
    "NVIDIA_A100_80GB_GPUS": "a100-80gb",
    "NVIDIA_L4_GPUS": "l4",
    "NVIDIA_H100_GPUS": "h100-80gb",
    "NVIDIA_H100_MEGA_GPUS": "h100-80gb",
    "NVIDIA_H200_GPUS": "h200",
    "NVIDIA_B200_GPUS": "b200",
    "NVIDIA_GB200_GPUS": "gb200",
    "NVIDIA_RTX_PRO_6000_GPUS": "rtx-pro-6000",
}

_LIVE = ("pending", "running")


def aws_quota(
    region: str, ec2: Any, service_quotas: Any, vcpus_of: Mapping[str, int]
) -> AccountQuota:
    """EC2's On-Demand and Spot vCPU quotas per class with the account's usage; `vcpus_of`
    gives each instance type's vCPUs (the catalog)."""
    used: dict[tuple[str, bool], float] = {}
    paginator = ec2.get_paginator("describe_instances")
    states = {"Name": "instance-state-name", "Values": list(_LIVE)}
    for page in paginator.paginate(Filters=[states]):
        for reservation in page.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                spot = instance.get("InstanceLifecycle") == "spot"
                name = str(instance.get("InstanceType", ""))
                key = (instance_class(name.split(".", 1)[0]), spot)
                used[key] = used.get(key, 0.0) + float(vcpus_of.get(name, 0))
    limits: list[AccountLimit] = []
    notes: list[str] = []
    for code, (classes, title, spot) in AWS_VCPU_QUOTAS.items():
        try:
            found = service_quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)
        except Exception as exc:  # NoSuchResource, AccessDenied: the quota is not readable
            notes.append(f"{code} ({title}): {_short(exc)}")
            continue
        value = float(found["Quota"]["Value"])
        total = sum(used.get((c, spot), 0.0) for c in classes)
        name = f"{code} {title}"
        limits.append(AccountLimit(name, "vcpus", "class", classes, value, total, spot))
    return AccountQuota("aws", region, tuple(limits), time.time(), tuple(notes))


def azure_quota(location: str, compute: Any) -> AccountQuota:
    """Every vCPU usage Azure reports for the location: per VM family and the regional total."""
    limits: list[AccountLimit] = []
    for item in compute.usage.list(location):
        name = str(getattr(item.name, "value", "") or "")
        limit, current = float(item.limit or 0), float(item.current_value or 0)
        if not name:
            continue
        key = name.lower()
        if key == "cores":
            limits.append(AccountLimit(name, "vcpus", "all", (), limit, current, spot=False))
        elif key == "lowprioritycores":
            limits.append(AccountLimit(name, "vcpus", "all", (), limit, current, spot=True))
        elif key.endswith("family"):
            limits.append(AccountLimit(name, "vcpus", "family", (key,), limit, current, False))
    return AccountQuota("azure", location, tuple(limits), time.time())


def gcp_quota(project: str, region: str, regions: Any) -> AccountQuota:
    """The region's GPU quotas (on demand and preemptible) with their usage."""
    found = regions.get(project=project, region=region)
    limits: list[AccountLimit] = []
    for quota in found.quotas:
        metric = str(quota.metric)
        spot = metric.startswith("PREEMPTIBLE_")
        model = GCP_GPU_METRICS.get(metric.removeprefix("PREEMPTIBLE_"))
        if model is None:
            continue
        limit, usage = float(quota.limit), float(quota.usage)
        limits.append(AccountLimit(metric, "gpus", "model", (model,), limit, usage, spot))
    return AccountQuota("gcp", region, tuple(limits), time.time())


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]


def account_reader(provider: Any, catalog: Catalog | None) -> Callable[[], AccountQuota] | None:
    """How to read `provider`'s account quotas (blocking), or None where its cloud offers none
    (static, local, an AWS endpoint override such as a test server)."""
    name = getattr(provider, "name", "")
    config = getattr(provider, "config", None)
    region = str(getattr(provider, "region", "") or "")
    if name == "aws" and config is not None and not getattr(config, "endpoint_url", ""):
        vcpus = {t.name: t.vcpus for t in catalog.types} if catalog is not None else {}

        def read_aws() -> AccountQuota:
            import boto3

            quotas = boto3.client("service-quotas", region_name=region)
            return aws_quota(region, provider.client, quotas, vcpus)

        return read_aws
    if name == "azure" and getattr(provider, "compute", None) is not None:
        return lambda: azure_quota(region, provider.compute)
    if name == "gcp" and config is not None:
        project = str(getattr(config, "project", "") or "")
        # the provider's own credentials; an injected client without real ones (a test's fake
        # transport) gets no reader: a new client would not be the fake's
        transport = getattr(getattr(provider, "client", None), "transport", None)
        credentials = getattr(transport, "_credentials", None)
        if credentials is None or type(credentials).__name__ == "AnonymousCredentials":
            return None

        def read_gcp() -> AccountQuota:
            from google.cloud import compute_v1

            regions = compute_v1.RegionsClient(credentials=credentials)
            return gcp_quota(project, region, regions)

        return read_gcp
    return None
