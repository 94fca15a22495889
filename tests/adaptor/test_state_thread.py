"""The state thread runs calls in their order, answers queued calls together, and keeps each
call's error its own caller's."""

from __future__ import annotations

import asyncio
import threading

import pytest

from adaptor.state.thread import StateThread


async def test_calls_run_in_order_on_one_thread_and_queued_ones_are_answered_together() -> None:
    thread = StateThread(name="test-state")
    gate = threading.Event()
    ran: list[tuple[int, str]] = []

    def job(n: int) -> int:
        if n == 0:
            gate.wait(10)  # the others queue behind this one
        ran.append((n, threading.current_thread().name))
        return n * n

    loop = asyncio.get_running_loop()
    wakeups = 0
    original = loop.call_soon_threadsafe

    def counted(*args: object, **kwargs: object) -> asyncio.Handle:
        nonlocal wakeups
        wakeups += 1
        return original(*args, **kwargs)  # type: ignore[arg-type]

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    try:
        futures = [thread.call(job, n) for n in range(20)]
        gate.set()
        assert await asyncio.gather(*futures) == [n * n for n in range(20)]
    finally:
        loop.call_soon_threadsafe = original  # type: ignore[method-assign]
        await asyncio.to_thread(thread.stop)
    assert [n for n, _ in ran] == list(range(20))
    assert {name for _, name in ran} == {"test-state"}
    assert wakeups < 20  # the 19 that queued behind the first were answered in a few wake-ups


async def test_an_error_is_its_own_callers_and_a_cancelled_call_does_not_run() -> None:
    thread = StateThread()
    gate = threading.Event()
    ran: list[str] = []

    def block() -> None:
        gate.wait(10)

    def record(what: str) -> str:
        ran.append(what)
        return what

    def fail() -> None:
        raise ValueError("refused")

    first = thread.call(block)
    failing = thread.call(fail)
    dropped = thread.call(record, "dropped")
    kept = thread.call(record, "kept")
    dropped.cancel()
    gate.set()
    await first
    with pytest.raises(ValueError, match="refused"):
        await failing
    assert await kept == "kept"
    assert ran == ["kept"]
    await asyncio.to_thread(thread.stop)
    with pytest.raises(RuntimeError, match="stopped"):
        thread.call(record, "late")


async def test_stop_runs_what_is_queued_first() -> None:
    thread = StateThread()
    done: list[int] = []
    futures = [thread.call(done.append, n) for n in range(5)]
    await asyncio.to_thread(thread.stop)
    assert done == list(range(5))
    await asyncio.gather(*futures)
