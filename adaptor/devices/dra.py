"""DRA-allocated GPUs in the device plan: each allocated device is a slot of the plan, and a
container gets the slots its CDI environment names (adaptor.dra.cdi), so each container has
exactly its claims' GPUs in the pod VM."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from adaptor.devices.plan import DevicePlan
from adaptor.dra.cdi import devices_in_env
from adaptor.dra.vm import dra_slot
from providers.core.contract import ContainerPlan, DeviceUnit
from providers.dra.allocation import AllocatedDevice

__all__ = ["assign_allocated", "devices_from_env"]


def assign_allocated(plan: DevicePlan, devices: Sequence[AllocatedDevice]) -> DevicePlan:
    """The VM's plan with allocated device i as slot `dra:<pool>/<device>` holding GPU i."""
    if not devices:
        return plan
    units = tuple(
        DeviceUnit(id=f"dra-{i}", kind="gpu", count=1, lifetime="pod") for i in range(len(devices))
    )
    slots = {dra_slot(d.pool, d.device): (f"dra-{i}",) for i, d in enumerate(devices)}
    return plan.with_container_plan(ContainerPlan(units=units, containers=slots))


def devices_from_env(plan: DevicePlan, env: Iterable[str]) -> list[str]:
    """The CDI names of the allocated devices a container's environment names."""
    names: list[str] = []
    for pool, device in devices_in_env(env):
        names += [n for n in plan.for_container(dra_slot(pool, device)) if n not in names]
    return names
