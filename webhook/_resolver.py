"""Where DRA objects come from: a `Resolver` reads ResourceClaims, ResourceClaimTemplates and
DeviceClasses. `MemoryResolver` serves them from a list of manifests (tests, `peerpods plan`);
the Kubernetes-backed one lives in `_kube.py`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from providers.core.errors import Fault, InvalidRequest, PeerpodsError


class ObjectNotFound(InvalidRequest):
    """The pod names a claim, template or class that does not exist."""


class LookupFailed(PeerpodsError):
    """The Kubernetes API could not be asked (unreachable, forbidden, 5xx)."""

    fault = Fault.UNAVAILABLE


class Resolver(Protocol):
    """Reads DRA objects as plain JSON dicts; raises ObjectNotFound or LookupFailed."""

    def claim(self, namespace: str, name: str) -> dict[str, Any]: ...

    def claim_template(self, namespace: str, name: str) -> dict[str, Any]: ...

    def device_class(self, name: str) -> dict[str, Any]: ...


class MemoryResolver:
    """A Resolver over manifests already in memory."""

    def __init__(self, objects: Iterable[dict[str, Any]] = ()) -> None:
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        for obj in objects:
            if not isinstance(obj, dict):
                continue
            meta = obj.get("metadata") or {}
            key = (str(obj.get("kind", "")), str(meta.get("namespace", "")), str(meta.get("name")))
            self._objects[key] = obj

    def _get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        found = self._objects.get((kind, namespace, name))
        if found is None and namespace == "default":
            found = self._objects.get((kind, "", name))
        if found is None:
            where = f" in namespace {namespace}" if namespace else ""
            raise ObjectNotFound(f"{kind} {name} not found{where}")
        return found

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self._get("ResourceClaim", namespace, name)

    def claim_template(self, namespace: str, name: str) -> dict[str, Any]:
        return self._get("ResourceClaimTemplate", namespace, name)

    def device_class(self, name: str) -> dict[str, Any]:
        return self._get("DeviceClass", "", name)
