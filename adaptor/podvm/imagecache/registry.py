"""One registry's HTTP API (OCI distribution), as a puller needs it: manifests and blobs.

Authentication follows the registry's challenge: a 401 with `WWW-Authenticate: Bearer realm=,
service=, scope=` sends us to the token service (anonymously, or with Basic credentials from
the auth file), and the token is kept per scope; `Basic` sends the credentials themselves.
Credentials are sent to a token service only over HTTPS, or to the registry's own host (on any
port) when the registry itself is spoken to over HTTP.

Every request has a deadline for the whole of it (connect, headers and body), checked between
chunks as the body streams; bodies are capped. urllib3 follows redirects (a blob is often served
by a CDN) and drops the Authorization header when one leaves the host.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

import urllib3
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from adaptor.podvm.imagecache.auth import Challenge, Credentials, parse_challenge
from adaptor.podvm.imagecache.errors import (
    AuthenticationFailed,
    ContentTooLarge,
    ImageNotFound,
    PullError,
    PullTimeout,
    RegistryResponseError,
    RegistryUnreachable,
)
from adaptor.podvm.imagecache.reference import api_host

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Deadlines (whole requests) and caps on what a registry may send."""

    request_seconds: float = 60.0  # a manifest or a token, start to end
    blob_seconds: float = 3600.0  # one blob, start to end (multi-gigabyte layers)
    connect_seconds: float = 15.0
    idle_seconds: float = 60.0  # the longest wait for the next bytes of a body
    max_manifest_bytes: int = 4 << 20  # as the distribution registry's own limit
    max_token_bytes: int = 1 << 20


@dataclass(frozen=True)
class Manifest:
    """A manifest's bytes as served, with the headers that describe them."""

    body: bytes
    content_type: str
    digest_header: str


