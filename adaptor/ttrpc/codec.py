"""Sans-IO ttrpc codec: bytes in, frames out, bounded buffering; no asyncio here.

A frame is a 10-byte header (data length, stream id: uint32 big-endian; message type; flags) and
its data. Data longer than 4 MiB is never buffered: the decoder skips it and reports an
`Oversized` event so the caller can answer RESOURCE_EXHAUSTED on that stream (as Go does) while
the connection stays usable. Request and Response messages are encoded by hand (they are tiny and
hot) and decoded with the generated protobuf classes; `peek_call` reads only service and method so
a proxy can route a request without copying its payload.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from .status import Code

HEADER_LENGTH = 10
MAX_DATA_LENGTH = 4 << 20
_HEADER = struct.Struct(">IIBB")


class MessageType(enum.IntEnum):
    """Frame message types (Data exists only for ttrpc >= 1.2 streaming)."""

    REQUEST = 1
    RESPONSE = 2
    DATA = 3


class Flags(enum.IntFlag):
    """Frame flags (ttrpc >= 1.2): on a Request, whether the client's side of the stream stays
    open; on Data, that it is the last one from its sender, or that it carries no message."""

    REMOTE_CLOSED = 0x1
    REMOTE_OPEN = 0x2
    NO_DATA = 0x4


@dataclass(frozen=True, slots=True)
class Frame:
    """One complete frame."""

    stream_id: int
    msg_type: int
    flags: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Oversized:
    """A frame whose data exceeded MAX_DATA_LENGTH; its data was discarded."""

    stream_id: int
    msg_type: int
    length: int


Event = Frame | Oversized


@dataclass(frozen=True, slots=True)
class DecoderState:
    """A decoder's position: a partial frame's bytes, or what is left of an oversized frame to
    skip (`discard` bytes of the frame `skipping` = (stream id, message type, length))."""

    partial: bytes = b""
    discard: int = 0
    skipping: tuple[int, int, int] | None = None


def encode_header(length: int, stream_id: int, msg_type: int, flags: int = 0) -> bytes:
    """The 10-byte frame header."""
    return _HEADER.pack(length, stream_id, msg_type, flags)


def encode_frame(stream_id: int, msg_type: int, data: bytes, flags: int = 0) -> bytes:
    """A whole frame (header and data) as one buffer, so one write() sends it atomically."""
    return _HEADER.pack(len(data), stream_id, msg_type, flags) + data


class FrameDecoder:
    """Incremental frame parser; holds at most one partial frame (<= header + 4 MiB)."""

    __slots__ = ("_buf", "_discard", "_pending_oversized")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._discard = 0
        self._pending_oversized: Oversized | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for a partial frame (bounded by HEADER_LENGTH + MAX_DATA_LENGTH)."""
        return len(self._buf)

    def export(self) -> DecoderState:
        """Where this decoder stands mid-stream, so another one (in another process) goes on."""
        skipping = self._pending_oversized
        return DecoderState(
            bytes(self._buf),
            self._discard,
            None if skipping is None else (skipping.stream_id, skipping.msg_type, skipping.length),
        )

    @classmethod
    def resume(cls, state: DecoderState) -> FrameDecoder:
        """A decoder that continues the stream `state` was exported from."""
        decoder = cls()
        decoder._buf += state.partial
        if state.skipping is not None and state.discard > 0:
            decoder._discard = state.discard
            decoder._pending_oversized = Oversized(*state.skipping)
        return decoder

    def feed(self, data: bytes) -> list[Event]:
        """Consume received bytes; return the frames (and oversize events) they complete."""
        events: list[Event] = []
        view = memoryview(data)
        if self._discard:
            skip = min(self._discard, len(view))
            self._discard -= skip
            view = view[skip:]
            if self._discard:
                return events
            assert self._pending_oversized is not None
            events.append(self._pending_oversized)
            self._pending_oversized = None
        buf = self._buf
        if not buf and len(view) >= HEADER_LENGTH:
            # Fast path: parse straight out of the received chunk without buffering it.
            pos = 0
            end = len(view)
            while end - pos >= HEADER_LENGTH:
                length, stream_id, msg_type, flags = _HEADER.unpack_from(view, pos)
                if length > MAX_DATA_LENGTH:
                    pos = self._start_discard(view, pos, length, stream_id, msg_type, events)
                    if self._discard:
                        return events
                    continue
                stop = pos + HEADER_LENGTH + length
                if stop > end:
                    break
                data_view = view[pos + HEADER_LENGTH : stop]
                events.append(Frame(stream_id, msg_type, flags, bytes(data_view)))
                pos = stop
            buf += view[pos:]
            return events
        buf += view
        while len(buf) >= HEADER_LENGTH:
            length, stream_id, msg_type, flags = _HEADER.unpack_from(buf, 0)
            if length > MAX_DATA_LENGTH:
                rest = memoryview(bytes(buf))
                buf.clear()
                pos = self._start_discard(rest, 0, length, stream_id, msg_type, events)
                if self._discard:
                    return events
                buf += rest[pos:]
                continue
            stop = HEADER_LENGTH + length
            if len(buf) < stop:
                break
            events.append(Frame(stream_id, msg_type, flags, bytes(buf[HEADER_LENGTH:stop])))
            del buf[:stop]
        return events

    def _start_discard(
        self,
        view: memoryview,
        pos: int,
        length: int,
        stream_id: int,
        msg_type: int,
        events: list[Event],
    ) -> int:
        """Skip an oversized frame's data; return the position after what was skipped."""
        available = len(view) - pos - HEADER_LENGTH
        event = Oversized(stream_id, msg_type, length)
        if available >= length:
            events.append(event)
            return pos + HEADER_LENGTH + length
        self._discard = length - available
        self._pending_oversized = event
        return len(view)


