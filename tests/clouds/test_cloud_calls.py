"""The cloud SDK pool is an object's, not the process's: each `CloudCalls` runs its calls on its
own threads, waits for its own background deletes when shut down, and refuses calls after."""

from __future__ import annotations

import asyncio
import threading

import pytest

from providers.clouds.retry import RetryPolicy
from providers.clouds.sdk import CloudCalls
from providers.core.errors import ProviderError


def _translate(exc: BaseException, what: str) -> ProviderError:
    return ProviderError(f"{what}: {exc}")


def _thread() -> tuple[str, int]:
    return threading.current_thread().name, threading.get_ident()


async def test_each_object_runs_its_calls_on_its_own_threads() -> None:
    ours, theirs = CloudCalls(threads=1), CloudCalls(threads=1)
    assert not ours.started and not theirs.started  # no thread before the first call
    first = await ours.call("who", _translate, _thread)
    assert ours.started and not theirs.started
    second = await theirs.call("who", _translate, _thread)
    assert first[0].startswith("peerpods-sdk") and second[0].startswith("peerpods-sdk")
    assert first[1] != second[1]  # two pools, one thread each
    await ours.shutdown(0)
    assert not ours.started
    with pytest.raises(RuntimeError, match="after shutdown"):
        await ours.call("who", _translate, _thread)
    assert await theirs.call("who", _translate, _thread) == second  # the other one still runs
    await theirs.shutdown(0)


async def test_errors_come_back_through_the_providers_mapping() -> None:
    calls = CloudCalls()

    def fail() -> None:
        raise OSError("connection reset")

    with pytest.raises(ProviderError, match="describe: connection reset"):
        await calls.call("describe", _translate, fail)
    await calls.shutdown(0)


async def test_shutdown_waits_for_its_own_background_deletes() -> None:
    calls, other = CloudCalls(), CloudCalls()
    release = asyncio.Event()
    deleted: list[str] = []

    async def delete() -> None:
        await release.wait()
        deleted.append("vm-1")

    create = asyncio.ensure_future(calls.discard("sandbox s: vm-1", delete, RetryPolicy()))
    await asyncio.sleep(0)
    create.cancel()  # the create was cancelled: the delete goes on in the background
    await asyncio.sleep(0)
    assert calls.pending() == 1 and other.pending() == 0
    await other.shutdown(0)  # not its delete: returns at once
    assert calls.pending() == 1
    asyncio.get_running_loop().call_later(0.05, release.set)
    await calls.shutdown(5)
    assert deleted == ["vm-1"] and calls.pending() == 0
