"""The HTTPS server: starlette routes on uvicorn, TLS files re-read when their content changes.

cert-manager rewrites a mounted Secret in place and mounted Secrets give no file events, so a
task hashes the certificate and key every `reload_seconds` and loads a changed pair into the
live SSLContext (new connections get the new certificate; a half-written pair that fails to load
is retried on the next tick, the old one stays in use).

Bounded against clients that misbehave (`ServerLimits`): a connection over `max_connections` is
closed as it is accepted, before any TLS state exists for it (asyncio gives every TLS connection
a 256 KiB buffer from its first byte, so 1,800 idle connections were once 700 MiB); the TLS
handshake and then the request headers must each be done within `header_timeout_seconds` (of
the connection, or of the previous response), the body within `body_timeout_seconds` (else
408), and the body is at most `max_request_bytes` (else 413). TLS is therefore set up here, per
accepted connection, rather than by uvicorn. Admission runs in worker threads because DRA lookups
block: plain pods in one pool, pods that evaluate DRA selectors in another, so a slow selector
never queues an ordinary pod; the selectors themselves run in killable worker processes
(`_celworker.py`), so the event loop and `/healthz` never wait on CEL. A pod with DRA claims
whose objects and selector outcomes are all in memory (read and evaluated for an earlier pod) is
decided in the first pool at once: only one that must wait takes the second pool and its share.
A small request (`inline_request_bytes`) whose decision needs nothing that waits is decided on
the event loop itself, with no thread hand-off at all.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import gc
import hashlib
import ipaddress
import json
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import h11
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from providers.core.errors import InvalidRequest, PeerpodsError
from webhook._admission import Admission
from webhook._celworker import CelWorkers
from webhook._devices import DeviceSpace
from webhook._reviews import AdmissionReview, response
from webhook._settings import ServerSettings

IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

log = logging.getLogger(__name__)


class _TooLarge(Exception):
    pass


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    digits = declared is not None and declared.isascii() and declared.isdigit()
    if declared is not None and digits and (len(declared) > 18 or int(declared) > limit):
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass(frozen=True)
class ServerLimits:
    """What one client may take of the server: the settings of `ServerConfig` (declared there,
    webhook._settings) and the thread pools derived from them (`ServerConfig.limits`)."""

    max_request_bytes: int
    max_connections: int  # open connections; ~0.3 MiB each with TLS
    header_timeout_seconds: float  # connection (or last response) to complete headers
    body_timeout_seconds: float  # headers to complete body (the API server waits <= 30s)
    max_connections_per_source: int  # open connections from one address
    # of max_connections, kept for the API server's addresses (api_server_networks)
    reserved_connections: int
    api_server_networks: tuple[IPNetwork, ...]
    # /mutate answers only clients with a certificate from the client CA (403 otherwise)
    require_client_cert: bool
    # a body up to this size whose decision needs nothing that waits (Admission.
    # decide_from_memory) is decided on the event loop: the thread hand-off cost as much as a
    # typical decision (~0.5 ms), and under the GIL the thread would not run beside the loop
    # anyway. A decision costs up to ~0.5 ms per KiB (many containers each asking for GPUs):
    # the loop is held ~4 ms at most; a larger pod goes to the pool, which yields every 5 ms.
    inline_request_bytes: int = 8 << 10
    admission_threads: int = 8  # pods that evaluate no selector
    selector_threads: int = 16  # pods that do (they wait on the CEL workers or the API)
    # DRA admissions of one namespace in flight at once that must wait (an API lookup, a CEL
    # worker) (0: three quarters of selector_threads, the rest kept for the others); one more
    # is refused at once (429), never queued behind them. Those decided from memory (their
    # objects and selector outcomes cached) take none of it.
    namespace_selector_admissions: int = 0

    @property
    def namespace_share(self) -> int:
        share = self.namespace_selector_admissions or self.selector_threads * 3 // 4
        return max(1, min(share, self.selector_threads))

    def trusted(self, host: str) -> bool:
        """Whether an address is the API server's (exempt from the per-source limit)."""
        if not self.api_server_networks or not host:
            return False
        try:
            address = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self.api_server_networks)


