"""In the DRA-driver mode (`--dra-driver`), what a peer pod keeps for the scheduler.

The scheduler allocates the pod's GPUs from the pools of driver gpu.peerpods.io: a pod's
`nvidia.com/gpu` (served through the DeviceClass whose `extendedResourceName` it is, and
charged to namespace quotas as any extended resource), its containers' `resources.claims` and
its `spec.resourceClaims`. The webhook therefore decides the rest of the pod (vCPUs, memory, MIG
on the annotation path) from the pod less those (`without_scheduled`), strips it as always, and
puts them back (`restore_scheduled`). It never evaluates the claims itself in this mode: the VM's
GPUs come from what was allocated, at CreateVM.
"""

from __future__ import annotations

import copy
from typing import Any

from webhook._extended import GPU

__all__ = ["restore_scheduled", "without_scheduled"]

Pod = dict[str, Any]
_LISTS = ("initContainers", "containers")


def _containers(spec: Any, key: str) -> list[Any]:
    found = spec.get(key) if isinstance(spec, dict) else None
    return found if isinstance(found, list) else []


def without_scheduled(pod: Pod) -> Pod:
    """A copy of `pod` with no `nvidia.com/gpu`, no claims and no `spec.resourceClaims`."""
    view = copy.deepcopy(pod)
    spec = view.get("spec")
    if not isinstance(spec, dict):
        return view
    spec.pop("resourceClaims", None)
    for key in _LISTS:
        for container in _containers(spec, key):
            resources = container.get("resources") if isinstance(container, dict) else None
            if not isinstance(resources, dict):
                continue
            resources.pop("claims", None)
            for section in ("limits", "requests"):
                values = resources.get(section)
                if isinstance(values, dict):
                    values.pop(GPU, None)
                    if not values:
                        resources.pop(section)
            if not resources:
                container.pop("resources")
    return view


def restore_scheduled(original: Any, spec: dict[str, Any]) -> None:
    """Put back into the stripped `spec` what `original` (the pod's spec as sent) gives the
    scheduler: its resource claims, each container's claims and `nvidia.com/gpu`."""
    if not isinstance(original, dict):
        return
    if "resourceClaims" in original:
        spec["resourceClaims"] = copy.deepcopy(original["resourceClaims"])
    for key in _LISTS:
        for before, after in zip(_containers(original, key), _containers(spec, key), strict=False):
            kept = before.get("resources") if isinstance(before, dict) else None
            if not isinstance(kept, dict) or not isinstance(after, dict):
                continue
            resources = after.setdefault("resources", {})
            if "claims" in kept:
                resources["claims"] = copy.deepcopy(kept["claims"])
            for section in ("limits", "requests"):
                values = kept.get(section)
                if isinstance(values, dict) and GPU in values:
                    resources.setdefault(section, {})[GPU] = values[GPU]
            if not resources:
                after.pop("resources")
