"""What a pod asks for, as the contract seal binds it (`providers.core.contract.seal`).

The seal proves the webhook wrote a pod's contract keys; this digest ties them to the pod they
were written for. It covers what the contract is derived from and what a mutated pod still
carries of it: the pod-level resources and claims, and each container (init containers with
their restart policy, which makes a sidecar) by name with its resources and claims. Another pod
of the namespace carrying a copied seal matches only if it asks for exactly the same; anything
else is translated from its own requests again.

Quantities are compared by value (`1Gi` and `1024Mi` alike), as the API server may re-serialise
them between two calls of the webhook on one pod.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from providers.core.errors import InvalidRequest
from providers.core.quantity import parse_quantity
from webhook._resources import Pod, container_lists


def _quantity(value: Any) -> Any:
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        try:
            return format(parse_quantity(value).normalize(), "f")
        except InvalidRequest:
            pass
    return value


def _resources(resources: Any) -> Any:
    """Resources with empty sections dropped and quantities by value."""
    if not isinstance(resources, Mapping):
        return resources
    out: dict[str, Any] = {}
    for section, values in resources.items():
        if section in ("limits", "requests") and isinstance(values, Mapping):
            values = {str(k): _quantity(v) for k, v in values.items()}
        if values:
            out[str(section)] = values
    return out


def request_digest(pod: Pod) -> str:
    """The SHA-256 (hex) of what `pod` asks for (see the module doc)."""
    init, app = container_lists(pod)
    spec = pod["spec"]
    shape = {
        "resources": _resources(spec.get("resources")),
        "claims": spec.get("resourceClaims") or [],
        "init": [
            [c.get("name"), c.get("restartPolicy"), _resources(c.get("resources"))] for c in init
        ],
        "containers": [[c.get("name"), _resources(c.get("resources"))] for c in app],
    }
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()
