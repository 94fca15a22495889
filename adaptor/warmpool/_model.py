"""The warm pools as configured, their slots, and whether a VM spec matches one.

A pool is an instance type in a zone with a size; a slot is one place in a pool, filled by one
VM from its launch to its adoption. Matching is the one rule StartVM and `peerpods plan` share:
the placement's first choice (its best candidate) on demand, from the pool's image, in a zone
the candidate may use.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from adaptor.settings import WarmPoolSettings, parse_pool
from providers.core.base import VMSpec


@dataclass(frozen=True)
class Pool:
    """One pool: `size` stopped VMs of `instance_type` in `zone` ("" before it is resolved)."""

    instance_type: str
    size: int
    zone: str = ""

    @property
    def key(self) -> str:
        return f"{self.instance_type}@{self.zone}" if self.zone else self.instance_type


_DEFAULTS = WarmPoolSettings()


@dataclass(frozen=True)
class WarmConfig:
    """The pools and their caps (from `WarmPoolSettings`)."""

    pools: tuple[Pool, ...] = ()
    max_vms: int = _DEFAULTS.warm_pool_max_vms
    max_cost_per_hour: float = _DEFAULTS.warm_pool_max_cost_per_hour
    images: tuple[str, ...] = ()
    interval_seconds: float = _DEFAULTS.warm_pool_interval_seconds
    ready_timeout_seconds: float = _DEFAULTS.warm_pool_ready_timeout_seconds
    drain_on_exit: bool = False

    @classmethod
    def of(cls, settings: WarmPoolSettings, zones: Sequence[str] = ()) -> WarmConfig:
        """The configuration; a pool without a zone is in the provider's first zone."""
        default_zone = zones[0] if zones else ""
        pools = []
        for text in settings.warm_pools:
            name, size, zone = parse_pool(text)
            pools.append(Pool(name, size, zone or default_zone))
        return cls(
            pools=tuple(pools),
            max_vms=settings.warm_pool_max_vms,
            max_cost_per_hour=settings.warm_pool_max_cost_per_hour,
            images=settings.warm_pool_images,
            interval_seconds=settings.warm_pool_interval_seconds,
            ready_timeout_seconds=settings.warm_pool_ready_timeout_seconds,
            drain_on_exit=settings.warm_pool_drain_on_exit,
        )

    @property
    def poll_seconds(self) -> float:
        """How often a warming VM's power state is asked."""
        return min(2.0, self.interval_seconds / 4)


class SlotState(enum.Enum):
    LAUNCHING = "launching"  # recorded, launched or launching, not yet powered off
    WARM = "warm"  # stopped, ready to adopt
    ADOPTING = "adopting"  # claimed by a sandbox


@dataclass
class Slot:
    """One slot of a pool, as this process knows it."""

    id: str
    pool: Pool
    image: str = ""
    instance_id: str = ""
    state: SlotState = SlotState.LAUNCHING
    since: float = 0.0  # time.time() of its last change

    @staticmethod
    def new_id() -> str:
        return "wp-" + secrets.token_hex(8)


@dataclass(frozen=True)
class Match:
    """Whether a spec would get a warm VM: the pool, or why not."""

    pool: Pool | None = None
    reason: str = ""
    miss: str = field(default="", compare=False)  # the metric's reason label

    def __bool__(self) -> bool:
        return self.pool is not None


def match(
    pools: Sequence[Pool], spec: VMSpec, default_image: str, provider_zones: Sequence[str] = ()
) -> Match:
    """The pool a spec's first candidate would be adopted from, or why none."""
    if spec.capacity_type.wants_spot:
        return Match(reason="Spot VMs are never pooled", miss="spot")
    if not spec.candidates:
        return Match(reason="no instance type chosen", miss="no-pool")
    first = spec.candidates[0]
    if first.accelerator is not None or first.reservation:
        return Match(
            reason=f"{first} is not pooled (attached GPUs or a reservation)", miss="no-pool"
        )
    if spec.image and spec.image != default_image:
        return Match(
            reason=f"the pod asks for image {spec.image}, pools hold {default_image}", miss="image"
        )
    zones = set(first.zones or provider_zones)
    for pool in pools:
        if pool.instance_type == first.instance_type and (
            not zones or not pool.zone or pool.zone in zones
        ):
            return Match(pool)
    return Match(reason=f"no warm pool of {first.instance_type}", miss="no-pool")
