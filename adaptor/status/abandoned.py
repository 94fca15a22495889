"""Sandboxes this daemon gave up on: found running at start, their shim never came back.

Their records are gone once the teardown ends, so the status API keeps the last ones here (in
memory, the most recent `limit`) to say what happened to them and why.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from adaptor.state import SandboxRecord

DEFAULT_LIMIT = 256


class AbandonedBook:
    """The most recent abandoned sandboxes, newest last; one entry per sandbox id."""

    def __init__(self, limit: int = DEFAULT_LIMIT, clock: Callable[[], float] = time.time) -> None:
        self._limit = limit
        self._clock = clock
        self._entries: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def add(self, record: SandboxRecord, reason: str) -> None:
        """Note a sandbox being torn down because nobody will StopVM it."""
        self._entries.pop(record.id, None)
        self._entries[record.id] = {
            "id": record.id,
            "pod": {"namespace": record.pod_namespace, "name": record.pod_name},
            "state": "abandoned",
            "reason": reason,
            "vm_id": record.instance.id if record.instance else "",
            "abandoned_at": self._clock(),
        }
        while len(self._entries) > self._limit:
            self._entries.popitem(last=False)

    def get(self, sandbox_id: str) -> dict[str, Any] | None:
        entry = self._entries.get(sandbox_id)
        return dict(entry) if entry is not None else None

    def snapshot(self) -> list[dict[str, Any]]:
        return [dict(e) for e in self._entries.values()]
