"""Why a hypervisor call was refused, as the sandbox lifecycle says it: the errors the service
maps to ttrpc statuses, the sandbox id rule and the bounded label of a failed StartVM."""

from __future__ import annotations

import asyncio
import re

from providers.core.errors import (
    CapacityError,
    Fault,
    InvalidRequest,
    NoMatch,
    PeerpodsError,
    ProviderError,
    QuotaExhausted,
    TransientError,
)

_SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class SandboxNotFound(PeerpodsError):
    """No sandbox with this id was created (or it was already stopped)."""

    fault = Fault.NOT_FOUND


class SandboxBusy(PeerpodsError):
    """The sandbox is in a state where this call cannot proceed (the message says why)."""

    fault = Fault.BUSY


class StartAborted(PeerpodsError):
    """StartVM gave way to a StopVM of the same sandbox."""

    fault = Fault.ABORTED


class StartTimeout(PeerpodsError):
    """StartVM ran past the daemon's own limit (--start-timeout)."""

    fault = Fault.TIMEOUT


class ShuttingDown(TransientError):
    """The daemon is draining before it exits: no new sandbox starts here (the next one will)."""


def check_sandbox_id(sandbox_id: str) -> str:
    """A sandbox id must be usable as one path component (it names the socket directory)."""
    if not _SANDBOX_ID.fullmatch(sandbox_id):
        raise InvalidRequest(
            f"invalid sandbox id {sandbox_id[:80]!r}: want 1-128 characters of "
            "[A-Za-z0-9_.-] starting with a letter or digit"
        )
    return sandbox_id


def failure_category(exc: BaseException) -> str:
    """A bounded label for why a StartVM failed."""
    for kind, label in (
        (QuotaExhausted, "quota"),
        (NoMatch, "selection"),
        (InvalidRequest, "invalid"),
        (CapacityError, "capacity"),
        (TransientError, "cloud_unavailable"),
        (StartTimeout, "timeout"),
        (ProviderError, "cloud"),
        (asyncio.CancelledError, "cancelled"),
    ):
        if isinstance(exc, kind):
            return label
    return "forwarder" if "forwarder" in str(exc).lower() or "unreachable" in str(exc) else "other"


def why(step: str, exc: BaseException) -> str:
    """The reason a record keeps for a step that failed (or was cancelled)."""
    if isinstance(exc, asyncio.CancelledError):
        return f"{step} cancelled"
    text = str(exc) or type(exc).__name__
    return f"{step} failed: {text}"
