"""Status codes and the one error type of the ttrpc layer.

ttrpc carries gRPC status codes in every Response. `TtrpcError` is both what a handler raises to
answer with a status and what a client raises when a call comes back with one; it is a
`PeerpodsError`, so the CLI prints it as one line.
"""

from __future__ import annotations

import enum

from providers.core.errors import PeerpodsError


class Code(enum.IntEnum):
    """gRPC status codes, as Go and Rust ttrpc send them."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16

    @classmethod
    def from_wire(cls, value: int) -> Code:
        """Map a received code; values outside gRPC's range become UNKNOWN."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


class TtrpcError(PeerpodsError):
    """A non-OK ttrpc status: raised by handlers to answer with it, by clients on receiving it."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[type[TtrpcError], tuple[Code, str]]:
        return (type(self), (self.code, self.message))
