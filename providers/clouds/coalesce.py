"""Concurrent lookups of one kind merged into one cloud call.

While one call is in flight, the keys asked for meanwhile gather, and go together in the next
call when it returns. Nothing waits for a window: a lone lookup goes out at once. A thousand
sandboxes starting together so ask the cloud a few times instead of a thousand, which bounds
both the adaptor's CPU (an SDK call costs milliseconds of it whatever it carries) and the
account's API rate.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Coalescer(Generic[K, V]):
    """`await get(key)`: what one `fetch` of up to `limit` keys found for `key`, or None."""

    def __init__(self, fetch: Callable[[list[K]], Awaitable[Mapping[K, V]]], limit: int) -> None:
        if limit < 1:
            raise ValueError("a batch holds at least one key")
        self._fetch = fetch
        self._limit = limit
        self._queued: dict[K, list[asyncio.Future[V | None]]] = {}
        self._runner: asyncio.Task[None] | None = None
        self.calls = 0  # fetches made (a figure for tests and benchmarks)

    async def get(self, key: K) -> V | None:
        """What the fetch that carries `key` found for it; its error, where it failed."""
        loop = asyncio.get_running_loop()
        runner = self._runner
        if runner is not None and runner.get_loop() is not loop:
            # a provider used from a new event loop: what the old one left cannot run there
            self._queued.clear()
            runner = None
        future: asyncio.Future[V | None] = loop.create_future()
        self._queued.setdefault(key, []).append(future)
        if runner is None or runner.done():
            self._runner = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        """Fetch what is queued, `limit` keys a call, until nothing is."""
        batch: dict[K, list[asyncio.Future[V | None]]] = {}
        try:
            while self._queued:
                batch = {
                    key: self._queued.pop(key)
                    for key in list(itertools.islice(self._queued, self._limit))
                }
                # keys whose every waiter was cancelled are not asked for
                batch = {k: fs for k, fs in batch.items() if not all(f.done() for f in fs)}
                if not batch:
                    continue
                self.calls += 1
                try:
                    found = await self._fetch(list(batch))
                except Exception as exc:  # every waiter of the batch gets the call's error
                    for futures in batch.values():
                        for future in futures:
                            if not future.done():
                                future.set_exception(exc)
                    continue
                for key, futures in batch.items():
                    for future in futures:
                        if not future.done():
                            future.set_result(found.get(key))
                batch = {}
        finally:
            # cancelled (the loop is closing): nobody is left to answer these waiters
            for futures in itertools.chain(batch.values(), self._queued.values()):
                for future in futures:
                    future.cancel()
            if asyncio.current_task() is self._runner:
                self._queued.clear()
