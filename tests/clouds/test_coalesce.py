"""Lookups asked for while one cloud call is in flight share the next call."""

from __future__ import annotations

import asyncio

import pytest

from providers.clouds.coalesce import Coalescer


class Cloud:
    """A fetch that records each batch and answers when the test lets it."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.release = asyncio.Event()
        self.fail: set[str] = set()

    async def fetch(self, keys: list[str]) -> dict[str, str]:
        self.batches.append(keys)
        await self.release.wait()
        if self.fail & set(keys):
            raise RuntimeError(f"cloud refused {sorted(self.fail & set(keys))}")
        return {k: k.upper() for k in keys if k != "unknown"}


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_lone_lookup_goes_out_at_once_and_later_ones_share_the_next_call() -> None:
    cloud = Cloud()
    lookups = Coalescer(cloud.fetch, limit=10)
    first = asyncio.create_task(lookups.get("a"))
    await settle()
    assert cloud.batches == [["a"]]  # nothing waited for company
    rest = [asyncio.create_task(lookups.get(k)) for k in ("b", "c", "b", "unknown")]
    await settle()
    assert cloud.batches == [["a"]]  # queued behind the call in flight
    cloud.release.set()
    assert await first == "A"
    assert [await t for t in rest] == ["B", "C", "B", None]
    assert cloud.batches == [["a"], ["b", "c", "unknown"]]
    assert lookups.calls == 2


async def test_a_batch_holds_at_most_limit_keys() -> None:
    cloud = Cloud()
    lookups = Coalescer(cloud.fetch, limit=2)
    tasks = [asyncio.create_task(lookups.get(k)) for k in "abcde"]
    cloud.release.set()
    assert [await t for t in tasks] == list("ABCDE")
    assert cloud.batches == [["a", "b"], ["c", "d"], ["e"]]
    with pytest.raises(ValueError):
        Coalescer(cloud.fetch, limit=0)


async def test_a_failed_call_fails_its_own_batch_only() -> None:
    cloud = Cloud()
    cloud.fail = {"c"}
    lookups = Coalescer(cloud.fetch, limit=2)
    tasks = [asyncio.create_task(lookups.get(k)) for k in "abcde"]
    cloud.release.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert outcomes[:2] == ["A", "B"] and outcomes[4] == "E"
    assert all(isinstance(o, RuntimeError) and "['c']" in str(o) for o in outcomes[2:4])


async def test_a_key_nobody_waits_for_any_more_is_not_asked_for() -> None:
    cloud = Cloud()
    lookups = Coalescer(cloud.fetch, limit=10)
    first = asyncio.create_task(lookups.get("a"))
    await settle()
    dropped = asyncio.create_task(lookups.get("b"))
    kept = asyncio.create_task(lookups.get("c"))
    await settle()
    dropped.cancel()
    cloud.release.set()
    assert (await first, await kept) == ("A", "C")
    with pytest.raises(asyncio.CancelledError):
        await dropped
    assert cloud.batches == [["a"], ["c"]]


async def test_a_cancelled_waiter_leaves_the_others_of_its_call_answered() -> None:
    cloud = Cloud()
    lookups = Coalescer(cloud.fetch, limit=10)
    tasks = [asyncio.create_task(lookups.get(k)) for k in ("a", "a", "b")]
    await settle()
    tasks[0].cancel()
    cloud.release.set()
    assert (await tasks[1], await tasks[2]) == ("A", "B")
    assert cloud.batches == [["a", "b"]]


def test_a_new_event_loop_starts_afresh() -> None:
    cloud = Cloud()
    lookups = Coalescer(cloud.fetch, limit=10)

    async def one(key: str) -> str | None:
        cloud.release = asyncio.Event()
        cloud.release.set()
        return await lookups.get(key)

    assert asyncio.run(one("a")) == "A"
    assert asyncio.run(one("b")) == "B"
    assert cloud.batches == [["a"], ["b"]]
