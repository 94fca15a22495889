"""The hand-off's messages: typed, versioned, bounded; bad bytes are a clear HandoffError."""

from __future__ import annotations

import json
import struct

import pytest

from adaptor.node.handoff_wire import (
    HEADER_BYTES,
    MAX_FRAME_BYTES,
    Ack,
    HandoffError,
    Hello,
    Message,
    Moved,
    Offer,
    Ready,
    Released,
    WireCall,
    WireSandbox,
    WireShim,
    decode,
    encode,
    frame_length,
)


def roundtrip(message: Message) -> Message:
    frame = encode(message)
    length = frame_length(frame[:HEADER_BYTES])
    assert length == len(frame) - HEADER_BYTES
    return decode(frame[HEADER_BYTES:])


def test_offer_round_trip_keeps_binary_requests() -> None:
    request = bytes(range(256))  # not UTF-8: travels as base64
    offer = Offer(
        pid=42,
        hypervisor_fd=0,
        fd_count=3,
        sandboxes=(
            WireSandbox(
                sandbox_id="sb1",
                listener_fd=1,
                shims=(
                    WireShim(
                        fd=2,
                        last_stream_id=9,
                        partial=b"\x00\x00",
                        calls=(
                            WireCall(
                                stream_id=7, service="s", method="WaitProcess", request=request
                            ),
                            WireCall(stream_id=9, service="s", method="CreateContainer"),
                        ),
                    ),
                ),
            ),
        ),
    )
    assert roundtrip(offer) == offer
    moved = Moved(sandbox=offer.sandboxes[0], fd_count=3)
    assert roundtrip(moved) == moved
    assert roundtrip(Hello(pid=7)) == Hello(pid=7)
    assert roundtrip(Released()) == Released()
    assert roundtrip(Ready()) == Ready()
    assert roundtrip(Ack(ok=False, error="no")) == Ack(ok=False, error="no")


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"[]", "not a JSON object"),
        (b"{", "not a JSON object"),
        (b'{"kind": "takeover"}', "unknown hand-off message 'takeover'"),
        (b'{"kind": "hello"}', "malformed hand-off hello: pid"),
        (b'{"kind": "hello", "pid": 1, "extra": 1}', "malformed hand-off hello: extra"),
        (b'{"kind": "hello", "pid": 1, "version": 1}', "hand-off version 1 is not 2"),
        (
            json.dumps({"kind": "offer", "pid": 1, "hypervisor_fd": -1, "fd_count": 1}).encode(),
            "hypervisor_fd",
        ),
    ],
)
def test_bad_messages_are_refused_clearly(body: bytes, why: str) -> None:
    with pytest.raises(HandoffError, match=why):
        decode(body)


def test_frames_are_bounded() -> None:
    with pytest.raises(HandoffError, match="exceeds"):
        frame_length(struct.pack(">I", MAX_FRAME_BYTES + 1))
    with pytest.raises(HandoffError, match="truncated"):
        frame_length(b"\x00\x01")
