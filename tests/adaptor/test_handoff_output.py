"""At a hand-off, an output read of a stream that is printing is answered by the old process
before its pod VM connection is half-closed; an idle stream's read moves at once.

An agent whose TLS layer ends the whole session when the TCP FIN arrives (Python's does) drops
an answer it writes in the instant before its server cancels the read, and the bytes that read
took from the pipe are gone. A read answered before the FIN cannot be lost that way.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adaptor.proxy import AgentProxy, tcp_dialer
from adaptor.proxy._proxy import OUTPUT_BUSY_SECONDS, OUTPUT_SETTLE_SECONDS
from adaptor.ttrpc import Client
from tests.adaptor.fake_agent import (
    AGENT,
    WORKLOAD,
    FakeAgent,
    parse_read_stream_response,
    read_stream_request,
)


@pytest.fixture
async def agent() -> AsyncIterator[FakeAgent]:
    agent = FakeAgent()
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()


@pytest.fixture
async def proxy(agent: FakeAgent) -> AsyncIterator[AgentProxy]:
    with tempfile.TemporaryDirectory(prefix="pp-") as directory:
        path = Path(directory) / "agent.ttrpc"
        dial = tcp_dialer("127.0.0.1", agent.port, None)
        proxy = AgentProxy(str(path), dial, sandbox_id="sb")
        await proxy.start()
        await proxy.connect(5)
        try:
            yield proxy
        finally:
            await proxy.stop()


def read_output(client: Client) -> asyncio.Task[bytes]:
    return asyncio.create_task(client.call(AGENT, "ReadStdout", read_stream_request(WORKLOAD)))


async def test_a_printing_streams_read_is_answered_before_the_move(
    agent: FakeAgent, proxy: AgentProxy
) -> None:
    client = await Client.connect_unix(proxy.socket_path)
    try:
        agent.containers[WORKLOAD].write(b"first")
        assert parse_read_stream_response(await read_output(client)) == b"first"
        pending = read_output(client)  # the stream printed just now: its next read is awaited
        await asyncio.sleep(0.05)
        freezing = asyncio.create_task(proxy.freeze(5))
        await asyncio.sleep(0.1)
        assert not freezing.done()
        agent.containers[WORKLOAD].write(b"during the hand-off")
        moved = await asyncio.wait_for(freezing, 5)
        assert parse_read_stream_response(await pending) == b"during the hand-off"
        assert [call.method for shim in moved.shims for call in shim.calls] == []
        moved.close()
    finally:
        await client.close()


async def test_an_idle_streams_read_moves_at_once(agent: FakeAgent, proxy: AgentProxy) -> None:
    client = await Client.connect_unix(proxy.socket_path)
    try:
        agent.containers[WORKLOAD].write(b"long ago")
        assert parse_read_stream_response(await read_output(client)) == b"long ago"
        pending = read_output(client)
        await asyncio.sleep(OUTPUT_BUSY_SECONDS + 0.1)  # the stream went quiet
        started = time.monotonic()
        moved = await asyncio.wait_for(proxy.freeze(5), 5)
        assert time.monotonic() - started < OUTPUT_SETTLE_SECONDS
        assert [call.method for shim in moved.shims for call in shim.calls] == ["ReadStdout"]
        assert not pending.done()
        pending.cancel()
        moved.close()
    finally:
        await client.close()
