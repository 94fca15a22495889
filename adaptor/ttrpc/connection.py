"""The thin asyncio layer under server, client and proxy: sockets and the read loop.

Frames go out with one `write()` each, which asyncio transports never interleave, so writes are
serialized per connection without a lock; `drain()` gives backpressure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl as ssl_module
import stat

from .status import Code, TtrpcError

READ_CHUNK = 256 * 1024

StreamPair = tuple[asyncio.StreamReader, asyncio.StreamWriter]


# Pending connections a unix listener queues: bursts of shim connects (many pods starting at once)
# must not meet EAGAIN while the loop is busy; the kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 1024


def bind_unix(path: str, mode: int) -> socket.socket:
    """A listening unix socket at `path` with `mode`, never reachable with looser permissions.

    It is bound under a temporary name, chmod-ed, then renamed over `path`; a stale socket left
    at `path` by a dead process is replaced, any other kind of file is refused.
    """
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, mode=0o700, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise FileExistsError(17, "exists and is not a socket", path)
    # A short temporary name: never longer than a path that fits a unix socket address itself.
    tmp = os.path.join(parent, f".{os.getpid():x}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return sock


def unlink_socket(path: str, sock_inode: int | None) -> None:
    """Remove our socket file, unless something else has replaced it meanwhile."""
    with contextlib.suppress(FileNotFoundError):
        info = os.lstat(path)
        if stat.S_ISSOCK(info.st_mode) and (sock_inode is None or info.st_ino == sock_inode):
            os.unlink(path)


async def open_unix(path: str) -> StreamPair:
    """Connect to a unix socket; failures become UNAVAILABLE."""
    try:
        return await asyncio.open_unix_connection(path, limit=READ_CHUNK)
    except OSError as exc:
        raise TtrpcError(Code.UNAVAILABLE, f"connect {path}: {exc.strerror or exc}") from exc


async def open_tcp(host: str, port: int, ssl: ssl_module.SSLContext | None = None) -> StreamPair:
    """Connect over TCP (optionally TLS); failures become UNAVAILABLE."""
    try:
        return await asyncio.open_connection(
            host, port, ssl=ssl, limit=READ_CHUNK, server_hostname=host if ssl else None
        )
    except (OSError, ssl_module.SSLError) as exc:
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise TtrpcError(Code.UNAVAILABLE, f"connect {host}:{port}: {why}") from exc


async def close_writer(writer: asyncio.StreamWriter) -> None:
    """Close a stream, waiting briefly; errors from an already broken peer are irrelevant."""
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), 1.0)
