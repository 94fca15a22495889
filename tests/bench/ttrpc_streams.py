"""What the ttrpc stream rules cost per call, on both sides, against the codec alone.

    python tests/bench/ttrpc_streams.py [--calls N] [--runs N]

Prints microseconds per call (median of the runs) for: the codec alone (a request frame decoded,
service and method peeked, a response frame encoded: the floor every path pays), the serving
side (`ServerStreams`: a request frame in, its response queued and taken, as the server and the
proxy's shim side do), and the calling side (`ClientStreams`: a request queued and taken, its
response frame in, as the client and the proxy's pod VM connection do).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import statistics
import time
from collections.abc import Callable

from adaptor.ttrpc.codec import (
    FrameDecoder,
    MessageType,
    encode_frame,
    encode_request,
    encode_response,
    peek_call,
)
from adaptor.ttrpc.streams import ClientStreams, ServerStreams
from tests.ttrpc.frames import request, response

REQUEST = encode_request("grpc.AgentService", "WaitProcess", b"\x0a\x40" + b"c" * 64)
RESPONSE = encode_response(b"\x08\x00" + b"p" * 30)


def codec_alone(frames: list[bytes]) -> None:
    decoder = FrameDecoder()
    for chunk in frames:
        for frame in decoder.feed(chunk):
            peek_call(frame.data)  # type: ignore[union-attr]
            encode_frame(frame.stream_id, MessageType.RESPONSE, RESPONSE)


def serving(frames: list[bytes]) -> None:
    streams = ServerStreams(peek_call)
    for chunk in frames:
        for event in streams.receive(chunk):
            streams.respond(event.stream_id, RESPONSE)
        streams.data_to_send()


def calling(frames: list[bytes]) -> None:
    streams = ClientStreams()
    for chunk in frames:
        streams.call(REQUEST)
        streams.data_to_send()
        streams.receive(chunk)


def per_call_us(run: Callable[[list[bytes]], None], frames: list[bytes], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run(frames)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / len(frames) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50_000, help="calls per run")
    parser.add_argument("--runs", type=int, default=5, help="runs (the median is printed)")
    args = parser.parse_args()
    ids = range(1, 2 * args.calls, 2)
    requests = [request(i, REQUEST) for i in ids]
    responses = [response(i, RESPONSE) for i in ids]
    for name, run, frames in [
        ("codec alone", codec_alone, requests),
        ("serving side", serving, requests),
        ("calling side", calling, responses),
    ]:
        print(f"{name:<13} {per_call_us(run, frames, args.runs):6.2f} us per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
