"""The sans-IO codec: byte-exact frames, incremental decoding, oversize handling, peeking."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptor.ttrpc.codec import (
    HEADER_LENGTH,
    MAX_DATA_LENGTH,
    Frame,
    FrameDecoder,
    MalformedMessage,
    MessageType,
    Oversized,
    encode_frame,
    encode_request,
    encode_response,
    peek_call,
)
from adaptor.ttrpc.gen import ttrpc_pb2
from adaptor.ttrpc.status import Code

# ttrpc's framing (docs/architecture.md, adaptor.ttrpc): Health.Check on stream 1 with a 30 s
# timeout, and the OK reply.
CHECK_REQUEST = (
    bytes.fromhex("0000001a0000000101000a0b")
    + b"grpc.Health"
    + bytes.fromhex("1205")
    + b"Check"
    + bytes.fromhex("2080d88ee16f")
)
OK_RESPONSE = bytes.fromhex("000000020000000102000a00")

text = st.text(max_size=40)
metadata = st.lists(st.tuples(text, text), max_size=4)


def test_request_frame_is_byte_exact() -> None:
    data = encode_request("grpc.Health", "Check", b"", 30_000_000_000)
    assert encode_frame(1, MessageType.REQUEST, data) == CHECK_REQUEST


def test_ok_response_frame_is_byte_exact() -> None:
    assert encode_frame(1, MessageType.RESPONSE, encode_response()) == OK_RESPONSE


@given(text, text, st.binary(max_size=200), st.integers(-(2**63), 2**63 - 1), metadata)
def test_encode_request_matches_protobuf(
    service: str, method: str, payload: bytes, timeout: int, md: list[tuple[str, str]]
) -> None:
    ours = encode_request(service, method, payload, timeout, md)
    reference = ttrpc_pb2.Request(
        service=service,
        method=method,
        payload=payload,
        timeout_nano=timeout,
        metadata=[ttrpc_pb2.KeyValue(key=k, value=v) for k, v in md],
    )
    parsed = ttrpc_pb2.Request.FromString(ours)
    assert parsed == reference
    assert peek_call(ours) == (service, method)


@given(st.binary(max_size=100), st.sampled_from(list(Code)), text)
def test_encode_response_round_trips(payload: bytes, code: Code, message: str) -> None:
    if code != Code.OK:
        payload = b""
    parsed = ttrpc_pb2.Response.FromString(encode_response(payload, code, message))
    assert parsed.HasField("status")
    assert (parsed.status.code, parsed.status.message, parsed.payload) == (code, message, payload)


frames = st.lists(
    st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 255), st.binary(max_size=300)),
    max_size=6,
)


@given(frames, st.lists(st.integers(1, 50), max_size=20))
def test_decoder_is_independent_of_chunking(
    items: list[tuple[int, int, bytes]], cuts: list[int]
) -> None:
    stream = b"".join(encode_frame(sid, t, data) for sid, t, data in items)
    decoder = FrameDecoder()
    events = []
    pos = 0
    for cut in cuts:
        events += decoder.feed(stream[pos : pos + cut])
        pos += cut
    events += decoder.feed(stream[pos:])
    assert events == [Frame(sid, t, 0, data) for sid, t, data in items]
    assert decoder.buffered == 0


@pytest.mark.parametrize("chunk", [7, 65536, 1 << 20, 5 << 20])
def test_oversized_frame_is_discarded_without_buffering(chunk: int) -> None:
    big = MAX_DATA_LENGTH + 1
    stream = (
        encode_frame(1, 1, b"a")
        + bytes.fromhex(f"{big:08x}")
        + (3).to_bytes(4, "big")
        + b"\x01\x00"
        + b"\xee" * big
        + encode_frame(5, 1, b"b")
    )
    decoder = FrameDecoder()
    events = []
    peak = 0
    for pos in range(0, len(stream), chunk):
        events += decoder.feed(stream[pos : pos + chunk])
        peak = max(peak, decoder.buffered)
    assert events == [Frame(1, 1, 0, b"a"), Oversized(3, 1, big), Frame(5, 1, 0, b"b")]
    assert peak < HEADER_LENGTH + chunk


def test_maximum_size_frame_is_accepted() -> None:
    data = b"x" * MAX_DATA_LENGTH
    assert FrameDecoder().feed(encode_frame(1, 1, data)) == [Frame(1, 1, 0, data)]


@settings(max_examples=1000)
@given(st.binary(max_size=64))
def test_peek_agrees_with_protobuf_on_garbage(data: bytes) -> None:
    try:
        peeked = peek_call(data)
    except MalformedMessage:
        return
    parsed = ttrpc_pb2.Request.FromString(data)
    assert peeked == (parsed.service, parsed.method)


@pytest.mark.parametrize(
    "data",
    [
        *(b"\x0a\x05abc", b"\x08\x01", b"\x22\x00", b"\x0a\x01\xff", b"\x80", b"\x0b"),
        *(b"\x00", b"\x2a\x01\xff", b"\x2a\x02\x0a\x05", b"\xb5\x80\x80\x80\x10\x00"),
    ],
)
def test_peek_rejects_malformed(data: bytes) -> None:
    with pytest.raises(MalformedMessage):
        peek_call(data)
