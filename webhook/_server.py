"""The HTTPS server: starlette routes on uvicorn, TLS files re-read when their content changes.

cert-manager rewrites a mounted Secret in place and mounted Secrets give no file events, so a
task hashes the certificate and key every `reload_seconds` and loads a changed pair into the
live SSLContext (new connections get the new certificate; a half-written pair that fails to load
is retried on the next tick, the old one stays in use). Request bodies are bounded; admission runs
in a worker thread because DRA lookups block.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from providers.errors import InvalidRequest
from webhook._admission import Admission

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 3 * 1024 * 1024  # the API server's own limit on an object is 3 MiB


class _TooLarge(Exception):
    pass


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(
    admission: Admission, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
) -> Starlette:
    """The ASGI app: POST /mutate, GET /healthz."""

    async def mutate(request: Request) -> Response:
        try:
            body = await _read_body(request, max_request_bytes)
        except _TooLarge:
            return PlainTextResponse(
                f"request body exceeds {max_request_bytes} bytes\n", status_code=413
            )
        try:
            answer: dict[str, Any] = await asyncio.to_thread(admission.review, body)
        except InvalidRequest as exc:
            return PlainTextResponse(f"{exc}\n", status_code=400)
        except Exception:
            log.exception("admission failed")
            return PlainTextResponse("internal error\n", status_code=500)
        return Response(json.dumps(answer, separators=(",", ":")), media_type="application/json")

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            Route("/mutate", mutate, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


class TlsFiles:
    """A server SSLContext over a certificate and key file, reloaded on content change."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.digest = _digest(cert_file, key_file)
        self.context.load_cert_chain(cert_file, key_file)
        self.reloads = 0

    def refresh(self) -> bool:
        """Load the files again if their content changed; True when a new pair is in use."""
        try:
            digest = _digest(self.cert_file, self.key_file)
            if digest == self.digest:
                return False
            # a failed load leaves a context half-updated: check the pair in a scratch one first
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert_file, self.key_file)
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            log.warning("TLS files not reloaded (will retry): %s", exc)
            return False
        self.digest = digest
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.cert_file)
        return True

    async def watch(self, interval_seconds: float) -> None:
        while True:
            await asyncio.sleep(interval_seconds)
            await asyncio.to_thread(self.refresh)


@dataclass
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = 8443
    cert_file: Path = Path("/etc/peerpods/tls/tls.crt")
    key_file: Path = Path("/etc/peerpods/tls/tls.key")
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    reload_seconds: float = 10.0
    shutdown_seconds: float = 10.0


class WebhookServer:
    """uvicorn serving the app over TLS, plus the TLS watcher; `port` is known once listening."""

    def __init__(self, admission: Admission, config: ServerConfig) -> None:
        self.config = config
        self.tls = TlsFiles(config.cert_file, config.key_file)
        self.app = build_app(admission, config.max_request_bytes)
        self.port = 0
        self.started = asyncio.Event()
        self._server: uvicorn.Server | None = None

    def bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it: uvicorn writes a response's head and body separately,
        # and without it the body waits for the client's delayed ACK (~40 ms per request).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((self.config.host, self.config.port))
        sock.set_inheritable(True)
        self.port = sock.getsockname()[1]
        return sock

    async def serve(self) -> None:
        """Run until stopped (`stop()` or a signal); the watcher task ends with it."""
        uv_config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=int(self.config.shutdown_seconds),
            lifespan="off",
        )
        uv_config.load()
        uv_config.ssl = self.tls.context
        server = uvicorn.Server(uv_config)
        self._server = server
        sock = self.bind()
        watcher = asyncio.create_task(self.tls.watch(self.config.reload_seconds), name="tls-watch")
        serving = asyncio.create_task(server.serve(sockets=[sock]), name="uvicorn")
        try:
            # uvicorn exposes `started` as a flag only
            while not server.started and not serving.done():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            self.started.set()
            await serving
        finally:
            server.should_exit = True
            for task in (watcher, serving):
                if not task.done():
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            sock.close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True


@contextlib.asynccontextmanager
async def running(server: WebhookServer) -> AsyncIterator[WebhookServer]:
    """Serve in a task for the duration of the block (tests, benchmarks)."""
    task = asyncio.create_task(server.serve(), name="webhook")
    try:
        done, _ = await asyncio.wait(
            [task, asyncio.ensure_future(server.started.wait())],
            return_when=asyncio.FIRST_COMPLETED,
        )
        if task in done:
            task.result()
        yield server
    finally:
        server.stop()
        try:
            await asyncio.wait_for(task, server.config.shutdown_seconds + 5)
        except TimeoutError:
            task.cancel()
