"""The pools' VMs as the cloud account holds them, for `peerpods warm-pool list` and `drain`.

It reads the account, not a node's state store: an uninstall runs it from anywhere with the
cloud's credentials, after the adaptors are gone. Each owner's VMs are what its provider's own
warm pool listing finds (the pool tag naming that owner); a VM that also carries a sandbox tag
was adopted (or is being adopted) by a pod and is never drained: it is the sandbox's, deleted
by its StopVM or the reaper. A drain lists the account twice, once to choose and once right
before deleting, and deletes only what both listings show as an unadopted pool VM, so a VM
that a running serve adopted meanwhile is left to its pod.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime

from providers.core.base import TAG_SANDBOX, Instance
from providers.core.errors import PeerpodsError
from providers.core.warm import TAG_WARM_POOL, TAG_WARM_SLOT, WarmCapable, power_of

# Deletes in flight at once (each waits for the cloud to accept it).
DELETES_AT_ONCE = 8


@dataclass(frozen=True)
class PoolVM:
    """One pool VM in the account: whose, which slot, what and where, its power state."""

    owner: str
    slot: str
    vm_id: str
    instance_type: str
    zone: str
    state: str
    created: str = ""  # the cloud's timestamp (AWS: the last launch or start), "" unknown
    sandbox: str = ""  # the sandbox that adopted it ("" for a pool VM waiting)

    @classmethod
    def of(cls, owner: str, vm: Instance) -> PoolVM:
        return cls(
            owner=owner,
            slot=vm.tags.get(TAG_WARM_SLOT, ""),
            vm_id=vm.id,
            instance_type=vm.instance_type,
            zone=vm.zone,
            state=power_of(vm),
            created=str(vm.extra.get("created", "")),
            sandbox=vm.tags.get(TAG_SANDBOX, ""),
        )

    def age_seconds(self, now: float | None = None) -> float | None:
        """Seconds since `created` (None when the cloud gave no time it can be read from)."""
        if not self.created:
            return None
        try:
            stamp = datetime.fromisoformat(self.created.replace("Z", "+00:00"))
        except ValueError:
            return None
        if stamp.tzinfo is None:
            return None
        return max(0.0, (time.time() if now is None else now) - stamp.timestamp())

    def as_json(self, now: float | None = None) -> dict[str, object]:
        age = self.age_seconds(now)
        return {**asdict(self), "age_seconds": None if age is None else round(age)}


@dataclass
class DrainReport:
    """What a drain deleted, left alone (and why), and could not delete."""

    deleted: list[PoolVM] = field(default_factory=list)
    kept: list[tuple[PoolVM, str]] = field(default_factory=list)
    failed: list[tuple[PoolVM, str]] = field(default_factory=list)


async def pool_vms(providers: Sequence[WarmCapable]) -> list[PoolVM]:
    """Every pool VM of each provider's owner, in owner, type, zone and slot order."""
    listed = await asyncio.gather(*(p.warm_vms() for p in providers))
    found = [
        PoolVM.of(p.owner_id, vm)
        for p, vms in zip(providers, listed, strict=True)
        for vm in vms
        if vm.tags.get(TAG_WARM_POOL) == p.owner_id
    ]
    return sorted(found, key=lambda v: (v.owner, v.instance_type, v.zone, v.slot, v.vm_id))


def chosen(vms: Sequence[PoolVM], instance_type: str = "", zone: str = "") -> list[PoolVM]:
    """The VMs of this type and zone (either "" for any)."""
    return [
        vm
        for vm in vms
        if (not instance_type or vm.instance_type == instance_type)
        and (not zone or vm.zone == zone)
    ]


async def drain(
    providers: Sequence[WarmCapable],
    instance_type: str = "",
    zone: str = "",
    *,
    dry_run: bool = False,
) -> DrainReport:
    """Delete the owners' unadopted pool VMs of the type and zone; with `dry_run`, only say
    which (`deleted` then lists what a drain would delete)."""
    report = DrainReport()
    wanted: list[PoolVM] = []
    for vm in chosen(await pool_vms(providers), instance_type, zone):
        if vm.sandbox:
            report.kept.append((vm, f"adopted by sandbox {vm.sandbox}"))
        else:
            wanted.append(vm)
    if dry_run or not wanted:
        report.deleted = wanted
        return report
    # the second look: a VM adopted since the first is the sandbox's now
    again = {(vm.owner, vm.vm_id): vm for vm in await pool_vms(providers)}
    by_owner = {p.owner_id: p for p in providers}
    doing = asyncio.Semaphore(DELETES_AT_ONCE)

    async def delete(vm: PoolVM) -> None:
        now = again.get((vm.owner, vm.vm_id))
        if now is None:
            return  # gone meanwhile (a running serve's adoption or drain, or by hand)
        if now.sandbox:
            report.kept.append((now, f"adopted by sandbox {now.sandbox}"))
            return
        async with doing:
            try:
                await by_owner[vm.owner].delete(vm.vm_id)
            except PeerpodsError as exc:
                report.failed.append((vm, str(exc)))
            else:
                report.deleted.append(vm)

    await asyncio.gather(*(delete(vm) for vm in wanted))
    return report
