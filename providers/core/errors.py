"""The one exception tree of peerpods.

    PeerpodsError
    ├── InvalidRequest          bad input from a user or a caller (annotation, flag, manifest)
    │   └── AnnotationError     a specific annotation value is malformed (names the key)
    ├── NoMatch                 a valid request that no instance type can serve (carries reasons)
    ├── CatalogError            a catalog could not be loaded or parsed
    ├── ProviderError           a cloud call failed
    │   ├── CapacityError       no capacity / quota in a zone or for a type: try elsewhere
    │   ├── TransientError      throttling or a 5xx: retry the same call with backoff
    │   └── InstanceNotFound    the VM is gone (delete treats this as success)
    └── QuotaExhausted          the adaptor's own GPU quota pool is full

Third-party errors are translated into these only inside the module that calls the SDK.

Each error class declares its `fault`: whose problem it is and whether trying again can help.
Every protocol boundary answers from one table over the faults (ttrpc status codes in
`adaptor.hypervisor.service`, HTTP codes in `webhook._admission`), never by matching classes
one by one, so a new error class is answered alike everywhere once it names its fault.
"""

from __future__ import annotations

import enum
from typing import ClassVar


class Fault(enum.StrEnum):
    """The one classification of errors that every protocol boundary maps to its own codes."""

    INVALID = "invalid"  # the caller's input can never succeed as written
    NOT_FOUND = "not-found"  # the object named does not exist (any more)
    BUSY = "busy"  # the object's state does not allow this call now
    UNSERVABLE = "unservable"  # valid, but nothing can serve it (no instance type)
    EXHAUSTED = "exhausted"  # a pool or a share is used up: capacity, quota, VNIs, workers
    UNAVAILABLE = "unavailable"  # a dependency failed for now: retrying may succeed
    ABORTED = "aborted"  # the work gave way to a later call
    TIMEOUT = "timeout"  # the work ran out of its time
    INTERNAL = "internal"  # ours or the cloud's: nothing the caller can change


class PeerpodsError(Exception):
    """Base of every error peerpods raises on purpose."""

    fault: ClassVar[Fault] = Fault.INTERNAL


class InvalidRequest(PeerpodsError):
    """Input that can never succeed as written."""

    fault = Fault.INVALID


class AnnotationError(InvalidRequest):
    """A malformed annotation value; the message names the annotation."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"annotation {key}: {message}")
        self.key = key


class NoMatch(PeerpodsError):
    """No instance type satisfies a valid request; `reasons` summarise why, and `stage` names the
    check that ruled the last types out (a bounded label: metrics count by it, never by text)."""

    fault = Fault.UNSERVABLE

    STAGES = (
        "gpu_model", "memory", "mig", "too_large", "arch", "rdma", "offering", "policy", "quota",
        "other",
    )  # fmt: skip

    def __init__(
        self, message: str, reasons: list[str] | None = None, stage: str = "other"
    ) -> None:
        super().__init__(message)
        if stage not in self.STAGES:
            raise ValueError(f"unknown selection stage {stage!r}")
        self.reasons = reasons or []
        self.stage = stage


class CatalogError(PeerpodsError):
    """A catalog snapshot or live listing could not be loaded."""


class ProviderError(PeerpodsError):
    """A cloud operation failed."""


class CapacityError(ProviderError):
    """The cloud has no capacity or quota for this type in this zone."""

    fault = Fault.EXHAUSTED


class TransientError(ProviderError):
    """Throttling or a server-side hiccup: the same call may succeed later."""

    fault = Fault.UNAVAILABLE


class InstanceNotFound(ProviderError):
    """The instance does not exist (anymore)."""


class QuotaExhausted(PeerpodsError):
    """The adaptor's shared GPU quota pool cannot take this sandbox."""

    fault = Fault.EXHAUSTED
