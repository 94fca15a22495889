"""Where blocking cloud SDK calls run: `CloudCalls`, one object owned by whoever runs the
providers (the daemon builds one, lends it to its provider and awaits `shutdown` when it stops).

SDK calls block on the network: a pool of their own, sized for many sandboxes starting at once,
so they neither queue behind nor starve the loop's default executor (files, SQLite). The same
object holds the background deletes of failed creates (so shutdown can wait for them) and who
hears of a create that moved on after a capacity error (`retry.CapacityObserver`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from providers.clouds.retry import CapacityObserver, RetryPolicy, retry_transient
from providers.core.errors import ProviderError

__all__ = ["SDK_THREADS", "CloudCalls"]

log = logging.getLogger(__name__)

SDK_THREADS = 32


class CloudCalls:
    """A cloud provider's thread pool for SDK calls, its background deletes, and its capacity
    fallback observer. The pool's threads start with the first call; `shutdown` ends them."""

    def __init__(
        self, threads: int = SDK_THREADS, on_fallback: CapacityObserver | None = None
    ) -> None:
        self.threads = threads
        self.on_fallback = on_fallback
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._background: set[asyncio.Task[None]] = set()
        self._closed = False

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._closed:
                raise RuntimeError("cloud SDK calls after shutdown")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="peerpods-sdk")
            return self._executor

    async def call(
        self,
        what: str,
        translate: Callable[[BaseException, str], ProviderError],
        fn: Callable[..., Any],
        /,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """Run a blocking SDK call in a thread; its errors come back as this project's
        ProviderError tree (`translate` is the provider's own mapping, the one place SDK errors
        are read)."""
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        pool = self._pool()  # refused after shutdown: a bug of the caller, not the cloud's
        try:
            return await loop.run_in_executor(pool, call)
        except Exception as exc:
            raise translate(exc, what) from exc

    async def discard(
        self, what: str, delete: Callable[[], Awaitable[None]], policy: RetryPolicy
    ) -> None:
        """Delete a VM a failed create left behind, even when the create was cancelled.

        Never raises: the VM carries the owner tag from its first moment, so what this cannot
        delete the garbage collector will. The delete runs shielded so a second cancel cannot
        abandon it; `shutdown` waits for it.
        """

        async def run() -> None:
            try:
                await retry_transient(what, delete, policy)
            except ProviderError as exc:
                log.warning(
                    "%s: could not delete after a failed create (GC will retry): %s", what, exc
                )

        task = asyncio.ensure_future(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        await asyncio.shield(task)

    def pending(self) -> int:
        """Background deletes still running."""
        return len(self._background)

    @property
    def started(self) -> bool:
        """Whether the pool's threads were started (and not yet shut down)."""
        with self._lock:
            return self._executor is not None

    async def shutdown(self, grace_seconds: float) -> None:
        """Wait up to the grace for background deletes, cancel the rest, then stop the pool's
        threads (without waiting for a call stuck in the SDK: its thread ends with the
        process). Later calls are refused."""
        tasks = list(self._background)
        if tasks:
            await asyncio.wait(tasks, timeout=grace_seconds)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        with self._lock:
            executor, self._executor, self._closed = self._executor, None, True
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
