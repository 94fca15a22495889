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

from providers.core.errors import InvalidRequest
from providers.core.settings import csv


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
    return tuple(dict.fromkeys(parse_capacity_type(p, where) for p in csv(value)))
