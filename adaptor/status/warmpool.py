"""`GET /v1/warm-pool`: the warm pools, each VM and what they cost while stopped.

Added to the status application beside its own routes (`add_warm_pool_route`); without warm
pools the route answers `null`.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

Snapshot = Callable[[], dict[str, object]]


def add_warm_pool_route(app: Starlette, snapshot: Snapshot | None) -> None:
    """Serve the pools' snapshot (adaptor.warmpool.WarmPool.snapshot) at /v1/warm-pool."""

    async def warm_pool(request: Request) -> Response:
        return JSONResponse(snapshot() if snapshot is not None else None)

    app.router.routes.append(Route("/v1/warm-pool", warm_pool, methods=["GET"]))
