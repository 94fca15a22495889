"""The image store as a read-only registry mirror (the pull half of the OCI distribution API:
manifests, blobs, tags).

The image puller in the guest is configured with this mirror for each registry
(containers-registries.conf: `location = "127.0.0.1:5170/docker.io"`), so it asks for
`/v2/docker.io/library/busybox/manifests/1.36`: the first path component after `/v2/` is the
upstream registry, the rest the repository. What the store has is served as the registry served
it (same bytes, media type and digest). A registry with a port cannot be a path component
(the reference grammar has no `:` there), so its colon is written `_`, which no host name
holds: `127.0.0.1:5170/registry.example_5000` mirrors `registry.example:5000`
(`mirror_location` writes it). Anything not stored is a 404 with the distribution API's error
body, and the puller goes on to the image's own registry. Writes are 405. Names are checked
against the reference grammar and never reach a file path (blobs are found by digest only). A
store it cannot read (a damaged index) answers 404 too: the puller then goes to the origin.

It listens on loopback only (127.0.0.1:5170) unless told otherwise: it serves every pulled image
to anyone who can reach it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from adaptor.podvm.imagecache.reference import is_digest, is_registry, is_repository, is_tag
from adaptor.podvm.imagecache.registry import Limits
from adaptor.podvm.imagecache.store import ImageStore, StoreError
from providers.core.errors import InvalidRequest

log = logging.getLogger(__name__)

DEFAULT_MIRROR_ADDRESS = "127.0.0.1:5170"
API_VERSION = {"Docker-Distribution-API-Version": "registry/2.0"}
_CHUNK = 1 << 20
_READ_METHODS = ("GET", "HEAD")
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class ListenAddressError(InvalidRequest):
    """A listen address that is not host:port, or not loopback when that was not allowed."""


def parse_listen(text: str, *, allow_remote: bool = False) -> tuple[str, int]:
    """(host, port) of `127.0.0.1:5170` or `[::1]:5170`; non-loopback only when allowed."""
    host, sep, port_text = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ListenAddressError(f"invalid listen address {text!r} (host:port)")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        raise ListenAddressError(f"invalid listen address {text!r}: not an IP address") from None
    if not loopback and not allow_remote:
        raise ListenAddressError(
            f"listen address {text}: not loopback; the mirror serves every stored image to "
            "whoever reaches it (--allow-remote to listen there anyway)"
        )
    return host, int(port_text)


def mirror_location(registry: str, address: str = DEFAULT_MIRROR_ADDRESS) -> str:
    """The mirror's location for `registry`, as a registries.conf `[[registry.mirror]]` names it:
    `127.0.0.1:5170/docker.io`, `127.0.0.1:5170/registry.example_5000` for a port."""
    return f"{address}/{registry.replace(':', '_')}"


def upstream_of(component: str) -> str:
    """The registry a mirror path's first component names (`host_5000` is `host:5000`)."""
    host, sep, port = component.rpartition("_")
    return f"{host}:{port}" if sep and port.isdigit() else component


def create_app(store: ImageStore) -> Starlette:
    """The mirror over `store`."""

    async def root(request: Request) -> Response:
        if request.method not in _READ_METHODS:
            return _read_only()
        return Response(b"{}", media_type="application/json", headers=API_VERSION)

    async def content(request: Request) -> Response:
        if request.method not in _READ_METHODS:
            return _read_only()
        parts = str(request.path_params["rest"]).split("/")
        if parts[-2:] == ["tags", "list"]:
            parts = [*parts[:-2], "tags", ""]
        if len(parts) < 4 or parts[-2] not in ("manifests", "blobs", "tags"):
            return _error(404, "NAME_UNKNOWN", "not a manifest, blob or tags path")
        registry, repository, kind, ref = (
            upstream_of(parts[0]),
            "/".join(parts[1:-2]),
            parts[-2],
            parts[-1],
        )
        if not (is_registry(registry) and is_repository(repository)):
            return _error(404, "NAME_UNKNOWN", "invalid repository name")
        head = request.method == "HEAD"
        if kind == "tags":
            name = "/".join(parts[:-2])
            return await _tags(store, registry, repository, name, head)
        if kind == "manifests":
            return await _manifest(store, registry, repository, ref, head)
        return await _blob(store, registry, repository, ref, head)

    async def unknown(request: Request, exc: Exception) -> Response:
        return _error(404, "NOT_FOUND", "not a registry API path")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _read_only()

    async def unreadable(request: Request, exc: Exception) -> Response:
        log.warning("image store unreadable, answering 404: %s", exc)
        return _error(404, "NAME_UNKNOWN", "the mirror's store is unreadable")

    return Starlette(
        routes=[
            Route("/v2/", root, methods=_ALL_METHODS),
            Route("/v2/{rest:path}", content, methods=_ALL_METHODS),
        ],
        exception_handlers={404: unknown, 405: not_allowed, StoreError: unreadable},
    )


