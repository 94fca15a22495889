"""A pod's effective vCPUs and memory, by Kubernetes' rules.

Per container a limit is preferred to a request (the VM must hold what the container may use).
The pod needs max(max over init containers, sum of app containers), where restartable init
containers (sidecars, `restartPolicy: Always`) keep running: each init container also needs the
sidecars started before it, and the app phase needs every sidecar too. Pod-level
`spec.resources`, when set, wins for the resources it names. vCPUs are rounded up to whole
CPUs, memory up to whole MiB.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from providers.core.errors import InvalidRequest
from providers.core.quantity import MIB, parse_quantity

Pod = dict[str, Any]


@dataclass(frozen=True)
class PodResources:
    """What the pod VM must offer: whole vCPUs and MiB (0: the pod did not say); `cpu` is the
    pod's CPU before rounding up (`peerpods plan` shows both)."""

    vcpus: int
    memory_mib: int
    cpu: Decimal = Decimal(0)


def _amount(resources: Mapping[str, Any], name: str, where: str) -> Decimal:
    if not isinstance(resources, dict):
        raise InvalidRequest(f"{where}.resources is not a map")
    for section in ("limits", "requests"):
        values = resources.get(section) or {}
        if not isinstance(values, dict):
            raise InvalidRequest(f"{where}.resources.{section} is not a map")
        if name in values:
            try:
                return parse_quantity(values[name])
            except InvalidRequest as exc:
                raise InvalidRequest(f"{where}.resources.{section}.{name}: {exc}") from None
    return Decimal(0)


def container_lists(pod: Pod) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(init containers, app containers), checked to be lists of objects."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise InvalidRequest("pod has no spec")
    out: list[list[dict[str, Any]]] = []
    for field in ("initContainers", "containers"):
        items = spec.get(field) or []
        if not isinstance(items, list) or not all(isinstance(c, dict) for c in items):
            raise InvalidRequest(f"spec.{field} is not a list of containers")
        for index, item in enumerate(items):
            if not isinstance(item.get("resources") or {}, dict):
                raise InvalidRequest(f"spec.{field}[{index}].resources is not a map")
        out.append(items)
    return out[0], out[1]


def is_sidecar(container: Mapping[str, Any]) -> bool:
    return container.get("restartPolicy") == "Always"


def effective(
    init: Iterable[Mapping[str, Any]],
    app: Iterable[Mapping[str, Any]],
    amount: Callable[[Mapping[str, Any]], Decimal],
) -> Decimal:
    """Kubernetes' pod total of one resource given each container's amount."""
    sidecars = Decimal(0)
    peak = Decimal(0)
    for container in init:
        need = amount(container)
        if is_sidecar(container):
            sidecars += need
            peak = max(peak, sidecars)
        else:
            peak = max(peak, sidecars + need)
    running = sidecars + sum((amount(c) for c in app), Decimal(0))
    return max(peak, running)


def _resources_of(container: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise InvalidRequest(f"{where}.resources is not a map")
    return resources


def pod_resources(pod: Pod) -> PodResources:
    """The pod's vCPUs and memory (InvalidRequest for a malformed quantity)."""
    init, app = container_lists(pod)
    names = {id(c): f"spec.initContainers[{i}]" for i, c in enumerate(init)}
    names.update({id(c): f"spec.containers[{i}]" for i, c in enumerate(app)})
    pod_level = pod["spec"].get("resources") or {}
    if not isinstance(pod_level, dict):
        raise InvalidRequest("spec.resources is not a map")
    totals: dict[str, Decimal] = {}
    for name in ("cpu", "memory"):
        level = _amount(pod_level, name, "spec")
        if level:
            totals[name] = level
            continue

        def amount(c: Mapping[str, Any], n: str = name) -> Decimal:
            return _amount(_resources_of(c, names[id(c)]), n, names[id(c)])

        totals[name] = effective(init, app, amount)
    return PodResources(
        vcpus=math.ceil(totals["cpu"]),
        memory_mib=math.ceil(totals["memory"] / MIB),
        cpu=totals["cpu"],
    )
