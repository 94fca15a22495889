"""Capacity fallback and retries, shared by every cloud provider.

A create walks sites in order: for each ranked candidate, each zone it may use. A CapacityError
moves on to the next site; a TransientError (throttling, 5xx) retries the same site after a
jittered exponential backoff; anything else stops at once. The total number of cloud calls is
bounded, and the error the shim finally sees lists every site tried and why it failed, so "no
capacity" is never a mystery.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from providers.core.base import Instance, VMCandidate
from providers.core.errors import CapacityError, InvalidRequest, ProviderError, TransientError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Site:
    """One place a VM may be created: a candidate in a zone ("" lets the cloud choose)."""

    candidate: VMCandidate
    zone: str = ""

    @property
    def instance_type(self) -> str:
        return self.candidate.instance_type

    def __str__(self) -> str:
        return f"{self.candidate} in {self.zone}" if self.zone else str(self.candidate)


@dataclass
class RetryPolicy:
    """Bounds on one create (one market pass): total cloud calls, transient retries per site,
    backoff. `max_attempts` 0 scales with the sites: every candidate in every zone is tried
    once, each with its transient retries, so a pass never stops short of a site it was given."""

    max_attempts: int = 0
    transient_retries: int = 4
    base_delay_seconds: float = 0.5
    max_delay_seconds: float = 8.0
    rng: random.Random = field(default_factory=random.Random)
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def delay(self, retry: int) -> float:
        """Full-jitter backoff: uniform in [0, min(cap, base * 2**retry)]."""
        ceiling = min(self.max_delay_seconds, self.base_delay_seconds * (2**retry))
        return self.rng.uniform(0.0, ceiling)


def sites(candidates: Sequence[VMCandidate], zones: Sequence[str]) -> list[Site]:
    """Zones first, then candidates: every zone of the best candidate before the next one.

    A candidate restricted to some zones (`VMCandidate.zones`) gets only those of `zones` (all of
    its own when the provider names none); one with no usable zone is left out, and an empty
    result is an InvalidRequest.
    """
    if not candidates:
        raise InvalidRequest("no instance type to create: the candidate list is empty")
    zone_list = list(dict.fromkeys(zones)) or [""]
    order: list[Site] = []
    for candidate in dict.fromkeys(candidates):
        allowed = set(candidate.zones)
        if not allowed:
            order += [Site(candidate, z) for z in zone_list]
        elif zone_list == [""]:
            order += [Site(candidate, z) for z in sorted(allowed)]
        else:
            order += [Site(candidate, z) for z in zone_list if z in allowed]
    if not order:
        names = ", ".join(str(c) for c in dict.fromkeys(candidates))
        raise InvalidRequest(f"no configured zone ({', '.join(zone_list)}) can host {names}")
    return order


def budget_for(site_count: int, policy: RetryPolicy) -> int:
    """The cloud calls a pass over `site_count` sites may make when no explicit limit is set."""
    return site_count * (1 + policy.transient_retries)


class FallbackExhausted(CapacityError):
    """Every site failed on capacity (or the attempt budget ran out); lists what was tried."""

    def __init__(self, what: str, tried: list[tuple[Site, str]]) -> None:
        lines = "; ".join(f"{p}: {reason}" for p, reason in tried)
        super().__init__(f"{what}: no capacity after {len(tried)} attempt(s) [{lines}]")
        self.tried = tried


# (provider, reason) of a create that hit capacity or quota and moved on; the adaptor counts them.
CapacityObserver = Callable[[str, str], None]


def _capacity_reason(exc: CapacityError) -> str:
    """A bounded label for a capacity error: its leading error code, else "capacity"."""
    code = str(exc).split(":", 1)[0].strip()
    return code if code.isidentifier() and len(code) <= 48 else "capacity"


async def create_with_fallback(
    what: str,
    order: Sequence[Site],
    attempt: Callable[[Site], Awaitable[Instance]],
    policy: RetryPolicy | None = None,
    provider: str = "",
    on_fallback: CapacityObserver | None = None,
) -> Instance:
    """Run `attempt` over `order` until one site succeeds.

    `what` names the sandbox in messages; `on_fallback` hears (provider, reason) of each site
    that had no capacity. A non-capacity, non-transient ProviderError is raised
    at once, its message extended with the sites already tried.
    """
    policy = policy or RetryPolicy()
    budget = policy.max_attempts or budget_for(len(order), policy)
    tried: list[tuple[Site, str]] = []
    calls = 0
    for site in order:
        retry = 0
        while True:
            if calls >= budget:
                tried.append((site, "attempt budget exhausted"))
                raise FallbackExhausted(what, tried)
            calls += 1
            try:
                return await attempt(site)
            except CapacityError as exc:
                log.info("%s: %s has no capacity: %s", what, site, exc)
                tried.append((site, str(exc)))
                if on_fallback is not None:
                    on_fallback(provider, _capacity_reason(exc))
                break
            except TransientError as exc:
                if retry >= policy.transient_retries:
                    tried.append((site, f"{exc} (gave up after {retry + 1} tries)"))
                    break
                delay = policy.delay(retry)
                log.info("%s: %s transient error, retry in %.2fs: %s", what, site, delay, exc)
                retry += 1
                await policy.sleep(delay)
            except ProviderError as exc:
                tried.append((site, str(exc)))
                if len(tried) == 1:
                    raise
                summary = "; ".join(f"{p}: {r}" for p, r in tried)
                raise ProviderError(f"{what}: {exc} [tried {summary}]") from exc
    raise FallbackExhausted(what, tried)


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
