"""The stream rules of a serving connection (adaptor.ttrpc.streams), with no sockets at all."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adaptor.ttrpc.codec import (
    MAX_DATA_LENGTH,
    Flags,
    Frame,
    FrameDecoder,
    MessageType,
    encode_frame,
    encode_response,
    peek_call,
)
from adaptor.ttrpc.gen import ttrpc_pb2
from adaptor.ttrpc.status import Code, TtrpcError
from adaptor.ttrpc.streams import (
    CLOSE_WITH_DATA,
    IDS_EXHAUSTED,
    MAX_STREAM_ID,
    ODD_IDS,
    RESPONSE_TOO_LARGE,
    REUSED_ID,
    Answer,
    Call,
    ClientStreams,
    Event,
    Refused,
    ServerStreams,
    StreamData,
    oversized_message,
)
from tests.ttrpc.frames import CHECK, request, response

REQUEST = MessageType.REQUEST
DATA = MessageType.DATA


def machine() -> ServerStreams[tuple[str, str]]:
    return ServerStreams(peek_call)


def oversized(stream_id: int, msg_type: int = REQUEST, extra: int = 1) -> bytes:
    length = MAX_DATA_LENGTH + extra
    header = length.to_bytes(4, "big") + stream_id.to_bytes(4, "big") + bytes([msg_type, 0])
    return header + b"\x00" * length


def sent(streams: ServerStreams[tuple[str, str]]) -> list[tuple[int, int, str, bytes]]:
    """The frames queued to send: stream id, status code and message, payload."""
    out = []
    for frame in FrameDecoder().feed(streams.data_to_send()):
        assert isinstance(frame, Frame) and frame.msg_type == MessageType.RESPONSE
        response = ttrpc_pb2.Response.FromString(frame.data)
        out.append(
            (frame.stream_id, response.status.code, response.status.message, response.payload)
        )
    return out


def test_a_call_opens_a_stream_that_one_response_ends() -> None:
    streams = machine()
    events = streams.receive(request(1) + request(3))
    assert events == [
        Call(1, CHECK, ("grpc.Health", "Check")),
        Call(3, CHECK, ("grpc.Health", "Check")),
    ]
    assert (streams.in_flight, streams.last_stream_id, streams.data_to_send()) == (2, 3, b"")
    assert streams.respond(3, encode_response(b"ok"))
    assert not streams.respond(3, encode_response(b"again"))  # a stream ends once
    assert not streams.respond(5, encode_response())  # never opened
    assert sent(streams) == [(3, Code.OK, "", b"ok")]
    assert streams.in_flight == 1
    assert streams.respond(1, encode_response())  # the other stream is still open


def test_ids_must_be_odd_and_increase() -> None:
    streams = machine()
    events = streams.receive(b"".join(request(i) for i in (2, 5, 5, 3, 7, 0)))
    assert [e.stream_id for e in events if isinstance(e, Call)] == [5, 7]
    assert sent(streams) == [
        (2, Code.INVALID_ARGUMENT, ODD_IDS, b""),
        (5, Code.INVALID_ARGUMENT, REUSED_ID, b""),
        (3, Code.INVALID_ARGUMENT, REUSED_ID, b""),
        (0, Code.INVALID_ARGUMENT, ODD_IDS, b""),
    ]
    # a refused id is not taken: the next odd id above the highest opened one still is
    assert streams.last_stream_id == 7
    assert [type(e) for e in streams.receive(request(9))] == [Call]


def test_a_request_that_does_not_parse_is_refused_before_its_id_is_taken() -> None:
    streams = machine()
    events = streams.receive(request(1, b"\xff\xff\xff") + request(1))
    assert isinstance(events[0], Refused)
    assert events[0].code == Code.INVALID_ARGUMENT
    assert events[0].message.startswith("unmarshal request error: ")
    assert events[1] == Call(1, CHECK, ("grpc.Health", "Check"))
    # even a bad id is reported as the unparsable request it is
    streams.data_to_send()
    streams.receive(request(2, b"\xff"))
    assert sent(streams)[0][2].startswith("unmarshal request error")


def test_an_oversized_frame_is_refused_on_its_stream_and_the_connection_goes_on() -> None:
    streams = machine()
    events = streams.receive(oversized(1) + oversized(4, DATA, extra=7) + request(3))
    assert events[:2] == [
        Refused(1, Code.RESOURCE_EXHAUSTED, oversized_message(MAX_DATA_LENGTH + 1)),
        Refused(4, Code.RESOURCE_EXHAUSTED, oversized_message(MAX_DATA_LENGTH + 7)),
    ]
    assert events[2] == Call(3, CHECK, ("grpc.Health", "Check"))
    assert oversized_message(5 << 20) == (
        "message length 5242880 exceed maximum message size of 4194304"  # Go's words
    )


def test_an_oversized_response_becomes_resource_exhausted() -> None:
    streams = machine()
    streams.receive(request(1))
    assert streams.respond(1, b"\x12" + b"\x00" * MAX_DATA_LENGTH)
    assert sent(streams) == [(1, Code.RESOURCE_EXHAUSTED, RESPONSE_TOO_LARGE, b"")]


def test_responses_and_unknown_types_from_a_client_are_ignored() -> None:
    streams = machine()
    frames = encode_frame(1, MessageType.RESPONSE, b"x") + encode_frame(3, 9, b"y")
    assert streams.receive(frames) == []
    assert streams.data_to_send() == b""
    assert streams.last_stream_id == 0


def test_data_follows_a_request_that_keeps_the_client_side_open() -> None:
    streams = machine()
    frames = (
        request(1, flags=Flags.REMOTE_OPEN)
        + encode_frame(1, DATA, b"one")
        + encode_frame(1, DATA, b"", Flags.NO_DATA)
        + encode_frame(1, DATA, b"", Flags.REMOTE_CLOSED | Flags.NO_DATA)
        + encode_frame(1, DATA, b"late")  # after the client closed its side: dropped
    )
    assert streams.receive(frames) == [
        Call(1, CHECK, ("grpc.Health", "Check"), streaming=True),
        StreamData(1, b"one", closed=False),
        StreamData(1, None, closed=False),
        StreamData(1, None, closed=True),
    ]
    assert streams.data_to_send() == b"" and streams.in_flight == 1
    assert streams.respond(1, encode_response())


def test_data_anywhere_else_is_dropped() -> None:
    streams = machine()
    streams.receive(request(1) + request(3, flags=Flags.REMOTE_CLOSED))
    frames = b"".join(
        encode_frame(sid, DATA, b"x", flags)
        for sid, flags in [(1, 0), (3, 0), (5, 0), (2, 0), (1, Flags.REMOTE_CLOSED)]
    )
    assert streams.receive(frames) == []
    assert streams.data_to_send() == b""
    assert streams.in_flight == 2


def test_a_close_that_carries_data_ends_the_stream() -> None:
    streams = machine()
    streams.receive(request(1, flags=Flags.REMOTE_OPEN))
    events = streams.receive(encode_frame(1, DATA, b"x", Flags.REMOTE_CLOSED))
    assert events == [Refused(1, Code.INVALID_ARGUMENT, CLOSE_WITH_DATA)]
    assert sent(streams) == [(1, Code.INVALID_ARGUMENT, CLOSE_WITH_DATA, b"")]
    assert streams.in_flight == 0
    assert not streams.respond(1, encode_response())  # the handler's late answer is not sent


def test_resume_goes_on_mid_frame_with_the_streams_still_open() -> None:
    first = machine()
    stream = request(1) + request(3) + request(5)
    cut = len(request(1)) + len(request(3)) + 4
    assert [e.stream_id for e in first.receive(stream[:cut])] == [1, 3]
    first.respond(1, encode_response())
    second = ServerStreams.resume(peek_call, first.export(), first.last_stream_id, [3])
    assert second.receive(stream[cut:]) == [Call(5, CHECK, ("grpc.Health", "Check"))]
    assert second.in_flight == 2 and second.respond(3, encode_response())
    second.receive(request(3))
    assert sent(second)[-1] == (3, Code.INVALID_ARGUMENT, REUSED_ID, b"")


# --- any split of the bytes gives the same events and the same answers -------------------------

frame_spec = st.tuples(
    st.integers(0, 12),
    # -1: a frame over the size limit
    st.sampled_from([REQUEST, REQUEST, REQUEST, DATA, DATA, MessageType.RESPONSE, 7, -1]),
    st.sampled_from([0, Flags.REMOTE_OPEN, Flags.REMOTE_CLOSED, Flags.NO_DATA, 5]),
    st.sampled_from([CHECK, b"", b"\xff\xff", b"payload"]),
)


def encode(spec: tuple[int, int, int, bytes]) -> bytes:
    stream_id, msg_type, flags, data = spec
    if msg_type < 0:
        return oversized(stream_id, extra=3)
    return encode_frame(stream_id, msg_type, data, flags)


def run(chunks: list[bytes]) -> tuple[list[Event[tuple[str, str]]], bytes]:
    """Feed the chunks; then answer every third stream opened; what came out."""
    streams = machine()
    events: list[Event[tuple[str, str]]] = []
    for chunk in chunks:
        events += streams.receive(chunk)
    for event in events:
        if isinstance(event, Call) and event.stream_id % 3 == 0:
            assert streams.respond(event.stream_id, encode_response(b"r"))
    return events, streams.data_to_send()


@given(
    st.lists(frame_spec, min_size=1, max_size=8),
    st.lists(st.integers(0, MAX_DATA_LENGTH * 2), max_size=6),
)
def test_any_split_of_the_bytes_gives_the_same_events(
    specs: list[tuple[int, int, int, bytes]], cuts: list[int]
) -> None:
    stream = b"".join(encode(s) for s in specs)
    points = sorted({min(c, len(stream)) for c in cuts} | {len(stream) // 2, 1})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    assert run(chunks) == run([stream])
    # byte by byte, for the frames that are small enough
    if len(stream) < 400:
        assert run([stream[i : i + 1] for i in range(len(stream))]) == run([stream])


# --- the calling side ----------------------------------------------------------------------------


def test_calls_take_odd_increasing_ids_and_get_one_answer_each() -> None:
    streams = ClientStreams()
    assert [streams.call(CHECK) for _ in range(3)] == [1, 3, 5]
    assert streams.data_to_send() == request(1) + request(3) + request(5)
    frames = (
        response(3, b"three")
        + response(3, b"again")  # answered already
        + response(7)  # never asked
        + response(1, b"data", MessageType.DATA)  # not the answer: still waiting
        + response(1, b"one")
    )
    assert streams.receive(frames) == [Answer(3, b"three"), Answer(1, b"one")]
    assert streams.in_flight == 1
    streams.forget(5)  # given up: its late answer is dropped
    assert streams.receive(response(5)) == [] and streams.in_flight == 0


def test_an_oversized_answer_ends_its_call_with_resource_exhausted() -> None:
    streams = ClientStreams()
    streams.call(CHECK)
    streams.call(CHECK)
    answers = streams.receive(oversized(3, MessageType.RESPONSE) + response(1))
    assert [a.stream_id for a in answers] == [3, 1]
    status = ttrpc_pb2.Response.FromString(answers[0].data).status
    assert (status.code, status.message) == (Code.RESOURCE_EXHAUSTED, RESPONSE_TOO_LARGE)


def test_a_request_over_the_limit_is_never_sent() -> None:
    streams = ClientStreams()
    with pytest.raises(TtrpcError) as info:
        streams.call(b"x" * (MAX_DATA_LENGTH + 1))
    assert (info.value.code, info.value.message) == (
        Code.RESOURCE_EXHAUSTED,
        oversized_message(MAX_DATA_LENGTH + 1),
    )
    assert streams.data_to_send() == b"" and streams.in_flight == 0
    assert streams.call(b"x" * MAX_DATA_LENGTH) == 1  # the id was not used up


def test_ids_run_out() -> None:
    streams = ClientStreams(first_stream_id=MAX_STREAM_ID)
    assert streams.call(CHECK) == MAX_STREAM_ID
    with pytest.raises(TtrpcError) as info:
        streams.call(CHECK)
    assert (info.value.code, info.value.message) == (Code.UNAVAILABLE, IDS_EXHAUSTED)


@given(
    st.lists(
        st.tuples(st.integers(0, 9), st.sampled_from([1, 2, 2, 3, 7, -1])), min_size=1, max_size=8
    ),
    st.lists(st.integers(0, MAX_DATA_LENGTH * 2), max_size=6),
)
def test_any_split_of_the_answers_gives_the_same_answers(
    specs: list[tuple[int, int]], cuts: list[int]
) -> None:
    stream = b"".join(
        oversized(sid, MessageType.RESPONSE) if t < 0 else response(sid, b"r%d" % sid, t)
        for sid, t in specs
    )
    points = sorted({min(c, len(stream)) for c in cuts} | {len(stream) // 2})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]

    def answers(chunks: list[bytes]) -> list[Answer]:
        streams = ClientStreams()
        for _ in range(5):
            streams.call(CHECK)  # ids 1, 3, 5, 7, 9
        return [a for chunk in chunks for a in streams.receive(chunk)]

    assert answers(chunks) == answers([stream])
