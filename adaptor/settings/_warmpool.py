"""The warm pool's settings: which stopped VMs wait for pods, and what they may cost."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

from providers.core.settings import Flag, Section, listed

# TYPE=N[@ZONE]: an instance type, how many, and the zone (empty: the provider's first).
_POOL = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)=(\d+)(?:@([A-Za-z0-9-]+))?$", re.ASCII)
MAX_POOL_SIZE = 100


def parse_pool(text: str) -> tuple[str, int, str]:
    """(type, size, zone) of one `TYPE=N[@ZONE]`; ValueError says what is wrong."""
    match = _POOL.fullmatch(text.strip())
    if not match:
        raise ValueError(f"invalid warm pool {text!r} (write TYPE=N or TYPE=N@ZONE)")
    name, size, zone = match.group(1), int(match.group(2)), match.group(3) or ""
    if size > MAX_POOL_SIZE:
        raise ValueError(f"warm pool {text!r}: at most {MAX_POOL_SIZE} VMs per pool")
    return name, size, zone


def _pools(value: tuple[str, ...]) -> tuple[str, ...]:
    seen: set[tuple[str, str]] = set()
    for item in value:
        name, _, zone = parse_pool(item)
        if (name, zone) in seen:
            raise ValueError(f"warm pool {name}@{zone or '(default zone)'} is given twice")
        seen.add((name, zone))
    return value


def _images(value: tuple[str, ...]) -> tuple[str, ...]:
    """The images as a warm VM's request carries them (adaptor.podvm.warmrequest), checked here
    so that a bad name stops `serve` at start, not each refill."""
    from adaptor.podvm.warmrequest import check_images

    return check_images(value)


# A list of pools, `TYPE=N[@ZONE]` each (a field adds its own Flag).
WarmPoolList = Annotated[tuple[str, ...], BeforeValidator(listed), AfterValidator(_pools)]


class WarmPoolSettings(Section):
    """Stopped VMs kept ready per instance type and zone (docs/warm-pools.md)."""

    warm_pools: Annotated[
        WarmPoolList, Flag("--warm-pool", metavar="TYPE=N[@ZONE]", repeated=True)
    ] = Field(
        (),
        description="keep N stopped VMs of instance type TYPE (in ZONE; default: the provider's "
        "first zone) ready for pods that would get that type; repeat the flag, or separate "
        "pools by commas (empty: no warm pool)",
    )
    warm_pool_max_vms: Annotated[int, Flag("--warm-pool-max-vms")] = Field(
        20, ge=0, description="the most VMs all warm pools hold together, launching ones included"
    )
    warm_pool_max_cost_per_hour: Annotated[float, Flag("--warm-pool-max-cost-per-hour")] = Field(
        5.0,
        ge=0,
        description="the most, in USD per hour, that the stopped VMs of all warm pools may bill "
        "together (their disks: the provider's $/GB-month of the root volume); a refill that "
        "would exceed it is not made",
    )
    warm_pool_images: Annotated[
        tuple[str, ...],
        Flag("--warm-pool-image", repeated=True),
        BeforeValidator(listed),
        AfterValidator(_images),
    ] = Field(
        (),
        description="container images a warm VM pulls before it stops, so a pod's pull finds "
        "them on the VM's disk; repeat the flag, or separate images by commas",
    )
    warm_pool_interval_seconds: Annotated[float, Flag("--warm-pool-interval", duration=True)] = (
        Field(30.0, gt=0, description="how often the warm pools are checked and refilled")
    )
    warm_pool_ready_timeout_seconds: Annotated[
        float, Flag("--warm-pool-ready-timeout", duration=True)
    ] = Field(
        1800.0,
        gt=0,
        description="how long a new warm VM may take to boot, pull its images and power itself "
        "off (its report of readiness); one that takes longer is deleted",
    )
    warm_pool_drain_on_exit: Annotated[bool, Flag("--warm-pool-drain-on-exit")] = Field(
        False,
        description="delete every warm VM when serve stops (an uninstall); without it a restart "
        "or an upgrade keeps the pools",
    )
