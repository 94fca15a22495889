"""The Kubernetes client's HTTP transport: urllib3's connection pool, with a total deadline per
call and a bound on what an answer may hold.

urllib3's timeouts bound each socket read; an API server (or what stands in its place) that
drips its answer would hold a call indefinitely. Each pooled connection here keeps a duplicate
of its socket's descriptor, and the calling thread's `Deadline` shuts that socket down when the
call's time is up, in the TLS handshake, the headers or the body alike. An answer is read in
pieces up to `max_bytes` and never decompressed (nothing asks for compression): a 300 MB or a
gzip-bombed answer is an error, not 300 MB in memory.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from providers.clouds.deadline import Deadline, shut

_CHUNK = 1 << 20
_current = threading.local()


class AnswerTooLarge(Exception):
    """The answer holds more than the client reads."""


class AnswerEncoded(Exception):
    """The answer is compressed though nothing asked for that."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[Deadline]:
    """The calling thread's calls through `pool()` end within `seconds`, from now."""
    with Deadline(seconds) as limit:
        _current.deadline = limit
        try:
            yield limit
        finally:
            _current.deadline = None


def _active() -> Deadline | None:
    found: Deadline | None = getattr(_current, "deadline", None)
    return found


class _Watched:
    """What both connection kinds add: a descriptor of their socket the deadline can shut down
    (the TLS layer takes over the socket object; the connection underneath is the same)."""

    _watch: socket.socket | None = None
    _owner: Deadline | None = None  # the call using the connection now

    def _keep(self, sock: socket.socket) -> socket.socket:
        self._drop()
        self._watch = sock.dup()
        limit = _active()
        if limit is not None and limit.expired:
            shut(self._watch)
        return sock

    def _arm(self) -> None:
        limit = self._owner = _active()
        if limit is None:
            return

        def stop() -> None:
            if self._owner is limit:  # not a later call's, should this one's time run out late
                shut(self._watch)

        limit.watch(stop)

    def _drop(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None


class _HTTP(_Watched, HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return self._keep(super()._new_conn())

    def request(self, *args: Any, **kwargs: Any) -> None:
        self._arm()
        super().request(*args, **kwargs)

    def close(self) -> None:
        super().close()
        self._drop()


class _HTTPS(_HTTP, HTTPSConnection):
    """The same watch over TLS: HTTPSConnection's own steps run under _HTTP's (its MRO puts
    them between _HTTP and HTTPConnection)."""


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTP


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPS


def pool(**options: Any) -> urllib3.PoolManager:
    """A PoolManager whose connections the calling thread's `deadline()` bounds."""
    manager = urllib3.PoolManager(**options)
    manager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
    return manager


def read_bounded(response: urllib3.BaseHTTPResponse, max_bytes: int) -> bytes:
    """The whole body, or AnswerTooLarge past `max_bytes` (AnswerEncoded when compressed)."""
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise AnswerEncoded(encoding)
    length = response.headers.get("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) > max_bytes:
        raise AnswerTooLarge(f"; {int(length)} announced")
    parts: list[bytes] = []
    size = 0
    while True:
        part = response.read(min(_CHUNK, max_bytes + 1 - size), decode_content=False)
        if not part:
            return b"".join(parts)
        size += len(part)
        if size > max_bytes:
            raise AnswerTooLarge("")
        parts.append(part)
