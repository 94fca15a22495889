"""This node's peer-pod capacity (`kata.peerpods.io/vm`) on its Node status, kept there by the
adaptor itself, with the resources peer pods keep for namespace quotas (`kata.peerpods.io/gpu`,
`/mig`), advertised in plenty so they only ever bind through a ResourceQuota.

The webhook puts `kata.peerpods.io/vm: 1` on every peer pod, so the scheduler places one only on
a node that advertises the resource. The adaptor patches its own node's status at start and
whenever the advertised count differs from its setting (a kubelet that restarts zeroes extended
resources it does not manage), reading the node with `get` and writing only `nodes/status`
(the narrowest RBAC that can). The calls block, so every one runs in a thread.

While the node is not ready (`/readyz` fails: no cloud credentials, the socket not serving) it
advertises 0 peer pods, so the scheduler sends none to a node that could only fail them; its
capacity comes back as soon as it is ready.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from adaptor.runtime.periodic import OwnedTask
from providers.clouds.kube import (
    JSON_PATCH,
    KubeApiError,
    KubeClient,
    KubeConfigError,
    load_config,
    path_segment,
)
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
    """NodeApi over the Kubernetes API: in-cluster (the pod's service account), else the
    kubeconfig KUBECONFIG names (found at the first call)."""

    def __init__(self, timeout_seconds: float = 10.0, client: KubeClient | None = None) -> None:
        self.timeout_seconds = timeout_seconds
        self._client = client

    def _api(self) -> KubeClient:
        if self._client is None:
            try:
                self._client = KubeClient(load_config(), self.timeout_seconds)
            except KubeConfigError as exc:
                raise NodeApiError(f"no Kubernetes configuration: {exc}") from None
        return self._client

    def capacity(self, node: str) -> dict[str, str]:
        try:
            found = self._api().get(f"/api/v1/nodes/{path_segment(node)}")
        except KubeApiError as exc:
            raise NodeApiError(f"reading node {node}: {exc}") from None
        status = found.get("status")
        capacity = status.get("capacity") if isinstance(status, dict) else None
        return {str(k): str(v) for k, v in (capacity or {}).items()}

    def set_capacity(self, node: str, values: Mapping[str, str]) -> None:
        # JSON patch: "add" creates or replaces the map member; "/" in the name is "~1".
        ops = [
            {"op": "add", "path": "/status/capacity/" + _pointer(name), "value": value}
            for name, value in values.items()
        ]
        try:
            self._api().patch(f"/api/v1/nodes/{path_segment(node)}/status", ops, JSON_PATCH)
        except KubeApiError as exc:
            raise NodeApiError(f"patching node {node} status: {exc}") from None


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
        ready: Callable[[], bool] | None = None,
        ready_poll_seconds: float = 1.0,
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
        self.ready = ready  # None: always ready
        self.ready_poll_seconds = ready_poll_seconds
        self.patches = 0
        self._task = OwnedTask("capacity-advertiser")

    def wanted(self, ready: bool) -> dict[str, int]:
        """What the node should advertise: its capacity once ready, no peer pod before."""
        return dict(self.resources) if ready else {**self.resources, RESOURCE: 0}

    async def advertise(self, ready: bool | None = None) -> bool:
        """Patch the node when an advertised count differs from what it should be now (ready:
        the readiness given, else asked); True when it patched."""
        if ready is None:
            ready = self.ready() if self.ready is not None else True
        have = await asyncio.to_thread(self.api.capacity, self.node)
        wanted = self.wanted(ready)
        if not ready and RESOURCE not in have:
            del wanted[RESOURCE]  # never advertised: no peer pod comes here already
        wrong = {name: str(count) for name, count in wanted.items() if have.get(name) != str(count)}
        if not wrong:
            return False
        await asyncio.to_thread(self.api.set_capacity, self.node, wrong)
        self.patches += 1
        log.info(
            "node %s advertises %s (was %s)%s",
            self.node,
            ", ".join(f"{k}: {v}" for k, v in wrong.items()),
            ", ".join(f"{k}: {have.get(k, 'unset')}" for k in wrong),
            "" if ready else ", not ready (/readyz says why)",
        )
        return True

    def start(self) -> None:
        """Advertise now and keep it advertised until stop()."""
        self._task.start(self._loop)

    async def stop(self) -> None:
        await self._task.stop()

    async def _loop(self) -> None:
        """Check the node every interval, and as soon as readiness changes (it is polled; the
        API is called only at a change or an interval's end)."""
        loop = asyncio.get_running_loop()
        checked: bool | None = None  # the readiness of the last check
        due = 0.0
        while True:
            ready = self.ready() if self.ready is not None else True
            if ready != checked or loop.time() >= due:
                checked = ready
                try:
                    await self.advertise(ready)
                except NodeApiError as exc:
                    log.warning("cannot advertise %s on node %s: %s", RESOURCE, self.node, exc)
                    due = loop.time() + self.retry_seconds
                else:
                    due = loop.time() + self.interval_seconds
            await asyncio.sleep(min(self.ready_poll_seconds, max(due - loop.time(), 0.0)))
