"""The agent proxy keeps the ttrpc stream rules exactly as the server does: the same hostile
bytes get the same answers from both, and nothing the shim got wrong reaches the pod VM."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adaptor.proxy import AgentProxy, tcp_dialer
from adaptor.ttrpc import Code
from adaptor.ttrpc.codec import (
    MAX_DATA_LENGTH,
    Event,
    Flags,
    MessageType,
    encode_frame,
    encode_request,
)
from adaptor.ttrpc.gen import agent_pb2
from adaptor.ttrpc.server import CallContext
from tests.adaptor.fake_agent import AGENT, PAUSE, FakeAgent
from tests.ttrpc.conftest import exchange, make_server, status_of

CHECK = encode_request("grpc.Health", "Check", b"")
# a call that stays in flight on both sides (the pause container never exits here)
WAIT = encode_request(
    AGENT,
    "WaitProcess",
    agent_pb2.WaitProcessRequest(container_id=PAUSE, exec_id=PAUSE).SerializeToString(),
)
BIG = MAX_DATA_LENGTH + 5
HOSTILE = b"".join(
    [
        BIG.to_bytes(4, "big") + (1).to_bytes(4, "big") + b"\x01\x00" + b"\x00" * BIG,
        encode_frame(2, MessageType.REQUEST, CHECK),  # even id
        encode_frame(3, MessageType.REQUEST, b"\xff\xff\xff"),  # does not parse
        encode_frame(5, MessageType.RESPONSE, b"ignored"),
        encode_frame(7, MessageType.DATA, b"no such stream"),
        encode_frame(9, MessageType.REQUEST, CHECK),  # the one good call
        encode_frame(9, MessageType.REQUEST, CHECK),  # its id again
        encode_frame(9, MessageType.DATA, b"on a unary call"),
        encode_frame(11, MessageType.REQUEST, WAIT, Flags.REMOTE_OPEN),
        encode_frame(11, MessageType.DATA, b"x", Flags.REMOTE_CLOSED),  # a close with data
        encode_frame(13, 42, b"unknown type"),
    ]
)
WANT = 6  # 1, 2, 3, 9 twice, 11 (refused, and its call's answer is never sent)


@pytest.fixture
async def sock_dir() -> AsyncIterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pp-") as d:
        yield Path(d)


def answers(events: list[Event]) -> list[tuple[int, int, str]]:
    """(stream id, code, message) of each answer, in order; an unparsable request's message
    without its detail (the server parses with protobuf, the proxy only peeks)."""
    out = []
    for event in events:
        code, message, _payload = status_of(event)
        out.append((event.stream_id, code, message.split(": ")[0]))
    return sorted(out)


async def test_the_proxy_answers_hostile_frames_as_the_server_does(sock_dir: Path) -> None:
    server = make_server()

    async def never(_ctx: CallContext, _payload: bytes) -> bytes:
        await asyncio.Event().wait()
        return b""

    server.register(AGENT, {"WaitProcess": never})
    await server.start_unix(str(sock_dir / "server.sock"))
    agent = FakeAgent()
    await agent.start()
    proxy = AgentProxy(
        str(sock_dir / "agent.sock"),
        tcp_dialer("127.0.0.1", agent.port, None),
        sandbox_id="sb",
    )
    await proxy.start()
    try:
        await proxy.connect(5)
        direct = answers(await exchange(str(sock_dir / "server.sock"), HOSTILE, WANT))
        relayed = answers(await exchange(proxy.socket_path, HOSTILE, WANT))
    finally:
        await proxy.stop()
        await agent.stop()
        await server.close(grace_seconds=0)
    assert direct == relayed
    assert [(sid, code) for sid, code, _m in direct] == [
        (1, Code.RESOURCE_EXHAUSTED),
        (2, Code.INVALID_ARGUMENT),
        (3, Code.INVALID_ARGUMENT),
        (9, Code.OK),
        (9, Code.INVALID_ARGUMENT),
        (11, Code.INVALID_ARGUMENT),
    ]
    assert agent.connections == 1
