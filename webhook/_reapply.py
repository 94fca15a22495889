"""A peer pod's UPDATE made idempotent, so that re-applying its manifest is accepted.

A re-apply (`kubectl apply`, client-side or server-side; GitOps controllers) sends back what the
manifest says: the cpu, memory, devices and claims the webhook removed at creation, and, with
server-side apply, without the contract annotations the webhook added. Pod resources and claims
are immutable (the API server's ValidatePodUpdate allows only images, activeDeadlineSeconds,
additional tolerations and terminationGracePeriodSeconds to change), so the update must be
mutated exactly as the creation was: the same stripping gives back the live pod's resources
(a pure function of the manifest), and the contract keys the update dropped are put back from
the live pod. An update that really changes resources stays changed and the API server refuses
it, as it would without the webhook; one that changes a contract key is denied by the webhook
(`webhook._policy.protected_changes`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from providers.core.contract import (
    CDI_PREFIX,
    GPU_QUOTA_RESOURCE,
    MIG_QUOTA_RESOURCE,
    OWNED_KEYS,
    SEAL,
)
from webhook._mutate import strip_node_resources
from webhook._scheduled import restore_scheduled

Pod = dict[str, Any]


def _annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    meta = pod.get("metadata")
    found = meta.get("annotations") if isinstance(meta, dict) else None
    if not isinstance(found, dict):
        return {}
    return {str(k): v for k, v in found.items() if isinstance(v, str)}


def _quota_of(pod: Pod) -> dict[str, str]:
    """The quota resources the live pod's first container holds (what the creation wrote)."""
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    first = containers[0] if isinstance(containers, list) and containers else None
    resources = first.get("resources") if isinstance(first, dict) else None
    limits = resources.get("limits") if isinstance(resources, dict) else None
    if not isinstance(limits, dict):
        return {}
    own = (GPU_QUOTA_RESOURCE, MIG_QUOTA_RESOURCE)
    return {k: str(v) for k, v in limits.items() if k in own}


def reapply(
    old: Pod,
    new: Pod,
    was_mutated: Callable[[Mapping[str, str]], bool],
    keep_scheduled: bool = False,
) -> Pod:
    """The pod an UPDATE of `old` to `new` should store. `was_mutated(annotations)` says
    whether the live pod carries the webhook's seal; when it does not, `new` is kept as sent.
    `keep_scheduled`: the DRA-driver mode, where the live pod kept its GPUs and claims."""
    before = _annotations(old)
    if not was_mutated(before):
        return new
    restored = copy.deepcopy(new)
    spec = restored.get("spec")
    if isinstance(spec, dict):
        strip_node_resources(spec, _quota_of(old))
        if keep_scheduled:
            restore_scheduled(new.get("spec"), spec)
    meta = restored.setdefault("metadata", {})
    if not isinstance(meta, dict):
        return new
    annotations = dict(meta.get("annotations") or {})
    for key, value in before.items():
        if (key in OWNED_KEYS or key == SEAL) and key not in annotations:
            annotations[key] = value
    for key in list(annotations):
        # the webhook never keeps a user's CDI annotations (the device plan names devices)
        if key.startswith(CDI_PREFIX) and key not in before:
            del annotations[key]
    if annotations or "annotations" in meta:
        meta["annotations"] = annotations
    return restored
