"""The state store's own thread: it owns the SQLite connection and runs the store's calls in the
order they came.

The calls that queue while it works are run one after another and answered together, with one
wake-up of each waiting event loop, not one each. With many sandboxes busy at once the hand-off
between the loop and this thread, not SQLite, was most of a store call's CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# (the caller's loop, the caller's future, the function, its arguments)
_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]
# (the future, whether the call returned, what it returned or raised)
_Outcome = tuple["asyncio.Future[Any]", bool, Any]


class StateThread:
    """One thread running blocking calls in order; `await thread.call(fn, *args)`."""

    def __init__(self, name: str = "peerpods-state") -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """A future of `fn(*args)` run on the thread (not run if cancelled before its turn)."""
        if self._stopped:
            raise RuntimeError("the state thread has stopped")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((loop, future, fn, args))
        return future

    def stop(self) -> None:
        """Run what is queued, then end the thread (blocking: call it off the loop)."""
        self._stopped = True
        self._jobs.put(None)
        self._thread.join()

    def _serve(self) -> None:
        running = True
        while running:
            batch = [self._jobs.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(self._jobs.get_nowait())
            answers: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
            for job in batch:
                if job is None:
                    running = False
                    continue
                loop, future, fn, args = job
                if future.cancelled():  # its caller stopped waiting before its turn
                    continue
                try:
                    outcome: _Outcome = (future, True, fn(*args))
                except BaseException as exc:  # the caller's to handle, never this thread's
                    outcome = (future, False, exc)
                answers.setdefault(loop, []).append(outcome)
            for loop, outcomes in answers.items():
                with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                    loop.call_soon_threadsafe(_settle, outcomes)


def _settle(outcomes: list[_Outcome]) -> None:
    """On the caller's loop: hand each call's outcome to its future."""
    for future, returned, value in outcomes:
        if future.cancelled():
            continue
        if returned:
            future.set_result(value)
        else:
            future.set_exception(value)
