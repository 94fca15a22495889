"""Where DRA objects come from: a `Resolver` reads ResourceClaims, ResourceClaimTemplates and
DeviceClasses. `MemoryResolver` serves them from a list of manifests (tests, `peerpods plan`);
the Kubernetes-backed one lives in `_kube.py`. Each also answers from memory alone
(`from_memory`), raising `NotInMemory` where a read would have to wait for the API: the server
decides an admission that needs nothing else without a second thread hop or the DRA share.
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


class NotInMemory(Exception):  # not an error: a signal to decide elsewhere
    """Deciding needs what is not in memory (an object not read yet or expired, a selector not
    evaluated yet): a call that may wait. Never a denial: the admission is decided again where
    waiting is allowed (so no handler of admission errors catches it)."""


class Resolver(Protocol):
    """Reads DRA objects as plain JSON dicts; raises ObjectNotFound or LookupFailed."""

    def claim(self, namespace: str, name: str) -> dict[str, Any]: ...

    def claim_template(self, namespace: str, name: str) -> dict[str, Any]: ...

    def device_class(self, name: str) -> dict[str, Any]: ...

    def from_memory(self) -> Resolver:
        """The same reads, answered from memory only: one that would wait raises NotInMemory."""
        ...


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

    def from_memory(self) -> MemoryResolver:
        return self  # every read is from memory
