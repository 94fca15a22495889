"""Reading a Response's status code without decoding it: what protobuf reads, and a clear
MalformedMessage for the short, truncated answers a hostile pod VM can send."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptor.ttrpc.codec import MalformedMessage, encode_response, peek_status_code
from adaptor.ttrpc.gen import ttrpc_pb2
from adaptor.ttrpc.status import Code


@given(st.integers(-(2**31), 2**31 - 1), st.text(max_size=300), st.binary(max_size=64))
def test_reads_the_code_of_any_response(code: int, message: str, payload: bytes) -> None:
    data = ttrpc_pb2.Response(
        status=ttrpc_pb2.Status(code=code, message=message), payload=payload
    ).SerializeToString()
    assert peek_status_code(data) == Code.from_wire(code)
    assert peek_status_code(encode_response(payload, Code.NOT_FOUND, message)) == Code.NOT_FOUND


@settings(max_examples=2000)
@given(st.binary(max_size=24))
def test_agrees_with_protobuf_on_garbage(data: bytes) -> None:
    try:
        code = peek_status_code(data)
    except MalformedMessage:
        with pytest.raises(DecodeError):
            ttrpc_pb2.Response.FromString(data)
        return
    try:
        parsed = ttrpc_pb2.Response.FromString(data)
    except DecodeError:
        return  # e.g. invalid UTF-8 in the message: the shim's own decoder refuses it
    assert code == Code.from_wire(parsed.status.code)


@pytest.mark.parametrize(
    "data", [b"\x0a\x05", b"\x0a\x02\x08", b"\x0a\x01", b"\x0a", b"\x0a\x80", b"\x12\x09ab"]
)
def test_short_and_truncated_responses_are_malformed(data: bytes) -> None:
    with pytest.raises(MalformedMessage):
        peek_status_code(data)


def test_empty_and_status_less_responses_are_ok() -> None:
    assert peek_status_code(b"") == Code.OK
    assert peek_status_code(b"\x0a\x00") == Code.OK
    assert peek_status_code(b"\x12\x01x") == Code.OK
