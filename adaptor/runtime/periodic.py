"""One owned background task: started at most once at a time, cancelled and awaited by stop().

The garbage collector and the reaper each run a periodic loop that the daemon must own and
await at shutdown; this holds that task so both start and stop it the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class OwnedTask:
    """Holds one named task; `start()` is idempotent while it runs, `stop()` ends it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._task: asyncio.Task[None] | None = None

    def start(self, loop: Callable[[], Coroutine[Any, Any, None]]) -> asyncio.Task[None]:
        """Start `loop()` unless it already runs; the caller owns the task through stop()."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(loop(), name=self.name)
        return self._task

    async def stop(self) -> None:
        """Cancel the task and wait for it to end (a no-op when none runs)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            if not task.cancelled():
                raise
