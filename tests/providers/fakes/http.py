"""A fake HTTP cloud for SDKs that speak through `requests` (Azure's RequestsTransport, GCP REST).

Mounted on the SDK's own `requests.Session`, it answers each request from a route table (method
plus a regular expression over the URL path) and records every request it saw, body included, so a
test can check what the SDK sent. Unrouted requests get a 404 in the cloud's error shape, never a
socket: nothing here touches the network.
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import requests
from requests.adapters import BaseAdapter, HTTPAdapter
from urllib3.response import HTTPResponse

__all__ = [
    "FakeCloud",
    "FakeResponse",
    "Handler",
    "PageToken",
    "RecordedRequest",
    "json_response",
]


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the SDK sent it."""

    method: str
    url: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes
    match: re.Match[str] | None = None

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class FakeResponse:
    """What a handler answers: status, JSON-able body (or raw bytes) and headers."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if self.body is None:
            return b""
        return json.dumps(self.body).encode()


def json_response(body: Any, status: int = 200, **headers: str) -> FakeResponse:
    return FakeResponse(status, body, {"Content-Type": "application/json", **headers})


Handler = Callable[[RecordedRequest], FakeResponse]


def _not_found(request: RecordedRequest) -> FakeResponse:
    message = f"fake cloud: no route for {request.method} {request.path}"
    return json_response({"error": {"code": 404, "message": message}}, status=404)


class FakeCloud(BaseAdapter):
    """A `requests` transport adapter that routes by method and URL path pattern."""

    def __init__(self) -> None:
        super().__init__()
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []
        self._lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self.fallback: Handler = _not_found

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        """Answer `method` requests whose path fully matches `pattern` (later routes win)."""
        self._routes.insert(0, (method.upper(), re.compile(pattern), handler))

    def reply(self, method: str, pattern: str, body: Any, status: int = 200) -> None:
        """Always answer with the same JSON body."""
        self.route(method, pattern, lambda _request: json_response(body, status))

    def pages(self, method: str, pattern: str, pages: Sequence[Any], token: PageToken) -> None:
        """Serve `pages` in order, each but the last pointing at the next through `token`."""

        def handler(request: RecordedRequest) -> FakeResponse:
            index = int(request.query.get(token.param, "0") or "0")
            if not 0 <= index < len(pages):
                return json_response({"error": {"code": 400, "message": "bad page token"}}, 400)
            body = dict(pages[index])
            if index + 1 < len(pages):
                body[token.field] = token.next_value(request, index + 1)
            return json_response(body)

        self.route(method, pattern, handler)

    def seen(self, method: str, pattern: str) -> list[RecordedRequest]:
        """Recorded requests with this method whose path fully matches `pattern`."""
        compiled = re.compile(pattern)
        with self._lock:
            return [r for r in self.requests if r.method == method and compiled.fullmatch(r.path)]

    def mount_on(self, session: requests.Session) -> None:
        session.mount("https://", self)
        session.mount("http://", self)

    # requests.adapters.BaseAdapter

    def send(  # type: ignore[override]
        self, request: requests.PreparedRequest, **_kwargs: Any
    ) -> requests.Response:
        url = request.url or ""
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        body = _body_bytes(request.body)
        method = (request.method or "GET").upper()
        handler, match = self.fallback, None
        for route_method, pattern, route_handler in self._routes:
            found = pattern.fullmatch(parts.path)
            if route_method == method and found:
                handler, match = route_handler, found
                break
        recorded = RecordedRequest(
            method, url, parts.path, query, _text_headers(request.headers), body, match
        )
        with self._lock:
            self.requests.append(recorded)
        answer = handler(recorded)
        payload = answer.encode()
        headers = {"Content-Length": str(len(payload)), **answer.headers}
        raw = HTTPResponse(
            body=io.BytesIO(payload),
            headers=headers,
            status=answer.status,
            preload_content=False,
            decode_content=False,
            request_method=method,
            request_url=url,
        )
        return HTTPAdapter().build_response(request, raw)

    def close(self) -> None:
        pass


def _body_bytes(body: Any) -> bytes:
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, bytes):
        return body
    if hasattr(body, "read"):
        data = body.read()
        return data.encode() if isinstance(data, str) else bytes(data)
    return b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in body)


def _text_headers(headers: Mapping[str, str | bytes]) -> dict[str, str]:
    return {k: v.decode("latin-1") if isinstance(v, bytes) else v for k, v in headers.items()}


@dataclass(frozen=True)
class PageToken:
    """How a cloud chains pages: the query parameter it reads and the body field it writes.

    `absolute` makes the next value a full URL (Azure's nextLink) rather than a bare token (GCP's
    nextPageToken).
    """

    param: str
    field: str
    absolute: bool = False

    def next_value(self, request: RecordedRequest, index: int) -> str:
        if not self.absolute:
            return str(index)
        query = dict(request.query)
        query[self.param] = str(index)
        return request.url.split("?", 1)[0] + "?" + urlencode(query)
