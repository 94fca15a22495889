"""This node's peer-pod capacity (`kata.peerpods.io/vm`) on its Node status, kept there by the
adaptor itself, with the resources peer pods keep for namespace quotas (`kata.peerpods.io/gpu`,
`/mig`), advertised in plenty so they only ever bind through a ResourceQuota.

The webhook puts `kata.peerpods.io/vm: 1` on every peer pod, so the scheduler places one only on
a node that advertises the resource. The adaptor patches its own node's status at start and
whenever the advertised count differs from its setting (a kubelet that restarts zeroes extended
resources it does not manage), reading the node with `get` and writing only `nodes/status`
(the narrowest RBAC that can). The Kubernetes client blocks, so every call runs in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any, Protocol

from adaptor.runtime.periodic import OwnedTask
from providers.core.errors import PeerpodsError

log = logging.getLogger(__name__)

RESOURCE = "kata.peerpods.io/vm"


class NodeApiError(PeerpodsError):
    """The Kubernetes API could not be reached or refused a node call."""


class NodeApi(Protocol):
    """The two node calls the advertiser makes (blocking)."""

    def capacity(self, node: str) -> dict[str, str]:
        """The node's status.capacity."""
        ...

    def set_capacity(self, node: str, values: Mapping[str, str]) -> None:
        """Add or replace resources in the node's status.capacity (one patch)."""
        ...


class KubeNodeApi:
    """NodeApi over the Kubernetes client: in-cluster (the pod's service account), else the
    kubeconfig KUBECONFIG names."""

    def __init__(self, timeout_seconds: float = 10.0, api_client: Any = None) -> None:
        self.timeout_seconds = timeout_seconds
        self._client = api_client

    def _core(self) -> Any:
        from kubernetes import client, config

        if self._client is None:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except config.ConfigException:
                try:
                    # KUBECONFIG read now: the client reads it once, when first imported
                    config.load_kube_config(  # type: ignore[no-untyped-call]
                        config_file=os.environ.get("KUBECONFIG") or None
                    )
                except (config.ConfigException, OSError, TypeError) as exc:
                    raise NodeApiError(f"no Kubernetes configuration: {exc}") from None
            self._client = client.ApiClient()
        return client.CoreV1Api(self._client)

    def _call(self, what: str, call: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call(self._core())
        except ApiException as exc:
            raise NodeApiError(f"{what}: HTTP {exc.status} {exc.reason}") from None
        except (HTTPError, OSError, ValueError) as exc:
            raise NodeApiError(f"{what}: {exc}") from None

    def capacity(self, node: str) -> dict[str, str]:
        found = self._call(
            f"reading node {node}",
            lambda api: api.read_node(node, _request_timeout=self.timeout_seconds),
        )
        status = getattr(found, "status", None)
        capacity = getattr(status, "capacity", None) or {}
        return {str(k): str(v) for k, v in capacity.items()}

    def set_capacity(self, node: str, values: Mapping[str, str]) -> None:
        # JSON patch: "add" creates or replaces the map member; "/" in the name is "~1".
        ops = [
            {"op": "add", "path": "/status/capacity/" + _pointer(name), "value": value}
            for name, value in values.items()
        ]
        self._call(
            f"patching node {node} status",
            lambda api: api.patch_node_status(
                node,
                ops,
                _content_type="application/json-patch+json",
                _request_timeout=self.timeout_seconds,
            ),
        )


def _pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


class CapacityAdvertiser:
    """Keeps `kata.peerpods.io/vm: <capacity>` (and `extra` resources) on one node's status."""

    def __init__(
        self,
        api: NodeApi,
        node: str,
        capacity: int,
        *,
        extra: Mapping[str, int] | None = None,
        interval_seconds: float = 30.0,
        retry_seconds: float = 5.0,
    ) -> None:
        if not node:
            raise PeerpodsError("no node name to advertise peer-pod capacity on")
        if capacity < 0:
            raise PeerpodsError(f"peer-pod capacity must be 0 or more, not {capacity}")
        self.api = api
        self.node = node
        self.capacity = capacity
        self.resources = {RESOURCE: capacity, **(extra or {})}
        if any(count < 0 for count in self.resources.values()):
            raise PeerpodsError(f"advertised resources must be 0 or more: {self.resources}")
        self.interval_seconds = interval_seconds
        self.retry_seconds = retry_seconds
        self.patches = 0
        self._task = OwnedTask("capacity-advertiser")

    async def advertise(self) -> bool:
        """Patch the node when an advertised count differs; True when it patched."""
        have = await asyncio.to_thread(self.api.capacity, self.node)
        wrong = {
            name: str(count)
            for name, count in self.resources.items()
            if have.get(name) != str(count)
        }
        if not wrong:
            return False
        await asyncio.to_thread(self.api.set_capacity, self.node, wrong)
        self.patches += 1
        log.info(
            "node %s advertises %s (was %s)",
            self.node,
            ", ".join(f"{k}: {v}" for k, v in wrong.items()),
            ", ".join(f"{k}: {have.get(k, 'unset')}" for k in wrong),
        )
        return True

    def start(self) -> None:
        """Advertise now and keep it advertised until stop()."""
        self._task.start(self._loop)

    async def stop(self) -> None:
        await self._task.stop()

    async def _loop(self) -> None:
        while True:
            try:
                await self.advertise()
            except NodeApiError as exc:
                log.warning("cannot advertise %s on node %s: %s", RESOURCE, self.node, exc)
                await asyncio.sleep(self.retry_seconds)
                continue
            await asyncio.sleep(self.interval_seconds)
