"""The ttrpc stream rules of a serving connection, sans-IO: bytes in, events out, frames to send.

The Python server and the agent proxy's shim side both serve ttrpc through `ServerStreams`, so
each rule is written once, here, in the order a frame meets them:

1. A frame whose data is longer than MAX_DATA_LENGTH is skipped unread and answered
   RESOURCE_EXHAUSTED on its stream id; the connection goes on.
2. A Response frame, or a type this protocol version does not know, is ignored (forward
   compatibility, as Go's server does).
3. A Request that does not parse is answered INVALID_ARGUMENT ("unmarshal request error").
4. A Request opens a stream: its id must be odd (client-initiated) and higher than any id the
   connection used before, else INVALID_ARGUMENT. Without the `remote open` flag the client's
   side is closed at once (a unary call, or `remote closed`: nothing more comes from it).
5. Data is taken only on a stream whose client side is still open, up to the frame with the
   `remote closed` flag, which carries no data (else INVALID_ARGUMENT, and the stream ends);
   `no data` marks a frame without a message. Data on any other stream (a unary call, a
   finished or unknown one) is dropped: nobody on this side waits for it.
6. A stream ends with one Response, sent by `respond`; a second one for the same stream is not
   sent. A Response longer than MAX_DATA_LENGTH is replaced by RESOURCE_EXHAUSTED.

Refusals are sent by the machine itself (see `data_to_send`); the `Refused` event tells the
caller which stream was refused and why. A refusal answers the frame, not the stream: a call
already in flight on a re-used id still gets its own Response, as from Go's server; only the
refusal of a close that carries data ends its stream. `export` and `resume` move a
connection's position to another process (a hand-off) with its streams still open.

The calling side (our client, and the proxy's connection to the pod VM) keeps the mirror rules in
`ClientStreams`: its ids are odd and increasing until they run out, a request over the size limit
is never sent, each call gets one answer (an oversized one becomes RESOURCE_EXHAUSTED), and
frames for streams nobody waits on are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from .codec import (
    MAX_DATA_LENGTH,
    DecoderState,
    Flags,
    Frame,
    FrameDecoder,
    MalformedMessage,
    MessageType,
    encode_frame,
    encode_response,
)
from .status import Code, TtrpcError

R = TypeVar("R")

ODD_IDS = "StreamID must be odd for client initiated streams"
REUSED_ID = "StreamID cannot be re-used and must increment"
CLOSE_WITH_DATA = "data close message cannot include data"
RESPONSE_TOO_LARGE = "response exceeds maximum message size"
IDS_EXHAUSTED = "stream ids exhausted on this connection"
MAX_STREAM_ID = (1 << 32) - 1
# plain ints for the per-frame tests (enum operators cost a Python call each)
_REQUEST = int(MessageType.REQUEST)
_RESPONSE = int(MessageType.RESPONSE)
_DATA = int(MessageType.DATA)
_REMOTE_OPEN = int(Flags.REMOTE_OPEN)
_REMOTE_CLOSED = int(Flags.REMOTE_CLOSED)
_NO_DATA = int(Flags.NO_DATA)


def oversized_message(length: int) -> str:
    """The status message Go's ttrpc gives a frame over the size limit."""
    return f"message length {length} exceed maximum message size of {MAX_DATA_LENGTH}"


@dataclass(slots=True)
class Call(Generic[R]):
    """A new stream: the Request frame's data and what `decode` made of it. `streaming` is set
    when the client's side stays open (Data frames follow)."""

    stream_id: int
    data: bytes
    request: R
    streaming: bool = False


@dataclass(slots=True)
class StreamData:
    """A Data frame on a stream whose client side is open; `data` is None for a `no data`
    frame; `closed` when the client will send nothing more on it."""

    stream_id: int
    data: bytes | None
    closed: bool


@dataclass(slots=True)
class Refused:
    """A frame answered with a status by the machine itself (already queued to send)."""

    stream_id: int
    code: Code
    message: str


Event = Call[R] | StreamData | Refused


class _Outgoing:
    """The frames a machine queued for its connection, taken by whoever writes to it."""

    __slots__ = ("_out",)

    def __init__(self) -> None:
        self._out: list[bytes] = []  # frames, each its own buffer

    def data_to_send(self) -> bytes:
        """The frames queued since the last call, in order (one alone is not copied)."""
        out = self._out
        if not out:
            return b""
        self._out = []
        return out[0] if len(out) == 1 else b"".join(out)


