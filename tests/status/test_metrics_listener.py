"""The metrics-only listener (--metrics-address): what a PodMonitor scrapes on the node's
address. It serves the metrics text and nothing else, refuses a Host naming another site, caps
its connections, drops requests that do not arrive in time, and a port it cannot bind never
stops the daemon."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from adaptor.runtime import metrics
from adaptor.status.metrics_listener import MetricsListener
from providers.core.errors import InvalidRequest


async def _ask(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 5.0)
    finally:
        writer.close()


async def test_only_the_metrics_text_is_served() -> None:
    refreshed = 0

    async def refresh() -> None:
        nonlocal refreshed
        refreshed += 1

    metrics.START_FAILURES.labels(reason="capacity").inc(0)
    listener = MetricsListener("127.0.0.1:0", refresh=refresh, host_names=("node-a",))
    await listener.start()
    try:
        port = listener.port
        answer = await _ask(port, b"GET /metrics HTTP/1.1\r\nHost: 10.0.0.5:8007\r\n\r\n")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"text/plain; version=" in head
        assert b"peerpods_start_failures_total" in body and refreshed == 1
        by_name = await _ask(port, b"GET /metrics?x=1 HTTP/1.1\r\nHost: node-a\r\n\r\n")
        assert by_name.startswith(b"HTTP/1.1 200")
        listing = await _ask(port, b"GET /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert listing.startswith(b"HTTP/1.1 404") and b"sandbox" not in listing.lower()
        posted = await _ask(port, b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert posted.startswith(b"HTTP/1.1 405")
        # DNS rebinding: a page's own name in Host is refused, as by the status API
        rebound = await _ask(port, b"GET /metrics HTTP/1.1\r\nHost: evil.example:8007\r\n\r\n")
        assert rebound.startswith(b"HTTP/1.1 400") and b"peerpods_" not in rebound
        twice = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n"
        assert (await _ask(port, twice)).startswith(b"HTTP/1.1 400")
        assert refreshed == 2  # only the two answered scrapes
    finally:
        await listener.stop()


async def test_connections_are_capped_and_slow_requests_dropped() -> None:
    listener = MetricsListener("127.0.0.1:0", max_connections=4, request_timeout=0.5)
    await listener.start()
    idle = []
    try:
        for _ in range(4):
            idle.append(await asyncio.open_connection("127.0.0.1", listener.port))
            await asyncio.sleep(0.02)
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        assert await asyncio.wait_for(reader.read(), 2) == b""  # one more: closed at once
        writer.close()
        # a head dripped slower than the limit is dropped, and the idle ones with it
        for reader, _ in idle:
            assert await asyncio.wait_for(reader.read(), 3) == b""
        answer = await _ask(listener.port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200")
        oversized = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 10000 + b"\r\n\r\n"
        assert await _ask(listener.port, oversized) == b""
    finally:
        for _, writer in idle:
            writer.close()
        await listener.stop()
    assert not listener.listening


async def test_a_port_it_cannot_bind_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        listener = MetricsListener(f"127.0.0.1:{port}")
        with caplog.at_level(logging.WARNING):
            await listener.start()
        assert not listener.listening and listener.port == 0
        assert f"cannot listen on 127.0.0.1:{port}" in caplog.text
        await listener.stop()


def test_a_malformed_address_names_its_flag() -> None:
    with pytest.raises(InvalidRequest, match="--metrics-address: want HOST:PORT"):
        MetricsListener("no-port")