async def _manifest(
    store: ImageStore, registry: str, repository: str, ref: str, head: bool
) -> Response:
    if not (is_tag(ref) or is_digest(ref)):
        return _error(404, "MANIFEST_UNKNOWN", "invalid tag or digest")
    found = await run_in_threadpool(store.resolve, registry, repository, ref)
    if found is None:
        if not await run_in_threadpool(store.has_repository, registry, repository):
            return _error(404, "NAME_UNKNOWN", "repository not in the mirror")
        return _error(404, "MANIFEST_UNKNOWN", "manifest not in the mirror")
    limit = Limits().max_manifest_bytes
    body = await run_in_threadpool(store.read_blob, found.digest, limit)
    if body is None:
        return _error(404, "MANIFEST_UNKNOWN", "manifest not in the mirror")
    headers = {
        **API_VERSION,
        "Docker-Content-Digest": found.digest,
        "Content-Length": str(len(body)),
    }
    return Response(b"" if head else body, media_type=found.media_type, headers=headers)


async def _tags(
    store: ImageStore, registry: str, repository: str, name: str, head: bool
) -> Response:
    tags = await run_in_threadpool(store.tags, registry, repository)
    if tags is None:
        return _error(404, "NAME_UNKNOWN", "repository not in the mirror")
    response = JSONResponse({"name": name, "tags": tags}, headers=API_VERSION)
    if head:
        response.body = b""
    return response


async def _blob(
    store: ImageStore, registry: str, repository: str, digest: str, head: bool
) -> Response:
    known = is_digest(digest) and await run_in_threadpool(
        store.repository_blob, registry, repository, digest
    )
    size = await run_in_threadpool(store.blob_size, digest) if known else None
    if size is None:
        if not await run_in_threadpool(store.has_repository, registry, repository):
            return _error(404, "NAME_UNKNOWN", "repository not in the mirror")
        return _error(404, "BLOB_UNKNOWN", "blob not in the mirror")
    headers = {**API_VERSION, "Docker-Content-Digest": digest, "Content-Length": str(size)}
    kind = "application/octet-stream"
    if head:
        return Response(b"", media_type=kind, headers=headers)
    return StreamingResponse(_chunks(store, digest, size), media_type=kind, headers=headers)


async def _chunks(store: ImageStore, digest: str, size: int) -> AsyncIterator[bytes]:
    """A stored blob's bytes, read in a thread chunk by chunk. The file is opened only once
    the body is being sent, and closed when it ends or is abandoned (a cancelled read finishes
    its thread before the close). A blob gone or changed since the headers ends the body
    early, which the client's digest check catches."""
    opened = await run_in_threadpool(store.open_blob, digest)
    if opened is None:
        return
    fd, now = opened
    try:
        offset = 0
        while now == size and offset < size:
            chunk = await run_in_threadpool(os.pread, fd, min(_CHUNK, size - offset), offset)
            if not chunk:
                break
            offset += len(chunk)
            yield chunk
    finally:
        os.close(fd)


def _error(status: int, code: str, message: str) -> Response:
    body = {"errors": [{"code": code, "message": message, "detail": None}]}
    return JSONResponse(body, status_code=status, headers=API_VERSION)


def _read_only() -> Response:
    return _error(405, "UNSUPPORTED", "the mirror is read-only")


def serve(store: ImageStore, address: str, *, allow_remote: bool = False) -> None:
    """Serve the mirror until SIGINT or SIGTERM (uvicorn's graceful shutdown)."""
    host, port = parse_listen(address, allow_remote=allow_remote)
    config = uvicorn.Config(
        create_app(store),
        host=host,
        port=port,
        lifespan="off",
        access_log=False,
        log_config=None,
        server_header=False,
    )
    store.sweep()  # a warm boot's pull stopped mid-blob: its partial file goes
    log.info("image mirror on %s:%d, store %s", host, port, store.root)
    uvicorn.Server(config).run()
