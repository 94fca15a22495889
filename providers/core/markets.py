"""Markets: creating a VM Spot first and on-demand after, and what a provider reports of a VM
that may have been lost (preempted, evicted, deleted behind our back)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from providers.core.base import Instance
from providers.core.capacity import ON_DEMAND, SPOT, CapacityType
from providers.core.errors import CapacityError, InvalidRequest

log = logging.getLogger(__name__)


class NoSpotCapacity(CapacityError):
    """Every candidate type and zone refused Spot capacity and the pod accepts nothing else."""


async def create_in_markets(
    what: str,
    capacity: CapacityType,
    create: Callable[[bool], Awaitable[Instance]],
) -> Instance:
    """Run `create(spot)` for each pass of `capacity`; a pass exhausted on capacity moves on.

    `create` walks every candidate type and zone (providers.clouds.retry) and raises CapacityError
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
