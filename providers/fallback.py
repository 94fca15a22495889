"""Capacity fallback and retries, shared by every cloud provider.

A create walks placements in order: for each ranked candidate type, each zone. A CapacityError
moves on to the next placement; a TransientError (throttling, 5xx) retries the same placement
after a jittered exponential backoff; anything else stops at once. The total number of cloud
calls is bounded, and the error the shim finally sees lists every placement tried and why it
failed, so "no capacity" is never a mystery.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import functools
import hashlib
import logging
import os
import random
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from providers.base import Instance
from providers.errors import CapacityError, InvalidRequest, ProviderError, TransientError

log = logging.getLogger(__name__)

# Maps a created VM to the address the adaptor dials (tests point every VM at 127.0.0.1).
Resolver = Callable[[Instance], Instance]


def identity(instance: Instance) -> Instance:
    """The default resolver: dial the VM's own addresses."""
    return instance


@dataclass(frozen=True)
class Placement:
    """One place a VM may be created: an instance type in a zone ("" lets the cloud choose)."""

    instance_type: str
    zone: str = ""

    def __str__(self) -> str:
        return f"{self.instance_type} in {self.zone}" if self.zone else self.instance_type


@dataclass
class RetryPolicy:
    """Bounds on one create: total cloud calls, transient retries per placement, backoff."""

    max_attempts: int = 16
    transient_retries: int = 4
    base_delay_seconds: float = 0.5
    max_delay_seconds: float = 8.0
    rng: random.Random = field(default_factory=random.Random)
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def delay(self, retry: int) -> float:
        """Full-jitter backoff: uniform in [0, min(cap, base * 2**retry)]."""
        ceiling = min(self.max_delay_seconds, self.base_delay_seconds * (2**retry))
        return self.rng.uniform(0.0, ceiling)


def placements(
    candidates: Sequence[str],
    zones: Sequence[str],
    only: Mapping[str, Sequence[str]] | None = None,
) -> list[Placement]:
    """Zones first, then candidates: every zone of the best type before the next type.

    `only` narrows a candidate to the zones that can host it (VMSpec.zones); a candidate with no
    allowed zone among `zones` is left out, and an empty result is an InvalidRequest.
    """
    if not candidates:
        raise InvalidRequest("no instance type to create: the candidate list is empty")
    zone_list = list(dict.fromkeys(zones)) or [""]
    seen: dict[str, None] = dict.fromkeys(c for c in candidates if c)
    order: list[Placement] = []
    for name in seen:
        allowed = set((only or {}).get(name, ()))
        if not allowed:
            order += [Placement(name, z) for z in zone_list]
        elif zone_list == [""]:
            order += [Placement(name, z) for z in sorted(allowed)]
        else:
            order += [Placement(name, z) for z in zone_list if z in allowed]
    if not order:
        raise InvalidRequest(
            f"no configured zone ({', '.join(zone_list)}) can host {', '.join(seen)}"
        )
    return order


class FallbackExhausted(CapacityError):
    """Every placement failed on capacity (or the attempt budget ran out); lists what was tried."""

    def __init__(self, what: str, tried: list[tuple[Placement, str]]) -> None:
        lines = "; ".join(f"{p}: {reason}" for p, reason in tried)
        super().__init__(f"{what}: no capacity after {len(tried)} attempt(s) [{lines}]")
        self.tried = tried


# (provider, reason) of a create that hit capacity or quota and moved on; the adaptor counts them.
CapacityObserver = Callable[[str, str], None]
_capacity_observers: list[CapacityObserver] = []


def observe_capacity_fallbacks(observer: CapacityObserver) -> Callable[[], None]:
    """Call `observer` on every capacity fallback; returns the function that stops it."""
    _capacity_observers.append(observer)
    return lambda: _capacity_observers.remove(observer)


def _capacity_reason(exc: CapacityError) -> str:
    """A bounded label for a capacity error: its leading error code, else "capacity"."""
    code = str(exc).split(":", 1)[0].strip()
    return code if code.isidentifier() and len(code) <= 48 else "capacity"


