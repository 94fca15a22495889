"""Shared fixtures: a Python ttrpc server with echo/slow/failing handlers on a temp socket."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from adaptor.ttrpc import CallContext, Code, Server, TtrpcError
from adaptor.ttrpc.codec import Event, Frame, FrameDecoder
from adaptor.ttrpc.gen import ttrpc_pb2


async def echo(ctx: CallContext, payload: bytes) -> bytes:
    """Answers with a ttrpc Request describing the call, like the Go echo server."""
    message = ttrpc_pb2.Request(
        service=ctx.service,
        method=ctx.method,
        payload=payload,
        timeout_nano=ctx.timeout_nano,
        metadata=[ttrpc_pb2.KeyValue(key=k, value=v) for k, v in ctx.metadata],
    )
    return bytes(message.SerializeToString())


async def slow(ctx: CallContext, payload: bytes) -> bytes:
    await asyncio.sleep(float(payload.decode() or "30"))
    return b"slept"


async def fail(ctx: CallContext, payload: bytes) -> bytes:
    raise TtrpcError(Code.NOT_FOUND, "no such thing")


async def crash(ctx: CallContext, payload: bytes) -> bytes:
    raise ValueError("handler bug")


async def empty(ctx: CallContext, payload: bytes) -> bytes:
    return b""


def make_server() -> Server:
    server = Server()
    server.register("test.Echo", {"Echo": echo, "Slow": slow, "Fail": fail, "Crash": crash})
    server.register("grpc.Health", {"Check": empty})
    return server


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # short path: unix socket paths are limited to ~107 bytes
    with tempfile.TemporaryDirectory(prefix="pp-") as d:
        yield Path(d)


@pytest.fixture
async def server_path(sock_dir: Path) -> AsyncIterator[str]:
    server = make_server()
    path = str(sock_dir / "s.sock")
    await server.start_unix(path)
    try:
        yield path
    finally:
        await server.close(grace_seconds=0)


async def exchange(path: str, data: bytes, want: int, wait_seconds: float = 5.0) -> list[Event]:
    """Send raw bytes on a fresh connection and collect `want` frames back."""
    reader, writer = await asyncio.open_unix_connection(path)
    decoder = FrameDecoder()
    events: list[Event] = []
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(wait_seconds):
            while len(events) < want:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                events.extend(decoder.feed(chunk))
    finally:
        writer.close()
        await writer.wait_closed()
    return events


def status_of(event: Event) -> tuple[int, str, bytes]:
    assert isinstance(event, Frame)
    response = ttrpc_pb2.Response.FromString(event.data)
    return response.status.code, response.status.message, response.payload