# --- protobuf wire helpers (hand-written for the two envelope messages) ---------------------


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_bytes(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def encode_request(
    service: str,
    method: str,
    payload: bytes,
    timeout_nano: int = 0,
    metadata: Sequence[tuple[str, str]] = (),
) -> bytes:
    """Serialize a ttrpc Request exactly as Go's codec does (fields in number order)."""
    parts = [_field_bytes(1, service.encode()), _field_bytes(2, method.encode())]
    if payload:
        parts.append(_field_bytes(3, payload))
    if timeout_nano:
        parts.append(b"\x20" + _varint(timeout_nano))
    for key, value in metadata:
        pair = _field_bytes(1, key.encode()) + _field_bytes(2, value.encode())
        parts.append(_field_bytes(5, pair))
    return b"".join(parts)


_OK_STATUS = b"\x0a\x00"


def encode_response(payload: bytes = b"", code: int = Code.OK, message: str = "") -> bytes:
    """Serialize a ttrpc Response; success carries an empty Status (`0a 00`) as Go sends it."""
    if code == Code.OK and not message:
        status = _OK_STATUS
    else:
        inner = b""
        if code:
            inner += b"\x08" + _varint(int(code))
        if message:
            inner += _field_bytes(2, message.encode())
        status = _field_bytes(1, inner)
    if payload:
        return status + _field_bytes(2, payload)
    return status


class MalformedMessage(ValueError):
    """Bytes that are not a valid protobuf message of the expected shape."""


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    end = len(data)
    while True:
        if pos >= end:
            raise MalformedMessage("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise MalformedMessage("varint too long")


# field number -> wire type (2: length-delimited, 0: varint)
_REQUEST_WIRE_TYPES = {1: 2, 2: 2, 3: 2, 4: 0, 5: 2}
_KEY_VALUE_WIRE_TYPES = {1: 2, 2: 2}
_MAX_FIELD_NUMBER = (1 << 29) - 1


def _scan(
    data: bytes, pos: int, end: int, wire_types: dict[int, int], strings: tuple[int, ...]
) -> dict[int, str]:
    """Walk one message's fields between pos and end; return the last value of each string
    field named in `strings`; validate nested KeyValue metadata (field 5 of a Request)."""
    found: dict[int, str] = {}
    while pos < end:
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0 or number > _MAX_FIELD_NUMBER:
            raise MalformedMessage(f"invalid field number {number}")
        want = wire_types.get(number)
        if want is not None and want != wire_type:
            raise MalformedMessage(f"field {number}: wrong wire type {wire_type}")
        if wire_type == 0:
            _, pos = _read_varint(data, pos)
        elif wire_type == 2:
            length, pos = _read_varint(data, pos)
            stop = pos + length
            if stop > end:
                raise MalformedMessage("truncated field")
            if number in strings:
                try:
                    found[number] = data[pos:stop].decode()
                except UnicodeDecodeError as exc:
                    raise MalformedMessage(f"field {number}: invalid UTF-8") from exc
            elif number == 5 and wire_types is _REQUEST_WIRE_TYPES:
                _scan(data, pos, stop, _KEY_VALUE_WIRE_TYPES, (1, 2))
            pos = stop
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise MalformedMessage(f"unsupported wire type {wire_type}")
        if pos > end:
            raise MalformedMessage("truncated field")
    return found


def peek_call(data: bytes) -> tuple[str, str]:
    """Service and method of a serialized Request, walking the wire format without copying the
    payload; raises MalformedMessage for what protobuf would refuse to parse."""
    found = _scan(data, 0, len(data), _REQUEST_WIRE_TYPES, (1, 2))
    return found.get(1, ""), found.get(2, "")


# Response: status (1, a Status message), payload (2); Status: code (1), message (2), details (3)
_MAX_GROUP_DEPTH = 100  # protobuf's own recursion limit


def _walk(
    data: bytes, pos: int, end: int, group: int = 0, depth: int = 0
) -> tuple[list[tuple[int, int, int, int]], int]:
    """The fields of one message between pos and end as (number, wire type, value, end of
    field), with the value of a varint or where a length-delimited field's bytes start; and
    where the walk stopped (after the end-group key of `group`, when walking a group).
    Protobuf reads a field of the wrong wire type as an unknown field: so does the caller."""
    if depth > _MAX_GROUP_DEPTH:
        raise MalformedMessage("groups nested too deep")
    fields: list[tuple[int, int, int, int]] = []
    while pos < end:
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0 or number > _MAX_FIELD_NUMBER:
            raise MalformedMessage(f"invalid field number {number}")
        if wire_type == 4:
            if number != group:
                raise MalformedMessage(f"unexpected end of group {number}")
            return fields, pos
        value = pos
        if wire_type == 0:
            value, pos = _read_varint(data, pos)
        elif wire_type == 2:
            length, value = _read_varint(data, pos)
            pos = value + length
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 3:
            _, pos = _walk(data, pos, end, number, depth + 1)
        else:
            raise MalformedMessage(f"unsupported wire type {wire_type}")
        if pos > end:
            raise MalformedMessage("truncated field")
        fields.append((number, wire_type, value, pos))
    if group:
        raise MalformedMessage(f"group {group} is not closed")
    return fields, pos


def peek_status_code(data: bytes) -> int:
    """The status code of a serialized Response (no status: OK), walking the wire format
    without copying the payload; codes outside gRPC's range read as UNKNOWN. Raises
    MalformedMessage for bytes protobuf would refuse to parse as a Response (a truncated
    status, a length past the end), so a proxy can fail that one call with a status."""
    code = 0
    fields, _end = _walk(data, 0, len(data))
    for number, wire_type, start, stop in fields:
        if (number, wire_type) != (1, 2):
            continue
        status, _end = _walk(data, start, stop)
        for inner, inner_type, value, _stop in status:
            if (inner, inner_type) == (1, 0):
                code = value & 0xFFFFFFFF  # an int32 on the wire, sign-extended to 64 bits
    return int(Code.from_wire(code - (1 << 32) if code >= 1 << 31 else code))
