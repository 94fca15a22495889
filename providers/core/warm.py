"""Warm pool VMs: what a provider does so a stopped VM can stand ready for a pod.

A warm VM is launched with the pool's tags (never a sandbox's, so the orphan collector and the
reaper, which act on sandbox tags, never take one for a sandbox's VM), boots once, pulls the
pool's images and powers itself off: that power-off is its report of readiness. The provider
then makes sure it is stopped (Azure: deallocated, so the compute stops billing). StartVM adopts
one by rewriting its user data while stopped, moving it from the pool's tags to the sandbox's,
and starting it.

Providers that can do this implement `WarmCapable`; the others have no warm pool.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from providers.core.base import Instance, VMSpec

# The pool's tags: the owner id of the node whose pool holds the VM, and the slot it fills.
TAG_WARM_POOL = "peerpods-warm-pool"
TAG_WARM_SLOT = "peerpods-warm-slot"
# A month as cloud price pages count it (730 hours), to turn $/GB-month into $/hour.
HOURS_PER_MONTH = 730.0

# What a warm VM's power state is, as every provider reports it.
PENDING = "pending"  # launched or starting, not yet booted
RUNNING = "running"  # booted (a warm VM still pulling its images)
STOPPED = "stopped"  # powered off (AWS stopped, Azure deallocated, GCP terminated/suspended)
STOPPING = "stopping"
GONE = "gone"  # deleted, or the cloud knows no such VM


@dataclass(frozen=True)
class WarmSpec:
    """One warm VM to launch: its slot (its identity across restarts: a retried launch of a
    slot finds the VM instead of making a second), where, from which image, with which user
    data (the pool's, not a pod's)."""

    slot: str
    instance_type: str
    zone: str = ""
    image: str = ""
    user_data: str = ""


def slot_token(slot: str) -> str:
    """An idempotency token for a slot's launch (AWS ClientToken: 64 ASCII characters)."""
    return "pw-" + hashlib.sha256(slot.encode()).hexdigest()[:60]


def power_of(instance: Instance) -> str:
    """The power state a provider put in the instance's `extra["power"]`."""
    return str(instance.extra.get("power", ""))


def disk_cost_per_hour(gib: float, usd_per_gb_month: float) -> float:
    """What a stopped VM's disk bills per hour."""
    return gib * usd_per_gb_month / HOURS_PER_MONTH


@runtime_checkable
class WarmCapable(Protocol):
    """What a provider offers for warm pools (AWS, Azure, GCP)."""

    name: str
    owner_id: str

    def cannot_stop(self, instance_type: str) -> str:
        """Why VMs of this type cannot wait stopped in a pool ("" when they can)."""
        ...

    def stopped_cost_per_hour(self, instance_type: str) -> float:
        """What one stopped VM of this type still bills per hour (its disk), in USD."""
        ...

    async def launch_warm(self, spec: WarmSpec) -> Instance:
        """Launch (or find, for a slot launched before) the slot's VM; returns once the cloud
        accepted it, not once it booted."""
        ...

    async def warm_vms(self) -> list[Instance]:
        """Every live VM carrying this owner's pool tag, with `extra["power"]` set."""
        ...

    async def power_state(self, instance_id: str) -> str:
        """One of PENDING, RUNNING, STOPPING, STOPPED, GONE."""
        ...

    async def stop_warm(self, instance_id: str) -> None:
        """Stop (Azure: deallocate) the VM and return once the cloud says it is stopped."""
        ...

    async def adopt_warm(
        self, instance_id: str, spec: VMSpec, tags: Mapping[str, str] | None = None
    ) -> Instance:
        """The stopped warm VM made the sandbox's: user data rewritten, tags moved from the
        pool's to the sandbox's (before it starts, so from then on it is the sandbox's VM to
        every sweep), started; returns it running, as `create` would."""
        ...

    async def delete(self, instance_id: str) -> None:
        """Delete the VM (as `Provider.delete`)."""
        ...
