"""HTTP status API (Starlette), served by the daemon on `--status-address` (loopback by default).

    GET /v1/sandboxes        every sandbox: pod, instance type, capacity type (spot or on-demand),
                             VM id, zone, state and reason (e.g. preempted: what the cloud said),
                             devices; a sandbox whose stored record cannot be read is listed with
                             state "quarantined" and the reason; under "abandoned", the last
                             sandboxes torn down because their shim never came back after a
                             restart, with why. At most 1 s old, and 20 a second for all
                             clients together (429 beyond, with Retry-After)
    GET /v1/sandboxes/{id}   one sandbox (a quarantined or abandoned one as in the list);
                             404 {code, message} when unknown
    GET /v1/quota            the cloud account's quotas as last read (limits shared by every
                             node, with usage and whether exhausted: candidates over one are
                             tried last), or null when the cloud offers none
    GET /healthz             200 "ok" while the daemon serves
    GET /readyz              200 "ok" once the hypervisor socket serves and the cloud answers,
                             else 503 with why (the DaemonSet's readiness probe)
    GET /metrics             Prometheus text format

Errors are JSON `{"code": ..., "message": ...}` with a matching HTTP status. A request whose
Host header names neither an IP address, `localhost` nor one of the node's names is refused
with 400 (adaptor.status.hosts: a browser on the node cannot reach this through DNS rebinding).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from adaptor.runtime import metrics
from adaptor.state import QuarantinedRecord, SandboxRecord
from adaptor.status.abandoned import AbandonedBook
from adaptor.status.devices import DeviceBook
from adaptor.status.hosts import HostCheck
from providers.core.account_quota import AccountQuota


class SandboxSource(Protocol):
    """What the API reads sandboxes from (the state store)."""

    async def records(self) -> list[SandboxRecord]: ...

    async def get(self, sandbox_id: str) -> SandboxRecord | None: ...

    async def quarantined(self) -> dict[str, str]: ...


LISTING_SECONDS = 1.0  # how old a listing may be
LISTINGS_PER_SECOND = 20  # listings sent, all clients together; 429 beyond


def quarantined_json(sandbox_id: str, reason: str) -> dict[str, Any]:
    """A sandbox whose record is unreadable: only what is known, the id and why."""
    return {"id": sandbox_id, "state": "quarantined", "reason": f"unreadable record: {reason}"}


def sandbox_json(record: SandboxRecord, devices: DeviceBook) -> dict[str, Any]:
    """The public view of a sandbox: no annotations values beyond what operators need."""
    instance = record.instance
    return {
        "id": record.id,
        "pod": {"namespace": record.pod_namespace, "name": record.pod_name},
        "state": record.state.value,
        "reason": record.reason,
        "instance_type": instance.instance_type if instance else "",
        "capacity_type": instance.capacity_type if instance else "",
        "vm_id": instance.id if instance else "",
        "zone": instance.zone if instance else "",
        "addresses": list(instance.addresses) if instance else [],
        "agent_socket": record.agent_socket,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "containers": devices.snapshot(record.id),
        "pod_network": _pod_network(record),
    }


def _pod_network(record: SandboxRecord) -> dict[str, Any] | None:
    """Pod IP, VNI, worker IP, the VM end and the tunnel's state (null: no pod network)."""
    if not record.pod_network:
        return None
    from adaptor.podnet import PodNetError, Tunnel

    try:
        return Tunnel.from_json(record.pod_network).status()
    except PodNetError as exc:
        return {"state": "unknown", "error": str(exc)}


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status)


