"""A Resolver backed by the Kubernetes API (in-cluster, else KUBECONFIG), cached with a TTL.

The official client's CustomObjectsApi reads `resource.k8s.io/v1` objects as plain JSON, so
fields the generated models do not know yet (consumable capacity, firstAvailable) survive. Found
objects are cached for `ttl_seconds`, `max_cached` of them at most (the oldest dropped first:
tenants choose how many templates exist); misses and errors are not cached, so a claim created a
moment later is seen. Calls block: the server runs admission in a worker thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Any

from webhook._resolver import LookupFailed, ObjectNotFound

GROUP = "resource.k8s.io"
VERSION = "v1"


class KubeResolver:
    """DRA objects from the API server."""

    def __init__(
        self,
        ttl_seconds: float = 30.0,
        timeout_seconds: float = 3.0,
        api_client: Any = None,
        max_cached: int = 4096,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.timeout_seconds = timeout_seconds
        self.max_cached = max_cached
        self._client = api_client
        self._cache: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def _api(self) -> Any:
        if self._client is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except config.ConfigException:
                try:
                    # KUBECONFIG read now: the client reads it once, when first imported
                    config.load_kube_config(  # type: ignore[no-untyped-call]
                        config_file=os.environ.get("KUBECONFIG") or None
                    )
                except (config.ConfigException, OSError, TypeError) as exc:
                    raise LookupFailed(f"no Kubernetes configuration: {exc}") from None
            self._client = client.ApiClient()
        return self._client

    def _custom_objects(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self._api())

    def _get(self, path: str, what: str, fetch: Any) -> dict[str, Any]:
        now = time.monotonic()
        cached = self._cache.get(path)
        if cached is not None and cached[0] > now:
            return cached[1]
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            obj = fetch(self._custom_objects(), _request_timeout=self.timeout_seconds)
        except ApiException as exc:
            if exc.status == 404:
                raise ObjectNotFound(f"{what} not found") from None
            raise LookupFailed(f"reading {what}: HTTP {exc.status} {exc.reason}") from None
        except (HTTPError, OSError) as exc:
            raise LookupFailed(f"reading {what}: {exc}") from None
        except ValueError as exc:
            raise LookupFailed(f"reading {what}: {exc}") from None
        if not isinstance(obj, dict):
            raise LookupFailed(f"reading {what}: not an object")
        with self._lock:
            self._cache[path] = (now + self.ttl_seconds, obj)
            self._cache.move_to_end(path)
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)
        return obj

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/resourceclaims/{name}"
        return self._get(
            path,
            f"ResourceClaim {namespace}/{name}",
            lambda api, **kw: api.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", name, **kw
            ),
        )

    def claim_template(self, namespace: str, name: str) -> dict[str, Any]:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/resourceclaimtemplates/{name}"
        return self._get(
            path,
            f"ResourceClaimTemplate {namespace}/{name}",
            lambda api, **kw: api.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaimtemplates", name, **kw
            ),
        )

    def device_class(self, name: str) -> dict[str, Any]:
        return self._get(
            f"/apis/{GROUP}/{VERSION}/deviceclasses/{name}",
            f"DeviceClass {name}",
            lambda api, **kw: api.get_cluster_custom_object(
                GROUP, VERSION, "deviceclasses", name, **kw
            ),
        )