async def create_with_fallback(
    what: str,
    order: Sequence[Placement],
    attempt: Callable[[Placement], Awaitable[Instance]],
    policy: RetryPolicy | None = None,
    provider: str = "",
) -> Instance:
    """Run `attempt` over `order` until one placement succeeds.

    `what` names the sandbox in messages. A non-capacity, non-transient ProviderError is raised
    at once, its message extended with the placements already tried.
    """
    policy = policy or RetryPolicy()
    tried: list[tuple[Placement, str]] = []
    calls = 0
    for placement in order:
        retry = 0
        while True:
            if calls >= policy.max_attempts:
                tried.append((placement, "attempt budget exhausted"))
                raise FallbackExhausted(what, tried)
            calls += 1
            try:
                return await attempt(placement)
            except CapacityError as exc:
                log.info("%s: %s has no capacity: %s", what, placement, exc)
                tried.append((placement, str(exc)))
                for observer in list(_capacity_observers):
                    observer(provider, _capacity_reason(exc))
                break
            except TransientError as exc:
                if retry >= policy.transient_retries:
                    tried.append((placement, f"{exc} (gave up after {retry + 1} tries)"))
                    break
                delay = policy.delay(retry)
                log.info("%s: %s transient error, retry in %.2fs: %s", what, placement, delay, exc)
                retry += 1
                await policy.sleep(delay)
            except ProviderError as exc:
                tried.append((placement, str(exc)))
                if len(tried) == 1:
                    raise
                summary = "; ".join(f"{p}: {r}" for p, r in tried)
                raise ProviderError(f"{what}: {exc} [tried {summary}]") from exc
    raise FallbackExhausted(what, tried)


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


# Cloud SDK calls block on the network: a pool of their own, sized for many sandboxes starting at
# once, so they neither queue behind nor starve the loop's default executor (files, SQLite).
SDK_THREADS = 32
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _sdk_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(SDK_THREADS, thread_name_prefix="peerpods-sdk")
        return _executor


async def retry_transient(
    what: str,
    call: Callable[[], Awaitable[None]],
    policy: RetryPolicy | None = None,
) -> None:
    """Run one idempotent call (a delete), retrying TransientError with backoff."""
    policy = policy or RetryPolicy()
    for retry in range(policy.transient_retries + 1):
        try:
            await call()
            return
        except TransientError as exc:
            if retry >= policy.transient_retries:
                raise TransientError(f"{what}: {exc} (gave up after {retry + 1} tries)") from exc
            await policy.sleep(policy.delay(retry))


_background: set[asyncio.Task[None]] = set()


async def discard(what: str, delete: Callable[[], Awaitable[None]], policy: RetryPolicy) -> None:
    """Delete a VM a failed create left behind, even when the create was cancelled.

    Never raises: the VM carries the owner tag from its first moment, so what this cannot delete
    the garbage collector will. The delete runs shielded so a second cancel cannot abandon it.
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


def sandbox_hash(sandbox_id: str, length: int = 16) -> str:
    """A short, stable, lowercase name part for a sandbox (deterministic VM names)."""
    return hashlib.sha256(sandbox_id.encode()).hexdigest()[:length]


def csv(text: str) -> tuple[str, ...]:
    """A comma-separated flag value as a tuple, blanks dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def add_flag(parser: argparse.ArgumentParser, flag: str, default: str, help: str) -> None:
    """A string flag with its env twin (PEERPODS_<FLAG>), the convention of adaptor.cli.flags.

    Kept here because providers never import the adaptor; a flag already added is left alone.
    """
    if flag in parser._option_string_actions:
        return
    env = "PEERPODS_" + flag.lstrip("-").upper().replace("-", "_")
    value = os.environ.get(env, default)
    shown = f" (default: {default})" if default else ""
    parser.add_argument(flag, default=value, help=f"{help}{shown} [env {env}]")


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """Flags every cloud provider shares (CAA names); safe to call once per provider."""
    add_flag(parser, "--instance-type", default="", help="instance type when selection gives none")
    add_flag(
        parser,
        "--allowed-instance-types",
        default="",
        help="comma-separated instance types pod VMs may use (empty: any)",
    )
    add_flag(
        parser, "--pod-vm-image", default="", help="pod VM image (a pod annotation may override)"
    )


def choose_candidates(
    candidates: Sequence[str], default: str, allowed: Sequence[str]
) -> tuple[str, ...]:
    """The ranked candidates narrowed to the allowed list, or the default type when none given."""
    chosen = tuple(candidates) or ((default,) if default else ())
    if allowed:
        allow = set(allowed)
        narrowed = tuple(c for c in chosen if c in allow)
        if chosen and not narrowed:
            raise InvalidRequest(
                f"none of the candidate types {', '.join(chosen)} is in --allowed-instance-types"
            )
        chosen = narrowed
    if not chosen:
        raise InvalidRequest("no instance type: selection gave none and --instance-type is unset")
    return chosen
