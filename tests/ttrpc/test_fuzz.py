"""Hostile input: the server never crashes and answers what the protocol says."""

from __future__ import annotations

import asyncio
from pathlib import Path

from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptor.ttrpc import Client, Code
from adaptor.ttrpc.codec import MAX_DATA_LENGTH, Frame, FrameDecoder, encode_frame
from adaptor.ttrpc.gen import ttrpc_pb2

from .conftest import make_server

FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def expected_code(stream_id: int, msg_type: int, data: bytes, last: list[int]) -> int | None:
    """What the protocol says about one well-framed frame (None: no answer)."""
    if msg_type != 1:
        return None
    try:
        request = ttrpc_pb2.Request.FromString(data)
    except DecodeError:
        return Code.INVALID_ARGUMENT
    if stream_id % 2 != 1 or stream_id <= last[0]:
        return Code.INVALID_ARGUMENT
    last[0] = stream_id
    if request.service != "grpc.Health":
        return Code.UNIMPLEMENTED
    if request.method != "Check":
        return Code.UNIMPLEMENTED
    if request.timeout_nano < 0:
        return Code.DEADLINE_EXCEEDED
    return Code.OK


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def _send_and_collect(path: str, payload: bytes, want: int) -> list[Frame]:
    reader, writer = await asyncio.open_unix_connection(path)
    decoder = FrameDecoder()
    got: list[Frame] = []
    try:
        writer.write(payload)
        await writer.drain()
        if want == 0:
            await asyncio.sleep(0.01)
        async with asyncio.timeout(5):
            while len(got) < want:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                got += [e for e in decoder.feed(chunk) if isinstance(e, Frame)]
    finally:
        writer.close()
        await writer.wait_closed()
    return got


async def _with_server(tmp: Path, body: object) -> None:
    server = make_server()
    path = str(tmp / "f.sock")
    await server.start_unix(path)
    try:
        await body(path)  # type: ignore[operator]
        # whatever happened, the server still answers a well-formed call
        async with await Client.connect_unix(path) as client:
            assert await client.call("grpc.Health", "Check", b"") == b""
    finally:
        await server.close(grace_seconds=0)


garbage_request = st.one_of(
    st.binary(max_size=80),
    st.builds(
        lambda s, m, t, p: ttrpc_pb2.Request(
            service=s, method=m, timeout_nano=t, payload=p
        ).SerializeToString(),
        st.sampled_from(["grpc.Health", "x", ""]),
        st.sampled_from(["Check", "Nope", ""]),
        st.integers(-5, 10**12),
        st.binary(max_size=20),
    ),
)
frame_specs = st.lists(
    st.tuples(st.integers(0, 40), st.sampled_from([1, 1, 1, 2, 3, 0, 255]), garbage_request),
    min_size=1,
    max_size=8,
)


@FUZZ
@given(frame_specs)
def test_random_frames_get_protocol_answers(
    tmp_path: Path, specs: list[tuple[int, int, bytes]]
) -> None:
    last = [0]
    expected: dict[int, list[int]] = {}
    for sid, mtype, data in specs:
        code = expected_code(sid, mtype, data, last)
        if code is not None:
            expected.setdefault(sid, []).append(code)
    stream = b"".join(encode_frame(sid, t, d) for sid, t, d in specs)
    want = sum(len(v) for v in expected.values())

    async def body(path: str) -> None:
        got = await _send_and_collect(path, stream, want)
        answers: dict[int, list[int]] = {}
        for frame in got:
            answers.setdefault(frame.stream_id, []).append(
                ttrpc_pb2.Response.FromString(frame.data).status.code
            )
        assert {k: sorted(v) for k, v in answers.items()} == {
            k: sorted(v) for k, v in expected.items()
        }

    run(_with_server(tmp_path, body))


@FUZZ
@given(st.binary(min_size=1, max_size=200))
def test_truncated_and_random_bytes_never_crash(tmp_path: Path, data: bytes) -> None:
    async def body(path: str) -> None:
        await _send_and_collect(path, data, 0)

    run(_with_server(tmp_path, body))


@FUZZ
@given(st.integers(MAX_DATA_LENGTH + 1, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_huge_lengths_are_refused_not_buffered(tmp_path: Path, length: int, sid: int) -> None:
    header = length.to_bytes(4, "big") + sid.to_bytes(4, "big") + b"\x01\x00"

    async def body(path: str) -> None:
        # only part of the claimed data arrives: no answer yet, nothing buffered, no crash
        await _send_and_collect(path, header + b"\x00" * 1000, 0)

    run(_with_server(tmp_path, body))
