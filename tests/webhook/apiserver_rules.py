"""The checks the Kubernetes API server applies to a pod's resources, its updates and its QoS
class, written from the rules in the kubernetes source (v1.34), so that a mutated pod is checked
against what a real server refuses (the client library's models check types only).

- `resource_errors`: `ValidateResourceRequirements` / `validateResourceRequirements` and
  `validateContainerResourceName` in pkg/apis/core/validation/validation.go:
  * every resource name is a standard one (cpu, memory, ephemeral-storage, hugepages-<size>) or
    a fully qualified extended resource (`domain/name`, not in the kubernetes.io domain);
  * quantities are not negative; extended resources and hugepages are whole numbers
    ("must be an integer", for extended resources);
  * a request is at most its limit ("must be less than or equal to ... limit");
  * extended resources cannot be overcommitted: a request equals its limit, and a request
    needs a limit ("must be equal to ... limit", "Limit must be set for non overcommitable
    resources"; `helper.IsOvercommitAllowed`);
  * "HugePages require cpu or memory": hugepages in requests or limits need cpu or memory in
    requests or limits.
- `update_errors`: `ValidatePodUpdate` in the same file: the new spec, with the fields an update
  may change copied from the old one (containers' and init containers' images,
  activeDeadlineSeconds, terminationGracePeriodSeconds, tolerations when only added), must equal
  the old spec semantically (quantities by value: `apiequality.Semantic.DeepEqual`); else "pod
  updates may not change fields other than ...".
- `qos_class`: `GetPodQOS` / `ComputePodQOS` in pkg/apis/core/helper/qos/qos.go: only cpu and
  memory count; no requests or limits of either anywhere: BestEffort; every container with cpu
  and memory limits equal to its requests: Guaranteed; else Burstable.
- `quota_errors`: the ResourceQuota admission plugin, which runs after mutating webhooks, with
  the pod usage of pkg/quota/v1/evaluator/core/pods.go (extended resources only as
  `requests.<name>`).
"""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

from providers.core.quantity import parse_quantity

STANDARD = {"cpu", "memory", "ephemeral-storage"}
QOS_RESOURCES = ("cpu", "memory")
UPDATE_MESSAGE = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only "
    "additions to existing tolerations),`spec.terminationGracePeriodSeconds`"
)


def _is_hugepages(name: str) -> bool:
    return name.startswith("hugepages-")


def _is_extended(name: str) -> bool:
    # helper.IsExtendedResourceName: qualified, not native (kubernetes.io), not requests.*
    return "/" in name and not name.split("/", 1)[0].endswith("kubernetes.io")


def _named(resources: dict[str, Any], where: str) -> list[str]:
    errors: list[str] = []
    for section in ("limits", "requests"):
        for name, value in (resources.get(section) or {}).items():
            path = f"{where}.{section}[{name}]"
            if not (name in STANDARD or _is_hugepages(name) or _is_extended(name)):
                errors.append(f"{path}: Invalid value: {name!r}: must be a standard resource")
                continue
            quantity = parse_quantity(value)
            if quantity < 0:
                errors.append(f"{path}: Invalid value: must be greater than or equal to 0")
            if _is_extended(name) and quantity != quantity.to_integral_value():
                errors.append(f"{path}: Invalid value: must be an integer")
    return errors


def requirement_errors(resources: Any, where: str) -> list[str]:
    """ValidateResourceRequirements for one container's (or the pod's) resources."""
    if not resources:
        return []
    errors = _named(resources, where)
    limits = {k: parse_quantity(v) for k, v in (resources.get("limits") or {}).items()}
    requests = {k: parse_quantity(v) for k, v in (resources.get("requests") or {}).items()}
    for name, request in requests.items():
        path = f"{where}.requests[{name}]"
        overcommit = not (_is_extended(name) or _is_hugepages(name))
        if name in limits:
            if request > limits[name]:
                errors.append(f"{path}: Invalid value: must be less than or equal to {name} limit")
            elif not overcommit and request != limits[name]:
                errors.append(f"{path}: Invalid value: must be equal to {name} limit")
        elif not overcommit and _is_extended(name):
            errors.append(f"{where}.limits: Required value: Limit must be set for non "
                          "overcommitable resources")  # fmt: skip
    names = set(limits) | set(requests)
    if any(_is_hugepages(n) for n in names) and not names & {"cpu", "memory"}:
        errors.append(f"{where}: Forbidden: HugePages require cpu or memory")
    return errors


def _containers(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for field in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(field) or []):
            found.append((f"spec.{field}[{index}]", container))
    return found


