"""A total time limit on one HTTP exchange, whatever the server does within it.

Socket timeouts bound each read, not the exchange: a server that sends one byte a second holds
a client with a 2 s timeout for as long as it likes. A `Deadline` shuts down the sockets it
watches when its time is up, so the read blocked on them ends then (and the caller, seeing
`expired`, says "no answer within N s"). Shutting a socket down, never closing it, keeps the
descriptor its owner will close: no other file can take its number meanwhile.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType


class Deadline:
    """Stops what it watches `seconds` after entering; use once, as a context manager."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._stops: list[Callable[[], None]] = []
        self._expired = False
        self._timer = threading.Timer(max(seconds, 0.0), self._expire)
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        self.at = time.monotonic() + self.seconds
        self._timer.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._timer.cancel()

    @property
    def expired(self) -> bool:
        return self._expired or time.monotonic() >= self.at

    def remaining(self) -> float:
        """Seconds left, never below a millisecond (a socket timeout of 0 means non-blocking)."""
        return max(self.at - time.monotonic(), 0.001)

    def watch(self, stop: Callable[[], None]) -> None:
        """Call `stop` when the time is up (now, when it already is)."""
        with self._lock:
            if not self._expired:
                self._stops.append(stop)
                return
        stop()

    def watch_socket(self, sock: socket.socket) -> None:
        self.watch(lambda: shut(sock))

    def _expire(self) -> None:
        with self._lock:
            self._expired = True
            stops, self._stops = self._stops, []
        for stop in stops:
            stop()


def shut(sock: socket.socket | None) -> None:
    """Shut both directions of `sock` down (a blocked read returns at once); no error if it is
    already closed or never connected."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