class _SelectorGate:
    """DRA admissions in flight, per namespace and in all: over either bound, refused.

    Used on the event loop only (no lock). The selector pool has as many threads as the total
    bound, so an admitted one never waits in the pool's queue either."""

    def __init__(self, limits: ServerLimits) -> None:
        self.share = limits.namespace_share
        self.total = limits.selector_threads
        self.in_flight: dict[str, int] = {}
        self.refusals = 0

    def at_share(self, namespace: str) -> bool:
        """Whether the namespace holds its whole share (its next DRA pod is refused)."""
        return self.in_flight.get(namespace, 0) >= self.share

    def enter(self, namespace: str) -> str:
        """ "" when admitted, else why not (the caller answers 429)."""
        held = self.in_flight.get(namespace, 0)
        if held >= self.share:
            self.refusals += 1
            return (
                f"peerpods: namespace {namespace or '(none)'} already has {held} pods with DRA "
                "claims in admission (its share); retry"
            )
        if sum(self.in_flight.values()) >= self.total:
            self.refusals += 1
            return f"peerpods: {self.total} pods with DRA claims are in admission already; retry"
        self.in_flight[namespace] = held + 1
        return ""

    def leave(self, namespace: str) -> None:
        held = self.in_flight[namespace] - 1
        if held:
            self.in_flight[namespace] = held
        else:
            del self.in_flight[namespace]


class _Pools:
    """The two admission thread pools, shut down with the server."""

    def __init__(self, limits: ServerLimits) -> None:
        self.plain = ThreadPoolExecutor(limits.admission_threads, thread_name_prefix="admit")
        self.selectors = ThreadPoolExecutor(limits.selector_threads, thread_name_prefix="admit-cel")

    def shutdown(self) -> None:
        self.plain.shutdown(wait=False, cancel_futures=True)
        self.selectors.shutdown(wait=False, cancel_futures=True)


def build_app(admission: Admission, limits: ServerLimits | None = None) -> Starlette:
    """The ASGI app: POST /mutate, GET /healthz (alive), GET /readyz (the catalog loads),
    GET /metrics (webhook._metrics). `app.state.pools` holds its thread pools. Without
    `limits`: the declared defaults'."""
    limits = limits or ServerConfig().limits
    pools = _Pools(limits)
    gate = _SelectorGate(limits)
    mutate = _MutateRoute(admission, limits, pools, gate)
    app = Starlette(
        routes=[
            Route("/mutate", mutate.handle, methods=["POST"]),
            Route("/healthz", _healthz, methods=["GET"]),
            Route("/readyz", _Readiness(admission).handle, methods=["GET"]),
            Route("/metrics", _metrics, methods=["GET"]),
        ]
    )
    app.state.pools = pools
    app.state.selector_gate = gate
    return app


