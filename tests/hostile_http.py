"""An HTTP server on loopback that misbehaves on purpose, for clients that must not trust the
server they call: it drips its answer a byte at a time for as long as the client listens,
sends more than any client should read, answers garbage or redirects elsewhere. Each
connection runs `answer(connection, request)` in its own thread; what each sent is counted and
every request's head is kept (header names in lower case)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Head:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class Conn:
    sock: socket.socket
    sent: int = 0
    closed_by_peer: bool = False

    def send(self, data: bytes) -> bool:
        """False once the client has gone."""
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed_by_peer = True
            return False
        self.sent += len(data)
        return True


Answer = Callable[[Conn, Head], None]


@dataclass
class HostileServer:
    answer: Answer
    read_head: bool = True  # False: answer at once, whatever comes (a TLS client's hello)
    heads: list[Head] = field(default_factory=list)
    conns: list[Conn] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(sock,), daemon=True).start()

    def _one(self, sock: socket.socket) -> None:
        conn = Conn(sock)
        self.conns.append(conn)
        with sock:
            sock.settimeout(30)
            head = _read_head(sock) if self.read_head else Head("", "", {})
            if head is None:
                return
            self.heads.append(head)
            self.answer(conn, head)

    def sent(self) -> int:
        return sum(c.sent for c in self.conns)

    def close(self) -> None:
        self.stopping.set()
        self.listener.close()


def _read_head(sock: socket.socket) -> Head | None:
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            part = sock.recv(65536)
            if not part:
                return None
            data += part
    except OSError:
        return None
    lines = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Head(method, path, headers)


@contextmanager
def hostile(answer: Answer, read_head: bool = True) -> Iterator[HostileServer]:
    server = HostileServer(answer, read_head)
    server.thread.start()
    try:
        yield server
    finally:
        server.close()


def drip(prefix: bytes, byte: bytes = b"x", every: float = 0.05) -> Answer:
    """Send `prefix`, then `byte` every `every` seconds until the client goes (or 10 minutes)."""

    def answer(conn: Conn, head: Head) -> None:
        if not conn.send(prefix):
            return
        end = time.monotonic() + 600
        while time.monotonic() < end and conn.send(byte):
            time.sleep(every)

    return answer


def flood(total: int, announce: bool = True) -> Answer:
    """A 200 answer of `total` bytes of JSON-ish filler, its length announced or not."""

    def answer(conn: Conn, head: Head) -> None:
        length = f"Content-Length: {total}\r\n" if announce else "Connection: close\r\n"
        if not conn.send(f"HTTP/1.1 200 OK\r\n{length}\r\n".encode()):
            return
        chunk = b" " * (1 << 20)
        left = total
        while left > 0 and conn.send(chunk[: min(left, len(chunk))]):
            left -= len(chunk)

    return answer


def reply(status: str, body: bytes, headers: dict[str, str] | None = None) -> Answer:
    """One fixed answer, whatever was asked."""

    def answer(conn: Conn, head: Head) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        conn.send(
            f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body
        )

    return answer


def finished(call: Callable[[], object], within: float = 60.0) -> BaseException | None:
    """Run `call` in a thread; the exception it raised (None if none). Fails the test when it
    is still running after `within` seconds: a client without a total deadline never ends
    against `drip`."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(within)
    assert outcome, f"still waiting on the server after {within:g}s"
    return outcome[0]
