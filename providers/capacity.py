"""Capacity types (Spot or on-demand) and what a provider reports about a VM that may be lost.

A pod asks for one of three capacity types:

    on-demand          on-demand only; a Spot VM is never created
    spot               Spot only; no Spot capacity in any candidate type and zone is an error
    spot-or-on-demand  every candidate type and zone as Spot first, then all of them on-demand

Spot VMs are created so that a preemption deletes them (AWS: one-time Spot, interruption
behaviour terminate; Azure: eviction policy Delete; GCP: termination action DELETE): a preempted
VM keeps nothing billed. The adaptor still checks, and removes whatever of the VM is left.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from providers.errors import CapacityError, InvalidRequest

if TYPE_CHECKING:  # base imports this module for VMSpec.capacity_type
    from providers.base import Instance

log = logging.getLogger(__name__)


class CapacityType(enum.StrEnum):
    """What a pod may run on: on-demand VMs, Spot VMs, or Spot with on-demand as fallback."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"
    SPOT_OR_ON_DEMAND = "spot-or-on-demand"

    @property
    def markets(self) -> tuple[bool, ...]:
        """The passes a create makes, in order: True for a Spot pass, False for on-demand."""
        if self is CapacityType.SPOT:
            return (True,)
        if self is CapacityType.SPOT_OR_ON_DEMAND:
            return (True, False)
        return (False,)

    @property
    def wants_spot(self) -> bool:
        """Whether Spot prices rank the candidates (the first pass is Spot)."""
        return self.markets[0]


# The capacity type an Instance reports: what the cloud actually gave.
SPOT = "spot"
ON_DEMAND = "on-demand"
# The tag (label on GCP) every pod VM carries with what it was created as.
TAG_CAPACITY_TYPE = "peerpods-capacity-type"
CAPACITY_TYPES = tuple(c.value for c in CapacityType)


def parse_capacity_type(value: str, where: str = "capacity type") -> CapacityType:
    """A capacity type from text; anything but the three names is an InvalidRequest."""
    text = value.strip().lower()
    try:
        return CapacityType(text)
    except ValueError:
        raise InvalidRequest(
            f"{where}: {value[:64]!r} is not a capacity type (want one of "
            f"{', '.join(CAPACITY_TYPES)})"
        ) from None


def parse_capacity_types(value: str, where: str = "capacity types") -> tuple[CapacityType, ...]:
    """A comma-separated list of capacity types (a namespace policy), duplicates dropped."""
    parts = [p for p in (s.strip() for s in value.split(",")) if p]
    return tuple(dict.fromkeys(parse_capacity_type(p, where) for p in parts))


class NoSpotCapacity(CapacityError):
    """Every candidate type and zone refused Spot capacity and the pod accepts nothing else."""


async def create_in_markets(
    what: str,
    capacity: CapacityType,
    create: Callable[[bool], Awaitable[Instance]],
) -> Instance:
    """Run `create(spot)` for each pass of `capacity`; a pass exhausted on capacity moves on.

    `create` walks every candidate type and zone (providers.retry) and raises CapacityError
    only when all of them failed on capacity; any other error ends the create at once.
    """
    failures: list[str] = []
    passes = capacity.markets
    for index, spot in enumerate(passes):
        try:
            return await create(spot)
        except CapacityError as exc:
            market = SPOT if spot else ON_DEMAND
            failures.append(f"{market}: {exc}")
            if index + 1 < len(passes):
                log.info("%s: no %s capacity, falling back to on-demand: %s", what, market, exc)
                continue
            if capacity is CapacityType.SPOT:
                raise NoSpotCapacity(
                    f"{what}: no Spot capacity in any candidate type and zone, and the pod "
                    f"asks for spot only [{exc}]"
                ) from exc
            if len(failures) > 1:
                raise CapacityError(f"{what}: no capacity [{'; '.join(failures)}]") from exc
            raise
    raise InvalidRequest(f"{what}: capacity type {capacity} has no market to try")


@dataclass(frozen=True)
class VMCondition:
    """What the cloud says of a VM a sandbox runs on.

    `alive` is False when the VM no longer exists, or the cloud terminated, stopped or evicted it
    (preemption): the sandbox cannot continue. `reason` is the cloud's own words for that.
    """

    alive: bool
    reason: str = ""


@runtime_checkable
class Inspectable(Protocol):
    """A provider that can tell whether a VM is still there, and remove all that is left of it."""

    async def inspect(self, instance_id: str) -> VMCondition:
        """The VM's condition; a VM the cloud no longer knows is `alive=False`."""
        ...

    async def purge(self, instance: Instance) -> None:
        """Delete the VM and everything created with it (disks, NICs, the VM record)."""
        ...