class _MutateRoute:
    """POST /mutate: the client checked, the body read within its limits, then the review
    decided in the thread pools (plain pods in one, pods that evaluate selectors in the other)."""

    def __init__(
        self, admission: Admission, limits: ServerLimits, pools: _Pools, gate: _SelectorGate
    ) -> None:
        self.admission = admission
        self.limits = limits
        self.pools = pools
        self.gate = gate

    async def handle(self, request: Request) -> Response:
        arrived = time.monotonic()  # the CEL time limit counts from here, queueing included
        limits = self.limits
        if limits.require_client_cert and not getattr(request.state, "client_verified", False):
            return PlainTextResponse(
                "a client certificate from the configured client CA is required\n",
                status_code=403,
            )
        body = await self._read(request)
        if isinstance(body, Response):
            return body
        try:
            answer = await self._answer(body, arrived)
        except InvalidRequest as exc:
            return PlainTextResponse(f"{exc}\n", status_code=400)
        except Exception:
            log.exception("admission failed")
            return PlainTextResponse("internal error\n", status_code=500)
        return Response(json.dumps(answer, separators=(",", ":")), media_type="application/json")

    async def _read(self, request: Request) -> bytes | Response:
        """The request body, or the response refusing it (too large, or too slow)."""
        limits = self.limits
        try:
            async with asyncio.timeout(limits.body_timeout_seconds):
                return await _read_body(request, limits.max_request_bytes)
        except _TooLarge:
            return PlainTextResponse(
                f"request body exceeds {limits.max_request_bytes} bytes\n", status_code=413
            )
        except TimeoutError:
            return PlainTextResponse(
                f"request body not received within {limits.body_timeout_seconds:g}s\n",
                status_code=408,
            )

    async def _answer(self, body: bytes, arrived: float) -> dict[str, Any]:
        """The admission response: a small one decided here when nothing it needs waits, else
        decided in the plain pool, or, for a pod that evaluates selectors and must wait, in the
        selector pool within its namespace's share (else refused with 429)."""
        loop = asyncio.get_running_loop()
        if len(body) <= self.limits.inline_request_bytes:
            review = self.admission.parse(body)
            selectors = self.admission.needs_selectors(review)
            answer = None
            # a namespace holding its whole share is refused at once, as cheaply as it was sent
            if not (selectors and self.gate.at_share(review.request.namespace)):
                answer = self.admission.decide_from_memory(review, arrived)
            if answer is None and not selectors:
                plain = self.pools.plain
                answer = await loop.run_in_executor(plain, self.admission.decide, review, arrived)
        else:
            plain = self.pools.plain
            review, answer = await loop.run_in_executor(plain, self._plain, body, arrived)
        if answer is not None:
            return answer
        namespace = review.request.namespace
        refused = self.gate.enter(namespace)
        if refused:
            return response(review.request.uid, allowed=False, code=429, message=refused)
        try:
            return await loop.run_in_executor(
                self.pools.selectors, self.admission.decide, review, arrived
            )
        finally:
            self.gate.leave(namespace)

    def _plain(self, body: bytes, arrived: float) -> tuple[AdmissionReview, dict[str, Any] | None]:
        """Parse, and decide at once (one thread hop) unless the pod needs the selector pool:
        a pod with DRA claims does only when a lookup or a selector evaluation is not in memory
        (so a burst of pods from one template neither waits for nor counts against its share)."""
        review = self.admission.parse(body)
        if self.admission.needs_selectors(review):
            return review, self.admission.decide_from_memory(review, arrived)
        return review, self.admission.decide(review, arrived)


async def _healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


class _Readiness:
    """GET /readyz: ready once the catalog of the configured provider and region loads. Until
    then (a region with no bundled catalog whose refresh has not written one yet) 503 with the
    reason, so the Service sends no review here while the process stays up and alive (/healthz),
    and turns ready by itself when the file appears."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    async def handle(self, request: Request) -> Response:
        try:
            # the source may stat or read a file (a network volume): never on the event loop
            await asyncio.to_thread(self.admission.view)
        except PeerpodsError as exc:
            return JSONResponse({"status": "not ready", "reason": str(exc)}, status_code=503)
        return JSONResponse({"status": "ready"})


async def _metrics(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from webhook._metrics import REGISTRY

    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


class _Connections:
    """Open connections, in all and per source address, against `ServerLimits`.

    A source outside the API server's networks may hold at most `max_connections_per_source`,
    and all such sources together `max_connections - reserved_connections`, so one address
    re-opening half-sent requests can neither take the cap nor lock the API server out."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self.total = 0
        self.untrusted = 0
        self.per_source: dict[str, int] = {}
        self.refused = 0

    def take(self, host: str) -> bool:
        limits = self.limits
        if self.total >= limits.max_connections:
            return self._refuse(host, f"all {self.total} connections are open")
        if limits.trusted(host):
            self.total += 1
            return True
        reserve = limits.reserved_connections if limits.api_server_networks else 0
        if self.untrusted >= limits.max_connections - reserve:
            return self._refuse(host, "the rest is reserved for the API server")
        held = self.per_source.get(host, 0)
        if held >= limits.max_connections_per_source:
            return self._refuse(host, f"{held} open from this address")
        self.total += 1
        self.untrusted += 1
        self.per_source[host] = held + 1
        return True

    def _refuse(self, host: str, why: str) -> bool:
        self.refused += 1
        if self.refused & (self.refused - 1) == 0:  # the 1st, 2nd, 4th, 8th...: no log flood
            log.warning("connection from %s refused: %s (%d refused)", host, why, self.refused)
        return False

    def release(self, host: str) -> None:
        self.total -= 1
        if self.limits.trusted(host):
            return
        self.untrusted -= 1
        held = self.per_source[host] - 1
        if held:
            self.per_source[host] = held
        else:
            del self.per_source[host]


