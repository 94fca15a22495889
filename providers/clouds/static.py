"""The `static` provider: a fixed pool of already running pod VMs (CAA's "byom").

Each endpoint `HOST:PORT` is a pod VM forwarder. Creating a VM leases a free endpoint to the
sandbox; deleting releases it. Leases live in a `LeaseBook` so the pool survives daemon restarts
when the daemon passes a durable one; the in-memory book serves tests and one-shot use.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from providers.core.base import (
    TAG_OWNER,
    TAG_POD_NAME,
    TAG_POD_NAMESPACE,
    TAG_SANDBOX,
    Instance,
    VMSpec,
)
from providers.core.errors import CapacityError, InvalidRequest
from providers.core.settings import csv

POOL = "static"


@dataclass(frozen=True)
class Endpoint:
    """One pod VM forwarder address."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """`HOST:PORT` or `[IPV6]:PORT`; raises InvalidRequest with the offending text."""
    raw = text.strip()
    if raw.startswith("["):
        host, sep, port = raw[1:].partition("]:")
    else:
        host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidRequest(f"invalid endpoint {text!r} (want HOST:PORT)")
    if ":" in host and not raw.startswith("["):
        raise InvalidRequest(f"invalid endpoint {text!r} (IPv6 needs [ADDR]:PORT)")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise InvalidRequest(f"invalid endpoint {text!r} (IPv6 needs [ADDR]:PORT)") from None
    elif not all(c.isalnum() or c in ".-" for c in host):
        raise InvalidRequest(f"invalid endpoint {text!r}: bad host")
    return Endpoint(host, int(port))


def parse_endpoints(text: str | Sequence[str]) -> tuple[Endpoint, ...]:
    """A comma-separated list (or a sequence) of endpoints, duplicates refused."""
    items = csv(text) if isinstance(text, str) else [i for i in text if i.strip()]
    endpoints = tuple(parse_endpoint(i) for i in items)
    seen = {str(e) for e in endpoints}
    if len(seen) != len(endpoints):
        raise InvalidRequest("duplicate endpoint in the static pool")
    return endpoints


class LeaseBook(Protocol):
    """Who holds which endpoint of a pool (the daemon's state store implements this)."""

    async def acquire_lease(
        self, pool: str, sandbox_id: str, endpoints: Sequence[str]
    ) -> str | None:
        """The endpoint the sandbox holds, leasing a free one if none; None when all are taken."""
        ...

    async def release_lease(self, pool: str, endpoint: str) -> None:
        """Free an endpoint."""
        ...

    async def leases(self, pool: str) -> dict[str, str]:
        """endpoint -> sandbox id."""
        ...


class MemoryLeaseBook:
    """A LeaseBook that forgets on exit."""

    def __init__(self) -> None:
        self._leases: dict[tuple[str, str], str] = {}
        self._lock = asyncio.Lock()

    async def acquire_lease(
        self, pool: str, sandbox_id: str, endpoints: Sequence[str]
    ) -> str | None:
        async with self._lock:
            for endpoint in endpoints:
                if self._leases.get((pool, endpoint)) == sandbox_id:
                    return endpoint
            for endpoint in endpoints:
                if (pool, endpoint) not in self._leases:
                    self._leases[(pool, endpoint)] = sandbox_id
                    return endpoint
            return None

    async def release_lease(self, pool: str, endpoint: str) -> None:
        async with self._lock:
            self._leases.pop((pool, endpoint), None)

    async def leases(self, pool: str) -> dict[str, str]:
        return {e: s for (p, e), s in sorted(self._leases.items()) if p == pool}


def pool_endpoints(endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
    """The pool's endpoints, checked: a pool has at least one (InvalidRequest otherwise)."""
    if not endpoints:
        raise InvalidRequest("the static provider needs --static-endpoints HOST:PORT[,...]")
    return endpoints


class StaticProvider:
    """Hands out pre-provisioned pod VMs, one sandbox per endpoint at a time."""

    name = "static"
    # The pool and its leases are this node's own, so every leased endpoint is ours to sweep.
    owner_id = "peerpods-static"
    # Pre-provisioned VMs: no region, zones or instance types to choose.
    region = ""
    zones: tuple[str, ...] = ()
    allowed_types: tuple[str, ...] = ()
    default_type = ""

    def __init__(
        self, endpoints: Sequence[Endpoint], leases: LeaseBook | None = None, pool: str = POOL
    ) -> None:
        self._endpoints = {str(e): e for e in pool_endpoints(endpoints)}
        self._leases: LeaseBook = leases if leases is not None else MemoryLeaseBook()
        self._pool = pool

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(self._endpoints.values())

    def _instance(self, key: str, sandbox_id: str, spec: VMSpec | None = None) -> Instance:
        endpoint = self._endpoints[key]
        tags = {TAG_OWNER: self.owner_id, TAG_SANDBOX: sandbox_id}
        if spec is not None:
            tags |= {TAG_POD_NAMESPACE: spec.pod_namespace, TAG_POD_NAME: spec.pod_name}
        return Instance(
            id=key,
            name=f"static-{key}",
            addresses=(endpoint.host,),
            instance_type="static",
            port=endpoint.port,
            tags=tags,
        )

    async def create(self, spec: VMSpec) -> Instance:
        """Lease a free endpoint (the same one again for a retried create)."""
        key = await self._leases.acquire_lease(self._pool, spec.sandbox_id, list(self._endpoints))
        if key is None:
            raise CapacityError(
                f"all {len(self._endpoints)} static endpoints are in use by other sandboxes"
            )
        return self._instance(key, spec.sandbox_id, spec)

    async def delete(self, instance_id: str) -> None:
        """Release the endpoint; an endpoint not leased (or no longer configured) is fine."""
        await self._leases.release_lease(self._pool, instance_id)

    async def list_owned(self) -> list[Instance]:
        """The leased endpoints that are still part of the configured pool."""
        held = await self._leases.leases(self._pool)
        return [self._instance(k, s) for k, s in held.items() if k in self._endpoints]
