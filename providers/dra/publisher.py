"""Writing a pool to the API server: the difference, under a new pool generation, once or as a
controller (leader-elected through a coordination.k8s.io Lease when replicated).

The scheduler uses only a pool's highest generation, and only once all `resourceSliceCount`
slices of it exist. A change is therefore written as a whole new generation: every slice of the
pool is created or replaced at generation N+1, and slices the new pool no longer has are
deleted. The content of each slice is hashed into an annotation, so an unchanged pool (the same
catalog, limits and quotas) writes nothing. Calls block (`KubeClient`); the controller runs them
in a thread.

The publisher owns its slices (label `app.kubernetes.io/managed-by: peerpods`, driver
`gpu.peerpods.io`); a slice has no owner the garbage collector could follow, so `delete_pool`
(the `--delete` mode, or `--delete-on-exit` at SIGTERM) removes them on uninstall.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from providers.clouds.kube import KubeApiError, KubeClient, path_segment
from providers.dra.slices import DRIVER, Pool

__all__ = [
    "SLICES",
    "LeaseElector",
    "Publication",
    "delete_pool",
    "publish",
    "run_controller",
]

log = logging.getLogger(__name__)

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
HASH = "peerpods.io/content-hash"
POOL_LABEL = "peerpods.io/pool"


@dataclass(frozen=True)
class Publication:
    """What one publish did."""

    pool: str
    generation: int
    created: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.created or self.replaced or self.deleted)


def _content_hash(slice_: dict[str, Any]) -> str:
    """The slice as published, less its generation: equal when nothing but that changed."""
    spec = dict(slice_["spec"])
    spec["pool"] = {k: v for k, v in spec["pool"].items() if k != "generation"}
    text = json.dumps({"name": slice_["metadata"]["name"], "spec": spec}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def existing_slices(client: KubeClient, pool: str) -> list[dict[str, Any]]:
    """The slices of `pool` of this driver now stored."""
    selector = quote(f"spec.driver={DRIVER}", safe="=")
    labels = quote(f"{POOL_LABEL}={pool}", safe="=")
    answer = client.get(f"{SLICES}?fieldSelector={selector}&labelSelector={labels}")
    items = answer.get("items") or []
    return [i for i in items if isinstance(i, dict)]


def publish(client: KubeClient, pool: Pool) -> Publication:
    """Make the stored slices of `pool` what `pool` says (nothing written when they are)."""
    stored = existing_slices(client, pool.name)
    by_name = {s["metadata"]["name"]: s for s in stored}
    generation = max((int(s["spec"]["pool"].get("generation", 0)) for s in stored), default=0)
    desired = pool.slices(generation or 1)
    hashes = {s["metadata"]["name"]: _content_hash(s) for s in desired}
    same = set(by_name) == set(hashes) and all(
        (by_name[n]["metadata"].get("annotations") or {}).get(HASH) == h
        and int(by_name[n]["spec"]["pool"].get("generation", 0)) == generation
        for n, h in hashes.items()
    )
    if same and generation:
        return Publication(pool.name, generation)
    generation += 1
    created: list[str] = []
    replaced: list[str] = []
    for slice_ in pool.slices(generation):
        name = slice_["metadata"]["name"]
        slice_["metadata"].setdefault("annotations", {})[HASH] = hashes[name]
        if name in by_name:
            slice_["metadata"]["resourceVersion"] = by_name[name]["metadata"]["resourceVersion"]
            client.request("PUT", f"{SLICES}/{path_segment(name)}", slice_)
            replaced.append(name)
        else:
            client.request("POST", SLICES, slice_)
            created.append(name)
    deleted: list[str] = []
    for name in sorted(set(by_name) - set(hashes)):
        _delete(client, name)
        deleted.append(name)
    log.info(
        "pool %s generation %d: %d created, %d replaced, %d deleted",
        pool.name,
        generation,
        len(created),
        len(replaced),
        len(deleted),
    )
    return Publication(pool.name, generation, tuple(created), tuple(replaced), tuple(deleted))


def _delete(client: KubeClient, name: str) -> None:
    try:
        client.request("DELETE", f"{SLICES}/{path_segment(name)}")
    except KubeApiError as exc:
        if exc.status != 404:
            raise


def delete_pool(client: KubeClient, pool: str) -> tuple[str, ...]:
    """Delete every slice of `pool` of this driver (uninstall); the names deleted."""
    names = sorted(s["metadata"]["name"] for s in existing_slices(client, pool))
    for name in names:
        _delete(client, name)
    return tuple(names)


def _micro_time(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_micro_time(text: str) -> float:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


class LeaseElector:
    """Leader election over one coordination.k8s.io/v1 Lease: the holder renews it; another
    replica takes it over only once it has not been renewed for `duration_seconds`."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        duration_seconds: int = 15,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.path = LEASES.format(namespace=path_segment(namespace))
        self.name = name
        self.identity = identity
        self.duration_seconds = duration_seconds
        self._clock = clock

    def try_acquire(self) -> bool:
        """Take or renew the lease; whether this replica holds it now."""
        now = self._clock()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration_seconds,
            "renewTime": _micro_time(now),
        }
        try:
            lease = self.client.get(f"{self.path}/{path_segment(self.name)}")
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name},
                "spec": {**spec, "acquireTime": _micro_time(now)},
            }
            return self._write("POST", self.path, body)
        held = lease.get("spec") or {}
        holder = held.get("holderIdentity") or ""
        renewed = held.get("renewTime")
        duration = int(held.get("leaseDurationSeconds") or self.duration_seconds)
        expired = not renewed or _parse_micro_time(str(renewed)) + duration < now
        if holder and holder != self.identity and not expired:
            return False
        if holder != self.identity:
            spec["acquireTime"] = _micro_time(now)
            spec["leaseTransitions"] = int(held.get("leaseTransitions") or 0) + 1
        lease["spec"] = {**held, **spec}
        return self._write("PUT", f"{self.path}/{path_segment(self.name)}", lease)

    def _write(self, method: str, path: str, body: dict[str, Any]) -> bool:
        try:
            self.client.request(method, path, body)
        except KubeApiError as exc:
            if exc.status == 409:  # another replica wrote it first
                return False
            raise
        return True


async def run_controller(
    client: KubeClient,
    build: Callable[[], Pool],
    stop: asyncio.Event,
    *,
    resync_seconds: float = 30.0,
    elector: LeaseElector | None = None,
    delete_on_exit: bool = False,
) -> None:
    """Publish `build()` every `resync_seconds` while leader (always, without an elector) until
    `stop` is set; a catalog reload, a limit or a quota change is a new pool, so a new
    generation. A failed round is logged and retried at the next; `delete_on_exit` removes the
    pool's slices once stopped (uninstall)."""
    pool_name = ""
    while not stop.is_set():
        try:
            leader = elector is None or await asyncio.to_thread(elector.try_acquire)
            if leader:
                pool = await asyncio.to_thread(build)
                pool_name = pool.name
                await asyncio.to_thread(publish, client, pool)
        except Exception as exc:  # the API or the catalog failed this round: try again later
            log.warning("publishing the pool failed: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), resync_seconds)
    if delete_on_exit and pool_name:
        deleted = await asyncio.to_thread(delete_pool, client, pool_name)
        log.info("deleted %d slices of pool %s", len(deleted), pool_name)
