"""Structured JSON logs with the sandbox id and pod on every line of a sandbox's work.

The context travels in contextvars, so a log call deep inside a provider still says which sandbox
it is about without threading ids through every signature. Messages never carry credentials,
user data or payloads: callers log ids, names and error categories only.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

_sandbox: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "peerpods_sandbox", default=None
)


@contextlib.contextmanager
def sandbox_context(sandbox_id: str, pod: str = "") -> Iterator[None]:
    """Tag every log line emitted inside (including in tasks started inside) with the sandbox."""
    token = _sandbox.set({"sandbox_id": sandbox_id, "pod": pod})
    try:
        yield
    finally:
        _sandbox.reset(token)


def bind_sandbox(sandbox_id: str, pod: str = "") -> None:
    """Tag the rest of the current task's log lines with the sandbox."""
    _sandbox.set({"sandbox_id": sandbox_id, "pod": pod})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, sandbox context, extras."""

    _RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = _sandbox.get()
        if context:
            entry.update({k: v for k, v in context.items() if v})
        for key, value in record.__dict__.items():
            if key not in self._RESERVED and not key.startswith("_"):
                entry[key] = value if isinstance(value, str | int | float | bool) else str(value)
        if record.exc_info and record.exc_info[0] is not None:
            entry["error"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"
        return json.dumps(entry, separators=(",", ":"))


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to `sys.stderr` as it is when a record is emitted, not as it was when the handler
    was made: a CLI run in-process (tests, an embedding program) may swap stderr and close the
    old one, and a handler holding that closed stream fails every later record."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        """Nothing to keep: the stream is looked up at each record."""


def configure(level: str = "info", fmt: str = "json") -> None:
    """Route the root logger to stderr as JSON (or plain text for humans)."""
    handler = StderrHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