def _effective(resources: dict[str, Any]) -> dict[str, Any]:
    """Defaulting (SetDefaults_Pod): a limit with no request makes the request equal to it."""
    out = copy.deepcopy(resources or {})
    limits = out.get("limits") or {}
    if limits:
        requests = out.setdefault("requests", {})
        for name, value in limits.items():
            requests.setdefault(name, value)
    return out


def resource_errors(pod: dict[str, Any]) -> list[str]:
    """Every resource error the API server reports for a pod at creation."""
    spec = pod["spec"]
    errors = requirement_errors(spec.get("resources"), "spec.resources")
    for where, container in _containers(spec):
        resources = _effective(container.get("resources") or {})
        errors += requirement_errors(resources, f"{where}.resources")
    return errors


def _semantic(value: Any) -> Any:
    """Quantities by value, everything else as it is (apiequality.Semantic)."""
    if isinstance(value, dict):
        return {k: _semantic(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_semantic(v) for v in value]
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        try:
            return ("q", parse_quantity(value))
        except Exception:
            return value
    return value


def _resources_by_value(spec: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    for _, container in _containers(spec):
        if "resources" in container:
            container["resources"] = _semantic(_effective(container["resources"]))
    if "resources" in spec:
        spec["resources"] = _semantic(spec["resources"])
    return spec


def update_errors(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """ValidatePodUpdate's spec rule (the metadata may change freely)."""
    munged = copy.deepcopy(new["spec"])
    before = old["spec"]
    for field in ("containers", "initContainers"):
        olds, news = before.get(field) or [], munged.get(field) or []
        if len(olds) == len(news):
            for old_container, new_container in zip(olds, news, strict=True):
                new_container["image"] = old_container.get("image")
    for field in ("activeDeadlineSeconds", "terminationGracePeriodSeconds"):
        if field in before:
            munged[field] = before[field]
        else:
            munged.pop(field, None)
    old_tolerations = before.get("tolerations") or []
    if all(t in (munged.get("tolerations") or []) for t in old_tolerations):
        if "tolerations" in before:
            munged["tolerations"] = before["tolerations"]
        else:
            munged.pop("tolerations", None)
    if _resources_by_value(munged) != _resources_by_value(before):
        return [f"spec: Forbidden: {UPDATE_MESSAGE}"]
    return []


def quota_usage(pod: dict[str, Any]) -> dict[str, Decimal]:
    """What ResourceQuota counts for a pod's `requests.<name>` (pkg/quota/v1/evaluator/core/
    pods.go, PodUsageFunc): per resource, the larger of the app containers' sum and any one
    init container's request, after defaulting (a limit alone is the request too)."""
    spec = pod["spec"]

    def requests(container: dict[str, Any]) -> dict[str, Decimal]:
        effective = _effective(container.get("resources") or {})
        return {k: parse_quantity(v) for k, v in (effective.get("requests") or {}).items()}

    usage: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for name, value in requests(container).items():
            usage[name] = usage.get(name, Decimal(0)) + value
    for container in spec.get("initContainers") or []:
        for name, value in requests(container).items():
            usage[name] = max(usage.get(name, Decimal(0)), value)
    return usage


def quota_errors(pod: dict[str, Any], hard: dict[str, str], used: dict[str, str]) -> list[str]:
    """The quota admission's refusal of a pod in a namespace with `hard` limits and `used`
    already (`requests.<name>` keys): "exceeded quota: ...", as the API server words it."""
    usage = quota_usage(pod)
    errors = []
    for key, limit in hard.items():
        name = key.removeprefix("requests.")
        asked = usage.get(name, Decimal(0))
        already = parse_quantity(used.get(key, "0"))
        if asked and already + asked > parse_quantity(limit):
            errors.append(
                f"exceeded quota: requested: {key}={asked}, used: {key}={already}, "
                f"limited: {key}={limit}"
            )
    return errors


def qos_class(pod: dict[str, Any]) -> str:
    """GetPodQOS (pod-level resources, when set, decide alone)."""
    spec = pod["spec"]
    if spec.get("resources"):
        groups = [spec["resources"]]
    else:
        groups = [_effective(c.get("resources") or {}) for _, c in _containers(spec)]
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    for resources in groups:
        have_limits = set()
        for name in QOS_RESOURCES:
            if name in (resources.get("requests") or {}):
                quantity = parse_quantity(resources["requests"][name])
                if quantity != 0:
                    requests[name] = requests.get(name, Decimal(0)) + quantity
            if name in (resources.get("limits") or {}):
                quantity = parse_quantity(resources["limits"][name])
                if quantity != 0:
                    have_limits.add(name)
                    limits[name] = limits.get(name, Decimal(0)) + quantity
        if have_limits != set(QOS_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests == limits:
        return "Guaranteed"
    return "Burstable"
