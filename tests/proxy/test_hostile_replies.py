"""A pod VM answering with bytes that are not a Response (two or three bytes of a truncated
status), with a frame over the size limit, or with frames for streams nobody waits on: the call
concerned fails at once with a status (or the stray frame is dropped), the connection's other
streams go on."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adaptor.proxy import AgentProxy, tcp_dialer
from adaptor.ttrpc import Client, Code, TtrpcError
from adaptor.ttrpc.codec import (
    MAX_DATA_LENGTH,
    Frame,
    FrameDecoder,
    MessageType,
    encode_frame,
    encode_header,
    encode_response,
)
from adaptor.ttrpc.gen import ttrpc_pb2

AGENT = "grpc.AgentService"
# method -> the raw Response bytes the pod VM sends back
HOSTILE = {"Short2": b"\x0a\x05", "Short3": b"\x0a\x02\x08", "Truncated": b"\x12\x09ab"}


class PodVM:
    """A pod VM's forwarder that echoes payloads, answers `Slow` after 0.3 s, and the HOSTILE
    methods with their bytes."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        try:
            while data := await reader.read(65536):
                for event in decoder.feed(data):
                    assert isinstance(event, Frame)  # the proxy never sends one over the limit
                    request = ttrpc_pb2.Request.FromString(event.data)
                    task = asyncio.create_task(self.answer(writer, event.stream_id, request))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
        finally:
            writer.close()

    async def answer(
        self, writer: asyncio.StreamWriter, stream_id: int, request: ttrpc_pb2.Request
    ) -> None:
        if request.method == "Slow":
            await asyncio.sleep(0.3)
        if request.method == "Huge":
            length = MAX_DATA_LENGTH + 1
            writer.write(encode_header(length, stream_id, MessageType.RESPONSE) + bytes(length))
            return
        if request.method == "Stray":  # an answer to a call never made, Data, then the answer
            writer.write(encode_frame(stream_id + 1000, MessageType.RESPONSE, encode_response()))
            writer.write(encode_frame(stream_id, MessageType.DATA, b"not the answer"))
        data = HOSTILE.get(request.method) or encode_response(request.payload)
        writer.write(encode_frame(stream_id, MessageType.RESPONSE, data))

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
async def proxy() -> AsyncIterator[AgentProxy]:
    pod_vm = PodVM()
    server = await asyncio.start_server(pod_vm.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    calls: list[tuple[str, str, int]] = []
    with tempfile.TemporaryDirectory(prefix="pp-") as directory:
        p = AgentProxy(
            str(Path(directory) / "agent.ttrpc"),
            tcp_dialer("127.0.0.1", port, None),
            sandbox_id="sb",
            on_call=lambda s, m, c: calls.append((s, m, c)),
        )
        p.calls = calls  # type: ignore[attr-defined]
        await p.start()
        try:
            await p.connect(5)
            yield p
        finally:
            await p.stop()
            await pod_vm.close()
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()


async def test_a_malformed_answer_fails_its_call_only(proxy: AgentProxy) -> None:
    async with await Client.connect_unix(proxy.socket_path) as client:
        slow = asyncio.create_task(client.call(AGENT, "Slow", b"slow"))
        await asyncio.sleep(0.05)
        for method in HOSTILE:
            with pytest.raises(TtrpcError) as info:
                await asyncio.wait_for(client.call(AGENT, method, b""), 2)
            assert info.value.code is Code.INTERNAL
            assert "malformed response from the pod VM" in info.value.message
        assert await asyncio.wait_for(slow, 2) == b"slow"
        assert await asyncio.wait_for(client.call(AGENT, "Echo", b"after"), 2) == b"after"
    recorded = proxy.calls  # type: ignore[attr-defined]
    assert (AGENT, "Short2", Code.INTERNAL) in recorded
    assert (AGENT, "Slow", Code.OK) in recorded


async def test_an_oversized_answer_fails_its_call_and_stray_frames_are_dropped(
    proxy: AgentProxy,
) -> None:
    async with await Client.connect_unix(proxy.socket_path) as client:
        slow = asyncio.create_task(client.call(AGENT, "Slow", b"slow"))
        await asyncio.sleep(0.05)
        with pytest.raises(TtrpcError) as info:
            await asyncio.wait_for(client.call(AGENT, "Huge", b""), 5)
        assert (info.value.code, info.value.message) == (
            Code.RESOURCE_EXHAUSTED,
            "response exceeds maximum message size",
        )
        assert await asyncio.wait_for(client.call(AGENT, "Stray", b"mine"), 2) == b"mine"
        assert await asyncio.wait_for(slow, 2) == b"slow"
    recorded = proxy.calls  # type: ignore[attr-defined]
    assert (AGENT, "Huge", Code.RESOURCE_EXHAUSTED) in recorded
    assert (AGENT, "Stray", Code.OK) in recorded