def _gated_tls(
    http: type[H11Protocol], context: ssl.SSLContext, limits: ServerLimits
) -> tuple[Callable[..., asyncio.BaseProtocol], _Connections]:
    """uvicorn's protocol factory: each accepted connection counted by its source address (TLS
    handshakes included) and, within the limits, wrapped in TLS with a handshake deadline; over
    them, closed as it is accepted, before any TLS state exists for it."""
    connections = _Connections(limits)

    class Counted(asyncio.sslproto.SSLProtocol):
        _source: str | None = None  # set once counted

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            peer = transport.get_extra_info("peername")
            host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
            if not connections.take(host):
                assert isinstance(transport, asyncio.Transport)
                transport.abort()
                return
            self._source = host
            super().connection_made(transport)

        def connection_lost(self, exc: BaseException | None) -> None:
            if self._source is None:
                return  # refused: never counted, no TLS state
            connections.release(self._source)
            self._source = None
            super().connection_lost(exc)

    def accept(*args: Any, **kwargs: Any) -> asyncio.BaseProtocol:
        loop = kwargs.get("_loop") or asyncio.get_running_loop()
        return Counted(
            loop,
            http(*args, **kwargs),
            context,
            None,  # type: ignore[arg-type]  # no waiter: a server connection
            server_side=True,
            ssl_handshake_timeout=limits.header_timeout_seconds,  # type: ignore[arg-type]
        )

    return accept, connections


def _bounded_protocol(limits: ServerLimits) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol with a connection cap and a deadline for request headers."""

    class Bounded(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # TLS is done by now: whether the client proved itself with a certificate from the
            # client CA reaches the app as request.state.client_verified (this connection's own)
            verified = bool(transport.get_extra_info("peercert"))
            self.app_state = {**self.app_state, "client_verified": verified}
            if len(self.connections) > limits.max_connections:
                log.warning("connection refused: %d open", len(self.connections) - 1)
                self.connections.discard(self)
                transport.abort()
                return
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(
                limits.header_timeout_seconds, self._headers_late
            )

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
                return
            if self.conn.trailing_data[0]:
                self.transport.abort()  # half-sent headers: drop it
            else:
                self.transport.close()  # an idle keep-alive connection: close it politely

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return Bounded


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _tls_problem(cert_file: Path, key_file: Path, exc: ssl.SSLError) -> str:
    """What is wrong with a serving certificate and key that OpenSSL refused ("[SSL] PEM lib"
    says nothing): the usual mix-ups named, else OpenSSL's reason."""
    try:
        key, cert = key_file.read_bytes(), cert_file.read_bytes()
    except OSError:
        key = cert = b""
    if b"PRIVATE KEY" not in key and b"BEGIN CERTIFICATE" in key:
        return f"TLS key file {key_file} holds a certificate, not a private key"
    if b"PRIVATE KEY" not in key:
        return f"TLS key file {key_file} holds no PEM private key"
    if b"BEGIN CERTIFICATE" not in cert:
        return f"TLS certificate file {cert_file} holds no PEM certificate"
    reason = exc.reason or str(exc)
    return f"TLS files {cert_file} and {key_file} do not go together ({reason})"


