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
"""

from __future__ import annotations


class PeerpodsError(Exception):
    """Base of every error peerpods raises on purpose."""


class InvalidRequest(PeerpodsError):
    """Input that can never succeed as written."""


class AnnotationError(InvalidRequest):
    """A malformed annotation value; the message names the annotation."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"annotation {key}: {message}")
        self.key = key


class NoMatch(PeerpodsError):
    """No instance type satisfies a valid request; `reasons` summarise why, and `stage` names the
    check that ruled the last types out (a bounded label: metrics count by it, never by text)."""

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


class TransientError(ProviderError):
    """Throttling or a server-side hiccup: the same call may succeed later."""


class InstanceNotFound(ProviderError):
    """The instance does not exist (anymore)."""


class QuotaExhausted(PeerpodsError):
    """The adaptor's shared GPU quota pool cannot take this sandbox."""