class ServerStreams(_Outgoing, Generic[R]):
    """One serving connection's streams: which are open, the highest id used, the frame decoder.

    `decode` turns a Request frame's data into what the caller routes on (a full Request, or
    only service and method); it raises MalformedMessage for data that does not parse.
    """

    __slots__ = ("_decode", "_decoder", "_input_open", "_last_id", "_open")

    def __init__(
        self,
        decode: Callable[[bytes], R],
        *,
        decoder: FrameDecoder | None = None,
        last_stream_id: int = 0,
        open_ids: Iterable[int] = (),
    ) -> None:
        self._decode = decode
        self._decoder = decoder or FrameDecoder()
        self._last_id = last_stream_id
        self._open: set[int] = set(open_ids)  # streams not answered yet
        self._input_open: set[int] = set()  # of those, streams whose client side is open
        super().__init__()

    @classmethod
    def resume(
        cls,
        decode: Callable[[bytes], R],
        decoder: DecoderState,
        last_stream_id: int,
        open_ids: Iterable[int],
    ) -> ServerStreams[R]:
        """Go on from where another process's machine stood (see `export`)."""
        return cls(
            decode,
            decoder=FrameDecoder.resume(decoder),
            last_stream_id=last_stream_id,
            open_ids=open_ids,
        )

    def export(self) -> DecoderState:
        """The decoder's position; with `last_stream_id` and the open streams, what `resume`
        needs to go on elsewhere."""
        return self._decoder.export()

    @property
    def last_stream_id(self) -> int:
        """The highest stream id a Request opened on this connection."""
        return self._last_id

    @property
    def in_flight(self) -> int:
        """Streams opened and not answered yet."""
        return len(self._open)

    def receive(self, data: bytes) -> list[Event[R]]:
        """Take received bytes; return what they mean for the streams."""
        events: list[Event[R]] = []
        for frame in self._decoder.feed(data):
            if not isinstance(frame, Frame):
                self._refuse(
                    events,
                    frame.stream_id,
                    Code.RESOURCE_EXHAUSTED,
                    oversized_message(frame.length),
                )
            elif frame.msg_type == _REQUEST:
                self._request(events, frame)
            elif frame.msg_type == _DATA:
                self._data(events, frame)
        return events

    def respond(self, stream_id: int, data: bytes) -> bool:
        """Queue the Response `data` that ends an open stream; False (nothing queued) when the
        stream is not open: answered already, or never opened."""
        if stream_id not in self._open:
            return False
        self._open.discard(stream_id)
        self._input_open.discard(stream_id)
        if len(data) > MAX_DATA_LENGTH:
            data = encode_response(b"", Code.RESOURCE_EXHAUSTED, RESPONSE_TOO_LARGE)
        self._out.append(encode_frame(stream_id, _RESPONSE, data))
        return True

    def _request(self, events: list[Event[R]], frame: Frame) -> None:
        stream_id = frame.stream_id
        try:
            request = self._decode(frame.data)
        except MalformedMessage as exc:
            self._refuse(
                events, stream_id, Code.INVALID_ARGUMENT, f"unmarshal request error: {exc}"
            )
            return
        if stream_id % 2 != 1:
            self._refuse(events, stream_id, Code.INVALID_ARGUMENT, ODD_IDS)
            return
        if stream_id <= self._last_id:
            self._refuse(events, stream_id, Code.INVALID_ARGUMENT, REUSED_ID)
            return
        self._last_id = stream_id
        self._open.add(stream_id)
        streaming = bool(frame.flags & _REMOTE_OPEN)
        if streaming:
            self._input_open.add(stream_id)
        events.append(Call(stream_id, frame.data, request, streaming))

    def _data(self, events: list[Event[R]], frame: Frame) -> None:
        stream_id = frame.stream_id
        if stream_id not in self._input_open:
            return
        closed = bool(frame.flags & _REMOTE_CLOSED)
        if closed and frame.data:
            self._input_open.discard(stream_id)
            self._open.discard(stream_id)
            self._refuse(events, stream_id, Code.INVALID_ARGUMENT, CLOSE_WITH_DATA)
            return
        if closed:
            self._input_open.discard(stream_id)
        data = None if frame.flags & _NO_DATA or closed else frame.data
        events.append(StreamData(stream_id, data, closed))

    def _refuse(self, events: list[Event[R]], stream_id: int, code: Code, message: str) -> None:
        refusal = encode_response(b"", code, message)
        self._out.append(encode_frame(stream_id, _RESPONSE, refusal))
        events.append(Refused(stream_id, code, message))


@dataclass(slots=True)
class Answer:
    """The Response that ends a call: its data as received, or a RESOURCE_EXHAUSTED status in
    place of one over the size limit."""

    stream_id: int
    data: bytes


class ClientStreams(_Outgoing):
    """One calling connection's streams: the next id, the calls waiting for an answer."""

    __slots__ = ("_decoder", "_next_id", "_open")

    def __init__(self, *, first_stream_id: int = 1) -> None:
        self._decoder = FrameDecoder()
        self._next_id = first_stream_id
        self._open: set[int] = set()
        super().__init__()

    @property
    def in_flight(self) -> int:
        """Calls sent and not answered (nor forgotten) yet."""
        return len(self._open)

    def call(self, data: bytes) -> int:
        """Queue a Request frame with `data` on a new stream; its id. TtrpcError, with nothing
        queued, when `data` is over the size limit (RESOURCE_EXHAUSTED) or the connection's ids
        are used up (UNAVAILABLE: the caller opens a new connection)."""
        if len(data) > MAX_DATA_LENGTH:
            raise TtrpcError(Code.RESOURCE_EXHAUSTED, oversized_message(len(data)))
        stream_id = self._next_id
        if stream_id > MAX_STREAM_ID:
            raise TtrpcError(Code.UNAVAILABLE, IDS_EXHAUSTED)
        self._next_id = stream_id + 2
        self._open.add(stream_id)
        self._out.append(encode_frame(stream_id, _REQUEST, data))
        return stream_id

    def forget(self, stream_id: int) -> None:
        """A call given up on (deadline, cancelled): its answer, if one comes, is dropped."""
        self._open.discard(stream_id)

    def receive(self, data: bytes) -> list[Answer]:
        """Take received bytes; return the answers they complete."""
        answers: list[Answer] = []
        for frame in self._decoder.feed(data):
            stream_id = frame.stream_id
            if stream_id not in self._open:
                continue
            if not isinstance(frame, Frame):
                body = encode_response(b"", Code.RESOURCE_EXHAUSTED, RESPONSE_TOO_LARGE)
            elif frame.msg_type == _RESPONSE:
                body = frame.data
            else:
                continue  # not the answer (Data on a unary call, a type unknown here)
            self._open.discard(stream_id)
            answers.append(Answer(stream_id, body))
        return answers