class TlsFiles:
    """A server SSLContext over a certificate and key file, reloaded on content change.

    With `client_ca_file`, a client may present a certificate, verified against that CA (one
    that fails is refused in the handshake); the server then tells /mutate whether it did. The
    CA is read at start (a new one needs a restart)."""

    def __init__(self, cert_file: Path, key_file: Path, client_ca_file: Path | None = None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.digest = _digest(cert_file, key_file)
        try:
            self.context.load_cert_chain(cert_file, key_file)
        except ssl.SSLError as exc:
            raise PeerpodsError(_tls_problem(cert_file, key_file, exc)) from None
        if client_ca_file is not None:
            # optional in TLS: kubelet's /healthz probes present no certificate
            self.context.verify_mode = ssl.CERT_OPTIONAL
            try:
                self.context.load_verify_locations(cafile=str(client_ca_file))
            except (OSError, ssl.SSLError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise PeerpodsError(f"client CA file {client_ca_file}: {reason}") from None
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


class ServerConfig(ServerSettings):
    """The server's settings (declared in webhook._settings) and the limits derived from them."""

    @property
    def limits(self) -> ServerLimits:
        return ServerLimits(
            max_request_bytes=self.max_request_bytes,
            max_connections=self.max_connections,
            header_timeout_seconds=self.header_timeout_seconds,
            body_timeout_seconds=self.body_timeout_seconds,
            selector_threads=max(16, 4 * self.cel_workers),
            max_connections_per_source=self.max_connections_per_source,
            reserved_connections=min(self.reserved_connections, self.max_connections - 1),
            api_server_networks=self.api_server_networks,
            require_client_cert=self.client_ca_file is not None,
        )


def _freeze_gc() -> None:
    """Move what start-up made (modules, the catalog, compiled selectors) out of the cyclic
    collector's sight: a full collection otherwise walks all of it, a stall of tens of
    milliseconds that lands on whichever request is in flight (the p99 of /healthz itself)."""
    gc.collect()
    gc.freeze()


class WebhookServer:
    """uvicorn serving the app over TLS, plus the TLS watcher; `port` is known once listening."""

    def __init__(self, admission: Admission, config: ServerConfig) -> None:
        self.config = config
        self.tls = TlsFiles(config.cert_file, config.key_file, config.client_ca_file)
        self.admission = admission
        self.app = build_app(admission, limits=config.limits)
        self.cel_workers: CelWorkers | None = None
        self.connections: _Connections | None = None
        self.port = 0
        self.started = asyncio.Event()
        self._server: uvicorn.Server | None = None

    def _warm_space(self) -> DeviceSpace | None:
        """The catalog's device space, for the CEL workers to build before the first pod."""
        try:
            view = self.admission.view()
        except PeerpodsError as exc:
            log.warning("CEL workers not warmed: %s", exc)
            return None
        return view.space if view is not None else None

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
        limits = self.config.limits
        accept, self.connections = _gated_tls(_bounded_protocol(limits), self.tls.context, limits)
        uv_config = uvicorn.Config(
            self.app,
            http=accept,  # type: ignore[arg-type]
            log_level="warning",
            # uvicorn's records go through peerpods' own log handler (JSON or text, one format)
            log_config=None,
            access_log=False,
            # no proxy in front: X-Forwarded-* is never to be believed, and not parsed per request
            proxy_headers=False,
            timeout_graceful_shutdown=int(self.config.shutdown_seconds),
            lifespan="off",
        )
        if self.config.cel_workers > 0 and self.admission.cel_runner is None:
            self.cel_workers = CelWorkers(self.config.cel_workers)
            try:
                await asyncio.to_thread(self.cel_workers.start, self._warm_space())
            except (OSError, EOFError) as exc:
                await asyncio.to_thread(self.cel_workers.close)
                raise PeerpodsError(
                    f"cannot start the CEL worker processes (--cel-workers; they need a writable "
                    f"temporary directory): {exc}"
                ) from None
            self.admission.cel_runner = self.cel_workers
        uv_config.load()
        server = uvicorn.Server(uv_config)
        self._server = server
        sock = self.bind()
        watcher = asyncio.create_task(self.tls.watch(self.config.reload_seconds), name="tls-watch")
        serving = asyncio.create_task(server.serve(sockets=[sock]), name="uvicorn")
        try:
            # uvicorn exposes `started` as a flag only
            while not server.started and not serving.done():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            if self.config.freeze_gc:
                _freeze_gc()
            self.started.set()
            log.info("webhook serving /mutate on https://%s:%d", self.config.host, self.port)
            await serving
        finally:
            server.should_exit = True
            for task in (watcher, serving):
                if not task.done():
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            sock.close()
            if self.config.freeze_gc:
                gc.unfreeze()
            self.app.state.pools.shutdown()
            if self.cel_workers is not None:
                self.admission.cel_runner = None
                await asyncio.to_thread(self.cel_workers.close)
                self.cel_workers = None

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
