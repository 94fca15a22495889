"""A Resolver backed by the Kubernetes API (in-cluster, else KUBECONFIG), cached with a TTL.

`resource.k8s.io/v1` objects are read as plain JSON (providers.clouds.kube), so fields no typed
model knows yet (consumable capacity, firstAvailable) survive. Found objects are cached for
`ttl_seconds`, `max_cached` of them at most (the oldest dropped first: tenants choose how many
templates exist); misses and errors are not cached, so a claim created a moment later is seen.
Calls block: the server runs admission in a worker thread. `from_memory()` is a view over the
same cache that never calls the API (a miss raises NotInMemory).
"""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from typing import Any

from providers.clouds.kube import KubeApiError, KubeClient, KubeConfigError, load_config
from providers.clouds.kube import path_segment as seg
from webhook._resolver import LookupFailed, NotInMemory, ObjectNotFound
from webhook._settings import POLICY

GROUP = "resource.k8s.io"
VERSION = "v1"
PREFIX = f"/apis/{GROUP}/{VERSION}"


class KubeResolver:
    """DRA objects from the API server."""

    def __init__(
        self,
        ttl_seconds: float = POLICY.cache_ttl_seconds,
        timeout_seconds: float = 3.0,
        client: KubeClient | None = None,
        max_cached: int = 4096,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.timeout_seconds = timeout_seconds
        self.max_cached = max_cached
        self._client = client
        self._cache: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()
        self._memory_only = False
        self._remembered: KubeResolver | None = None

    def from_memory(self) -> KubeResolver:
        """A view of this resolver's cache that never calls the API: a read not cached (or
        expired) raises NotInMemory."""
        if self._memory_only:
            return self
        if self._remembered is None:
            remembered = copy.copy(self)  # shares the cache, its lock and the client
            remembered._memory_only = True
            self._remembered = remembered
        return self._remembered

    def _api(self) -> KubeClient:
        if self._client is None:
            try:
                self._client = KubeClient(load_config(), self.timeout_seconds)
            except KubeConfigError as exc:
                raise LookupFailed(f"no Kubernetes configuration: {exc}") from None
        return self._client

    def _get(self, path: str, what: str) -> dict[str, Any]:
        now = time.monotonic()
        cached = self._cache.get(path)
        if cached is not None and cached[0] > now:
            return cached[1]
        if self._memory_only:
            raise NotInMemory(what)
        try:
            obj = self._api().get(path, timeout_seconds=self.timeout_seconds)
        except KubeApiError as exc:
            if exc.status == 404:
                raise ObjectNotFound(f"{what} not found") from None
            raise LookupFailed(f"reading {what}: {exc}") from None
        with self._lock:
            self._cache[path] = (now + self.ttl_seconds, obj)
            self._cache.move_to_end(path)
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)
        return obj

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self._get(
            f"{PREFIX}/namespaces/{seg(namespace)}/resourceclaims/{seg(name)}",
            f"ResourceClaim {namespace}/{name}",
        )

    def claim_template(self, namespace: str, name: str) -> dict[str, Any]:
        return self._get(
            f"{PREFIX}/namespaces/{seg(namespace)}/resourceclaimtemplates/{seg(name)}",
            f"ResourceClaimTemplate {namespace}/{name}",
        )

    def device_class(self, name: str) -> dict[str, Any]:
        return self._get(f"{PREFIX}/deviceclasses/{seg(name)}", f"DeviceClass {name}")
