"""What an agent proxy hands to its successor process, and which agent calls may be sent twice.

A hand-off moves the proxy's sockets, not its pod VM connection (a TLS session cannot move
between processes): the successor dials the forwarder again and sends again the calls that were
in flight. Only calls that are safe to repeat are moved that way, the ones that wait for
something to happen and change nothing when asked twice:

- `WaitProcess`: waits for a process to exit; the same question asked again gets the same exit
  status, provided the agent dropped the first call with its connection.
- `GetOOMEvent`: waits for the next OOM event of the sandbox.
- `ReadStdout` / `ReadStderr`: wait for the next chunk of a process's output; bytes nobody
  received are still in the agent's pipe for the repeated read.
- `grpc.Health` `Check` and `Version`: they only read. Sent again by the successor, they need not
  be waited for before the sockets move.

Any other call (CreateContainer, StartContainer, SignalProcess, ...) may have acted already when
the connection drops, so it is never sent twice: the old process lets it finish before handing
over.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from adaptor.ttrpc.codec import DecoderState

AGENT_SERVICE = "grpc.AgentService"
HEALTH_SERVICE = "grpc.Health"
REPEATABLE: frozenset[tuple[str, str]] = frozenset(
    [
        *((AGENT_SERVICE, m) for m in ("WaitProcess", "GetOOMEvent", "ReadStdout", "ReadStderr")),
        *((HEALTH_SERVICE, m) for m in ("Check", "Version")),
    ]
)
# The long-polling reads of a process's output: the agent takes the bytes it answers with from
# the pipe, so an answer it writes after its TLS layer saw the connection end is bytes lost.
OUTPUT_READS: frozenset[tuple[str, str]] = frozenset(
    (AGENT_SERVICE, method) for method in ("ReadStdout", "ReadStderr")
)
# The status a call gets when it could neither finish before a hand-off nor be sent again.
INTERRUPTED = "interrupted by an adaptor hand-off; retry"


@dataclass(frozen=True)
class MovedCall:
    """A call in flight on a shim connection: its stream id and, when it is safe to repeat, the
    request frame's data to send again (empty: answered UNAVAILABLE instead)."""

    stream_id: int
    service: str
    method: str
    request: bytes = b""


@dataclass
class MovedShim:
    """One shim connection: its socket, the last stream id it used, the decoder's position in
    its byte stream, and its calls in flight."""

    sock: socket.socket
    last_stream_id: int
    decoder: DecoderState
    calls: tuple[MovedCall, ...] = ()


@dataclass
class MovedProxy:
    """A sandbox's agent socket (still listening) and its live shim connections."""

    listener: socket.socket
    shims: list[MovedShim] = field(default_factory=list)

    def close(self) -> None:
        """Close this process's copies (the successor's stay open)."""
        self.listener.close()
        for shim in self.shims:
            shim.sock.close()
