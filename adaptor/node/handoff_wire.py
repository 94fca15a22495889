"""The hand-off's messages, sans-IO: typed, versioned, length-prefixed JSON (no sockets here).

A successor `serve` and its predecessor speak six messages over a unix socket in the pods dir:

    successor  -> Hello    {version, pid}
    predecessor-> Released {}  (its hypervisor socket takes no call, its state store is unlocked)
    successor  -> Ready    {}  (its own parts are up: from here on the shims wait)
    predecessor-> Moved    {sandbox, fd_count}  (one per sandbox, as soon as its proxy stopped)
                   then the fd_count file descriptors, in batches, with SCM_RIGHTS
    predecessor-> Offer    {version, pid, hypervisor_fd, sandboxes: [...], fd_count}
                   then its fd_count file descriptors the same way (the last message)
    successor  -> Ack      {ok, error}

Each sandbox moves on its own, so the successor serves it again while the others still stop:
a shim waits for its own sandbox, not for all of them.

The predecessor answers Hello with an Ack {ok: false} instead when it refuses.

File descriptors travel beside the bytes; a Moved or the Offer names each of its own by its
index in the order they are sent. A frame is a 4-byte big-endian length and that many bytes of
JSON; bytes fields (a request frame's data, a partial frame) are base64.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

VERSION = 2  # 2: each sandbox moves in a Moved of its own
MAX_FRAME_BYTES = 64 << 20  # calls' request data is at most 4 MiB each; a bound, not a size
_LENGTH = struct.Struct(">I")
_STREAM_ID = Field(ge=0, le=(1 << 32) - 1)


class HandoffError(Exception):
    """A hand-off message that is malformed, too large or of another version."""


class _Message(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64"
    )


class WireCall(_Message):
    """A call in flight: `request` holds the frame data to send again (empty: not repeatable)."""

    stream_id: int = _STREAM_ID
    service: str
    method: str
    request: bytes = b""


class WireShim(_Message):
    """A shim connection: its fd index, stream position and calls in flight."""

    fd: int = Field(ge=0)
    last_stream_id: int = _STREAM_ID
    partial: bytes = b""
    discard: int = Field(0, ge=0)
    skipping: tuple[int, int, int] | None = None
    calls: tuple[WireCall, ...] = ()


class WireSandbox(_Message):
    """A sandbox's agent socket (its listener's fd index) and its shim connections."""

    sandbox_id: str
    listener_fd: int = Field(ge=0)
    shims: tuple[WireShim, ...] = ()


class Hello(_Message):
    """The successor asks for everything."""

    kind: Literal["hello"] = "hello"
    version: int = VERSION
    pid: int


class Released(_Message):
    """The predecessor takes no hypervisor call any more and has unlocked its state store."""

    kind: Literal["released"] = "released"


class Ready(_Message):
    """The successor's parts are up; it waits for the sockets."""

    kind: Literal["ready"] = "ready"


class Moved(_Message):
    """One sandbox's sockets and calls; `fd_count` descriptors follow."""

    kind: Literal["moved"] = "moved"
    sandbox: WireSandbox
    fd_count: int = Field(ge=1)


class Offer(_Message):
    """The hypervisor listener (and sandboxes not sent as Moved); `fd_count` descriptors
    follow. The last message before the Ack."""

    kind: Literal["offer"] = "offer"
    version: int = VERSION
    pid: int
    hypervisor_fd: int = Field(ge=0)
    sandboxes: tuple[WireSandbox, ...] = ()
    fd_count: int = Field(ge=1)


class Ack(_Message):
    """The successor serves everything now (or says why not)."""

    kind: Literal["ack"] = "ack"
    ok: bool
    error: str = ""


Message = Hello | Released | Ready | Moved | Offer | Ack


def encode(message: Message) -> bytes:
    """One frame: the length, then the JSON."""
    body = message.model_dump_json().encode()
    if len(body) > MAX_FRAME_BYTES:
        raise HandoffError(f"hand-off message of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return _LENGTH.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    """The body length a 4-byte frame header announces (refused past the bound)."""
    if len(header) != _LENGTH.size:
        raise HandoffError("truncated hand-off frame header")
    (length,) = _LENGTH.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise HandoffError(f"hand-off frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    return int(length)


HEADER_BYTES = _LENGTH.size


_MESSAGES: dict[str, type[Message]] = {
    "hello": Hello,
    "released": Released,
    "ready": Ready,
    "moved": Moved,
    "offer": Offer,
    "ack": Ack,
}


# No message nests deeper than 6 (Offer > sandboxes > sandbox > shims > shim > calls > call);
# a deeper one is refused before any parser recurses into it.
MAX_DEPTH = 16
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


def _too_deep(body: bytes) -> bool:
    """Whether the JSON nests deeper than MAX_DEPTH (brackets inside strings do not count)."""
    depth = 0
    for match in _BRACKET.finditer(_STRING.sub(b"", body)):
        if match.group() in (b"[", b"{"):
            depth += 1
            if depth > MAX_DEPTH:
                return True
        else:
            depth -= 1
    return False


def decode(body: bytes) -> Message:
    """A frame body as its message; malformed JSON or another version is a HandoffError."""
    if _too_deep(body):
        raise HandoffError(f"malformed hand-off message: nested deeper than {MAX_DEPTH}")
    try:
        kind = json.loads(body).get("kind")
    except (ValueError, AttributeError, RecursionError):
        raise HandoffError("malformed hand-off message: not a JSON object") from None
    model = _MESSAGES.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise HandoffError(f"unknown hand-off message {str(kind)[:40]!r}")
    try:
        message = model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "message"
        raise HandoffError(f"malformed hand-off {kind}: {where}: {first['msg']}") from None
    version = getattr(message, "version", VERSION)
    if version != VERSION:
        raise HandoffError(f"hand-off version {version} is not {VERSION}: upgrade in two steps")
    return message
