"""ttrpc frames as a peer puts them on the wire, for the stream-rule tests and their benchmark
(tests/bench/ttrpc_streams.py): a client's request, a server's response."""

from __future__ import annotations

from adaptor.ttrpc.codec import MessageType, encode_frame, encode_request

CHECK = encode_request("grpc.Health", "Check", b"")


def request(stream_id: int, data: bytes = CHECK, flags: int = 0) -> bytes:
    """A request frame; a Health Check unless `data` says otherwise."""
    return encode_frame(stream_id, MessageType.REQUEST, data, flags)


def response(
    stream_id: int, data: bytes = b"\x0a\x00", msg_type: int = MessageType.RESPONSE
) -> bytes:
    """A response frame (or, given another `msg_type`, any frame a server sends)."""
    return encode_frame(stream_id, msg_type, data)