def build_app(
    source: SandboxSource,
    devices: DeviceBook,
    *,
    refresh_metrics: Callable[[], Awaitable[None]] | None = None,
    abandoned: AbandonedBook | None = None,
    host_names: Iterable[str] = (),
    readiness: Callable[[], Awaitable[tuple[bool, str]]] | None = None,
    account_quota: Callable[[], AccountQuota | None] | None = None,
) -> Starlette:
    """The status application over a sandbox source, the device book and the sandboxes given
    up after a restart; `host_names`: the node's names a request's Host may carry (besides IP
    addresses and localhost)."""
    api = _Endpoints(
        listing=_Listing(source, devices, abandoned or AbandonedBook()),
        source=source,
        devices=devices,
        abandoned=abandoned or AbandonedBook(),
        refresh_metrics=refresh_metrics,
        readiness=readiness,
        account_quota=account_quota,
    )
    return Starlette(
        routes=[
            Route("/v1/sandboxes", api.list_sandboxes, methods=["GET"]),
            Route("/v1/sandboxes/{sandbox_id}", api.get_sandbox, methods=["GET"]),
            Route("/v1/quota", api.quota, methods=["GET"]),
            Route("/healthz", api.healthz, methods=["GET"]),
            Route("/readyz", api.readyz, methods=["GET"]),
            Route("/metrics", api.metrics_text, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
        middleware=[Middleware(HostCheck, names=tuple(host_names))],
    )


class _Listing:
    """The sandbox list as last rendered, at most LISTING_SECONDS old: a flood of listings
    costs the state thread (which CreateVM and StopVM wait on) one read a second, and the
    event loop one rendering a second; the encoding runs in a thread."""

    def __init__(self, source: SandboxSource, devices: DeviceBook, abandoned: AbandonedBook):
        self._source = source
        self._devices = devices
        self._abandoned = abandoned
        self._body = b""
        self._at = -LISTING_SECONDS
        self._pending: asyncio.Future[bytes] | None = None
        # a token bucket: LISTINGS_PER_SECOND, as many at once; writing a large listing costs
        # the event loop about a millisecond, so a flood would still queue CreateVM behind it
        self._tokens = float(LISTINGS_PER_SECOND)
        self._filled = time.monotonic()

    def admit(self) -> bool:
        """Whether one more listing may be sent now (429 otherwise)."""
        now = time.monotonic()
        self._tokens = min(
            float(LISTINGS_PER_SECOND), self._tokens + (now - self._filled) * LISTINGS_PER_SECOND
        )
        self._filled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    async def body(self) -> bytes:
        if time.monotonic() - self._at < LISTING_SECONDS:
            return self._body
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._render())
        pending = self._pending
        try:
            return await asyncio.shield(pending)
        finally:
            if pending.done() and self._pending is pending:
                self._pending = None

    async def _render(self) -> bytes:
        records = await self._source.records()
        quarantined = await self._source.quarantined()
        # the device book changes on the loop: read here; only the encoding runs in the thread
        listed = [sandbox_json(r, self._devices) for r in records]
        listed += [quarantined_json(i, why) for i, why in quarantined.items()]
        document = {"sandboxes": listed, "abandoned": self._abandoned.snapshot()}
        self._body = await asyncio.to_thread(lambda: json.dumps(document).encode())
        self._at = time.monotonic()
        return self._body


@dataclass(frozen=True)
class _Endpoints:
    """The handlers of the routes, over what they read."""

    listing: _Listing
    source: SandboxSource
    devices: DeviceBook
    abandoned: AbandonedBook
    refresh_metrics: Callable[[], Awaitable[None]] | None
    readiness: Callable[[], Awaitable[tuple[bool, str]]] | None
    account_quota: Callable[[], AccountQuota | None] | None

    async def list_sandboxes(self, request: Request) -> Response:
        if not self.listing.admit():
            response = _error(429, "too_many_requests", "listings are rate limited; retry")
            response.headers["Retry-After"] = "1"
            return response
        return Response(await self.listing.body(), media_type="application/json")

    async def get_sandbox(self, request: Request) -> Response:
        sandbox_id = request.path_params["sandbox_id"]
        try:
            record = await self.source.get(sandbox_id)
        except QuarantinedRecord:
            reason = (await self.source.quarantined()).get(sandbox_id, "")
            return JSONResponse(quarantined_json(sandbox_id, reason))
        if record is None:
            entry = self.abandoned.get(sandbox_id)
            if entry is not None:
                return JSONResponse(entry)
            return _error(404, "not_found", f"no sandbox {sandbox_id!r}")
        return JSONResponse(sandbox_json(record, self.devices))

    async def quota(self, request: Request) -> Response:
        found = self.account_quota() if self.account_quota is not None else None
        return JSONResponse({"account": found.to_dict() if found is not None else None})

    async def healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(self, request: Request) -> Response:
        ready, why = (True, "ok") if self.readiness is None else await self.readiness()
        return PlainTextResponse(why, status_code=200 if ready else 503)

    async def metrics_text(self, request: Request) -> Response:
        if self.refresh_metrics is not None:
            await self.refresh_metrics()
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "error")
    return _error(exc.status_code, code, str(exc.detail))


async def _internal_error(request: Request, exc: Exception) -> Response:
    return _error(500, "internal", f"{type(exc).__name__}: status unavailable")


async def refresh_sandbox_gauge(source: SandboxSource) -> None:
    """Recount sandboxes by state into the gauge (called on each scrape)."""
    counts: dict[str, int] = {}
    for record in await source.records():
        counts[record.state.value] = counts.get(record.state.value, 0) + 1
    counts["quarantined"] = len(await source.quarantined())  # unreadable records, kept aside
    metrics.set_sandbox_counts(counts)