class RegistryClient:
    """Requests to one registry, sharing a connection pool and tokens across its repositories."""

    def __init__(
        self,
        registry: str,
        pool: urllib3.PoolManager,
        *,
        credentials: Credentials | None = None,
        plain_http: bool = False,
        limits: Limits = Limits(),
    ) -> None:
        self.registry = registry
        self._pool = pool
        self._credentials = credentials
        self._plain_http = plain_http
        self._limits = limits
        self._base = f"{'http' if plain_http else 'https'}://{api_host(registry)}"
        self._authorization: dict[str, str] = {}  # scope -> Authorization header value

    def manifest(self, repository: str, reference: str, accept: str) -> Manifest:
        """A manifest or index by tag or digest, read whole (capped)."""
        deadline = time.monotonic() + self._limits.request_seconds
        path = f"/v2/{repository}/manifests/{reference}"
        response = self._get(path, repository, {"Accept": accept}, deadline)
        with _finished(response):
            self._check_status(response, f"manifest {repository}:{reference}")
            body = self._read(response, self._limits.max_manifest_bytes, deadline, "manifest")
            return Manifest(
                body,
                response.headers.get("Content-Type", ""),
                response.headers.get("Docker-Content-Digest", ""),
            )

    def blob(self, repository: str, digest: str, sink: Callable[[bytes], None]) -> None:
        """Stream a blob into `sink`, chunk by chunk, within the blob deadline."""
        deadline = time.monotonic() + self._limits.blob_seconds
        response = self._get(f"/v2/{repository}/blobs/{digest}", repository, {}, deadline)
        with _finished(response):
            self._check_status(response, f"blob {digest} of {repository}")
            for chunk in self._chunks(response, deadline):
                sink(chunk)

    # transport

    def _get(
        self, path: str, repository: str, headers: Mapping[str, str], deadline: float
    ) -> urllib3.BaseHTTPResponse:
        scope = f"repository:{repository}:pull"
        response = self._send(self._base + path, {**headers, **self._auth(scope)}, deadline)
        if response.status != 401:
            return response
        challenge = parse_challenge(response.headers.get("WWW-Authenticate", ""))
        response.close()
        self._authenticate(challenge, scope, deadline)
        response = self._send(self._base + path, {**headers, **self._auth(scope)}, deadline)
        if response.status == 401:
            response.close()
            raise AuthenticationFailed(f"{self.registry}: the registry refused the token")
        return response

    def _auth(self, scope: str) -> dict[str, str]:
        value = self._authorization.get(scope) or self._authorization.get("*")
        return {"Authorization": value} if value else {}

    def _authenticate(self, challenge: Challenge | None, scope: str, deadline: float) -> None:
        if challenge is None:
            raise AuthenticationFailed(f"{self.registry}: 401 without a readable challenge")
        if challenge.scheme == "basic":
            if self._credentials is None:
                raise AuthenticationFailed(f"{self.registry}: credentials needed (no auth file)")
            self._authorization["*"] = self._credentials.basic()
            return
        if challenge.scheme != "bearer" or not challenge.params.get("realm"):
            raise AuthenticationFailed(
                f"{self.registry}: unsupported authentication {challenge.scheme!r}"
            )
        self._authorization[scope] = "Bearer " + self._token(challenge, scope, deadline)

    def _token(self, challenge: Challenge, scope: str, deadline: float) -> str:
        realm = challenge.params["realm"]
        parts = urlsplit(realm)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise AuthenticationFailed(f"{self.registry}: invalid token realm {realm[:200]!r}")
        query = {"scope": challenge.params.get("scope") or scope}
        if challenge.params.get("service"):
            query["service"] = challenge.params["service"]
        headers = {}
        same_host = parts.hostname == urlsplit(self._base).hostname
        if self._credentials is not None and (parts.scheme == "https" or same_host):
            headers["Authorization"] = self._credentials.basic()
        separator = "&" if parts.query else "?"
        response = self._send(realm + separator + urlencode(query), headers, deadline)
        with _finished(response):
            if response.status in (401, 403):
                raise AuthenticationFailed(
                    f"{self.registry}: the token service refused "
                    f"{'the credentials' if headers else 'an anonymous pull'} ({response.status})"
                )
            if response.status != 200:
                raise RegistryResponseError(f"{self.registry}: token service: {response.status}")
            body = self._read(response, self._limits.max_token_bytes, deadline, "token")
        try:
            document = json.loads(body)
            token = document.get("token") or document.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token or not token.isprintable():
            raise RegistryResponseError(f"{self.registry}: token service sent no token")
        return token

    def _send(
        self, url: str, headers: Mapping[str, str], deadline: float
    ) -> urllib3.BaseHTTPResponse:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PullTimeout(f"{self.registry}: deadline passed")
        timeout = urllib3.Timeout(
            connect=min(self._limits.connect_seconds, remaining),
            read=min(self._limits.idle_seconds, remaining),
        )
        try:
            return self._pool.request(
                "GET",
                url,
                headers=dict(headers),
                timeout=timeout,
                preload_content=False,
                retries=urllib3.Retry(total=8, connect=2, read=0, status=0, redirect=5),
            )
        except Urllib3Timeout:
            raise PullTimeout(f"{self.registry}: no answer within the deadline") from None
        except Urllib3Error as exc:
            raise RegistryUnreachable(f"{self.registry}: {_reason(exc)}") from None

    def _check_status(self, response: urllib3.BaseHTTPResponse, what: str) -> None:
        if response.status == 200:
            return
        if response.status == 404:
            raise ImageNotFound(f"{self.registry}: {what}: not found")
        if response.status in (401, 403):
            raise AuthenticationFailed(f"{self.registry}: {what}: denied ({response.status})")
        raise RegistryResponseError(f"{self.registry}: {what}: HTTP {response.status}")

    def _read(
        self, response: urllib3.BaseHTTPResponse, cap: int, deadline: float, what: str
    ) -> bytes:
        body = bytearray()
        for chunk in self._chunks(response, deadline):
            body += chunk
            if len(body) > cap:
                raise ContentTooLarge(f"{self.registry}: {what} larger than {cap} bytes")
        return bytes(body)

    def _chunks(self, response: urllib3.BaseHTTPResponse, deadline: float) -> _Chunks:
        return _Chunks(self.registry, response, deadline)


class _Chunks:
    """A response body in chunks, each read checked against the request's deadline."""

    def __init__(self, registry: str, response: urllib3.BaseHTTPResponse, deadline: float) -> None:
        self._registry, self._response, self._deadline = registry, response, deadline

    def __iter__(self) -> _Chunks:
        return self

    def __next__(self) -> bytes:
        if time.monotonic() > self._deadline:
            raise PullTimeout(f"{self._registry}: deadline passed while reading")
        try:
            chunk = self._response.read(_CHUNK)
        except Urllib3Timeout:
            raise PullTimeout(f"{self._registry}: the body stalled") from None
        except Urllib3Error as exc:
            raise RegistryUnreachable(f"{self._registry}: {_reason(exc)}") from None
        if not chunk:
            raise StopIteration
        return chunk


@contextlib.contextmanager
def _finished(response: urllib3.BaseHTTPResponse) -> Iterator[None]:
    """Give the connection back to the pool when the body was read to its end; close it
    otherwise (an error, a body left unread), so no later request reads this one's bytes."""
    try:
        yield
    except BaseException:
        response.close()
        raise
    else:
        if response.read(1):
            response.close()
        else:
            response.release_conn()


def _reason(exc: Urllib3Error) -> str:
    """A one-line cause from urllib3's error (its reason, not its retry bookkeeping)."""
    reason = getattr(exc, "reason", None) or exc
    text = str(reason)
    if "]" in text and "Errno" in text:  # NewConnectionError(...: [Errno 111] Connection refused)
        text = text[text.rindex("]") + 1 :].strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


__all__ = ["Limits", "Manifest", "PullError", "RegistryClient"]
