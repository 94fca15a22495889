"""Extended resources a pod asks of NVIDIA's device plugin and RDMA plugins, as device units.

`nvidia.com/gpu: N` is N whole GPUs; `nvidia.com/mig-<profile>` (the device plugin's "mixed"
strategy, "+" written as ".") is MIG devices of that profile; `rdma/<anything>` and
`vpc.amazonaws.com/efa` are RDMA NICs. None of these exist on a worker node running peer pods,
so all are translated, then removed from the pod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from providers.core.contract import DeviceUnit
from providers.core.errors import InvalidRequest

GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
EFA = "vpc.amazonaws.com/efa"
RDMA_PREFIX = "rdma/"
_PROFILE = re.compile(r"^([0-9]+g\.[0-9]+gb)(\.me)?$")


def is_device_resource(name: str) -> bool:
    """A resource this module translates (and the webhook removes)."""
    return name in (GPU, EFA) or name.startswith((MIG_PREFIX, RDMA_PREFIX))


def mig_profile(resource: str) -> str:
    """`nvidia.com/mig-1g.10gb.me` -> `1g.10gb+me`; InvalidRequest for a malformed name."""
    match = _PROFILE.fullmatch(resource[len(MIG_PREFIX) :])
    if not match:
        raise InvalidRequest(
            f"resource {resource}: not a MIG profile (like nvidia.com/mig-1g.10gb)"
        )
    return match[1] + ("+me" if match[2] else "")


def _count(value: Any, where: str) -> int:
    text = str(value).strip()
    # ASCII digits only ('²' and '٣' are digits to Python), and never a number so long that
    # converting it costs anything: anything over 64 is refused below anyway
    if isinstance(value, bool) or not (text.isascii() and text.isdigit()):
        shown = repr(value) if len(text) <= 40 else repr(text[:40] + "...")
        raise InvalidRequest(f"{where}: expected a whole number of devices, got {shown}")
    if len(text) > 18:
        raise InvalidRequest(
            f"{where}: a {len(text)}-digit device count is more than any VM offers"
        )
    count = int(text)
    if count > 64:
        raise InvalidRequest(f"{where}: {count} devices is more than any VM offers (64)")
    return count


def container_units(container: Mapping[str, Any], where: str) -> list[DeviceUnit]:
    """The device units one container's extended resources ask for (limits, else requests)."""
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise InvalidRequest(f"{where}.resources is not a map")
    merged: dict[str, Any] = {}
    for section in ("requests", "limits"):  # limits win
        values = resources.get(section) or {}
        if not isinstance(values, dict):
            raise InvalidRequest(f"{where}.resources.{section} is not a map")
        merged.update({k: v for k, v in values.items() if is_device_resource(str(k))})
    name = str(container.get("name", ""))
    gpus = 0
    rdma = 0
    mig: dict[str, int] = {}
    for resource, value in sorted(merged.items()):
        count = _count(value, f"{where}.resources.{resource}")
        if resource == GPU:
            gpus += count
        elif resource.startswith(MIG_PREFIX):
            profile = mig_profile(resource)
            mig[profile] = mig.get(profile, 0) + count
        else:
            rdma += count
    units: list[DeviceUnit] = []
    if gpus:
        units.append(DeviceUnit(id=f"{name}-gpu", kind="gpu", count=gpus))
    for profile, count in sorted(mig.items()):
        if count:
            units.append(
                DeviceUnit(id=f"{name}-mig-{profile}", kind="mig", count=count, profile=profile)
            )
    if gpus > 64 or rdma > 64:
        what, total = ("GPUs", gpus) if gpus > 64 else ("RDMA devices", rdma)
        raise InvalidRequest(f"{where}: {total} {what} in all is more than any VM offers (64)")
    if rdma:
        units.append(DeviceUnit(id=f"{name}-rdma", kind="rdma", count=rdma))
    return units
