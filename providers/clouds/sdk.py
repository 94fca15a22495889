"""Where blocking cloud SDK calls run: one thread pool, and the background deletes of failed
creates, both owned by whoever runs the providers (the daemon awaits `shutdown` when it stops).

SDK calls block on the network: a pool of their own, sized for many sandboxes starting at once,
so they neither queue behind nor starve the loop's default executor (files, SQLite).
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

from providers.clouds.retry import RetryPolicy, retry_transient
from providers.core.errors import ProviderError

log = logging.getLogger(__name__)

SDK_THREADS = 32
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()
_background: set[asyncio.Task[None]] = set()


def _sdk_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(SDK_THREADS, thread_name_prefix="peerpods-sdk")
        return _executor


async def sdk_call(
    what: str,
    translate: Callable[[BaseException, str], ProviderError],
    fn: Callable[..., Any],
    /,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Run a blocking SDK call in a thread; its errors come back as this project's ProviderError
    tree (`translate` is the provider's own mapping, the one place SDK errors are read)."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    try:
        return await loop.run_in_executor(_sdk_executor(), call)
    except Exception as exc:
        raise translate(exc, what) from exc


async def discard(what: str, delete: Callable[[], Awaitable[None]], policy: RetryPolicy) -> None:
    """Delete a VM a failed create left behind, even when the create was cancelled.

    Never raises: the VM carries the owner tag from its first moment, so what this cannot delete
    the garbage collector will. The delete runs shielded so a second cancel cannot abandon it;
    `shutdown` waits for it.
    """

    async def run() -> None:
        try:
            await retry_transient(what, delete, policy)
        except ProviderError as exc:
            log.warning("%s: could not delete after a failed create (GC will retry): %s", what, exc)

    task = asyncio.ensure_future(run())
    _background.add(task)
    task.add_done_callback(_background.discard)
    await asyncio.shield(task)


def pending() -> int:
    """Background deletes still running."""
    return len(_background)


async def shutdown(grace_seconds: float) -> None:
    """Wait up to the grace for background deletes, cancel the rest, then stop the pool's
    threads (without waiting for a call stuck in the SDK: its thread ends with the process)."""
    global _executor
    tasks = list(_background)
    if tasks:
        await asyncio.wait(tasks, timeout=grace_seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    with _executor_lock:
        executor, _executor = _executor, None
    if executor is not None:
        executor.shutdown(wait=False, cancel_futures=True)
