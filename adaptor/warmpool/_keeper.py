"""The warm pool keeper: launches, watches, drains and hands out the pools' stopped VMs.

Each pass (at start, every --warm-pool-interval, and at once after an adoption) lists the
pool's VMs first and reads the record after: a pool VM whose slot is not recorded is an orphan
(a crash between a launch and... nothing: slots are recorded before their launch, so it is a
VM of a slot forgotten, or of another pool of this owner's) and is deleted; a slot claimed by a
sandbox that this process did not hand out (a crash during an adoption) has its VM deleted if it
still carries the pool's tags (it may hold the pod's user data; the sandbox's StartVM failed
with the crash), or is forgotten if the sandbox's tags are on it (it is the sandbox's VM now,
for the reaper). Slots of a type no longer configured, allowed, in the catalog, or stoppable
are drained; then each pool is refilled, within the VM cap, the cost cap and the account's
quota, one task per launch, owned and awaited at stop.

A launch is: record the slot, launch the VM with the pool's user data (warmpool.userdata),
wait until the VM has powered itself off (its report: booted, images pulled), make sure it is
stopped (Azure: deallocated), and mark it warm. Any failure deletes the VM and the slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from adaptor.runtime import metrics
from adaptor.runtime.periodic import OwnedTask
from adaptor.warmpool._model import Match, Pool, Slot, SlotState, WarmConfig, match
from adaptor.warmpool._record import Member, PoolRecord
from adaptor.warmpool.userdata import warm_user_data
from providers.core.account_quota import AccountQuotaCache
from providers.core.base import Instance, VMSpec
from providers.core.catalog import Catalog
from providers.core.errors import PeerpodsError
from providers.core.warm import GONE, STOPPED, TAG_WARM_POOL, TAG_WARM_SLOT, WarmCapable, WarmSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sources:
    """What the keeper reads that changes under it: the catalog (reloaded), the account's
    quotas, and the provider's allow list check."""

    catalog: Callable[[], Catalog | None] = lambda: None
    account_quota: Callable[[], AccountQuotaCache | None] = lambda: None
    allowed: Callable[[str], bool] = lambda _name: True


class WarmPool:
    """The node's warm pools over a warm-capable provider and the state store's record."""

    def __init__(
        self,
        provider: WarmCapable,
        record: PoolRecord,
        config: WarmConfig,
        *,
        default_image: str = "",
        zones: tuple[str, ...] = (),
        sources: Sources | None = None,
    ) -> None:
        self.provider = provider
        self.record = record
        self.config = config
        self.default_image = default_image
        self.zones = zones
        self.sources = sources or Sources()
        self.slots: dict[str, Slot] = {}
        self.refused: dict[str, str] = {}  # pool key -> why it is not (fully) filled
        self._said: dict[str, str] = {}  # pool key -> the refusal last logged
        self._loaded = False
        self._wake = asyncio.Event()
        self._pass_lock = asyncio.Lock()
        self._loop_task = OwnedTask("peerpods-warm-pool")
        self._launches: set[asyncio.Task[None]] = set()
        # pool key -> (failed warm-ups in a row, no refill before this time.monotonic())
        self._backoff: dict[str, tuple[int, float]] = {}
        self.passes = 0

    # --- adoption (StartVM) ------------------------------------------------------------------

    def match(self, spec: VMSpec) -> Match:
        """Which pool the spec would be adopted from, or why none."""
        return match(self.config.pools, spec, self.default_image, self.zones)

    async def adopt(self, spec: VMSpec) -> Instance | None:
        """A warm VM made the sandbox's and started, or None (the caller launches cold). Never
        raises for a failed adoption: the VM is deleted and the pod gets a cold VM."""
        found = self.match(spec)
        if found.pool is None:
            metrics.WARM_POOL_MISSES.labels(reason=found.miss).inc()
            return None
        slot = self._take(found.pool)
        if slot is None:
            metrics.WARM_POOL_MISSES.labels(reason="empty").inc()
            self._wake.set()
            return None
        try:
            if not await self.record.claim(slot.id, spec.sandbox_id):
                raise PeerpodsError(f"slot {slot.id} is claimed by another sandbox")
            instance = await self.provider.adopt_warm(slot.instance_id, spec)
        except asyncio.CancelledError:
            await asyncio.shield(self._discard(slot, "adoption cancelled"))
            raise
        except Exception as exc:
            log.warning(
                "sandbox %s: adopting warm VM %s failed, launching cold: %s",
                spec.sandbox_id,
                slot.instance_id,
                exc,
            )
            metrics.WARM_POOL_MISSES.labels(reason="adopt-failed").inc()
            await asyncio.shield(self._discard(slot, "adoption failed"))
            return None
        # out of the record first: while this process holds the slot, a pass never takes its
        # claim for one a crash left behind
        with contextlib.suppress(PeerpodsError):
            await asyncio.shield(self.record.remove(slot.id))
        self.slots.pop(slot.id, None)
        metrics.WARM_POOL_ADOPTIONS.labels(pool=found.pool.key).inc()
        log.info("sandbox %s: adopted warm VM %s (%s)", spec.sandbox_id, instance.id, slot.pool.key)
        self._publish()
        self._wake.set()
        return instance

    def _take(self, pool: Pool) -> Slot | None:
        """A warm slot of the pool, marked adopting (in this process, before any await)."""
        for slot in self.slots.values():
            if slot.pool == pool and slot.state is SlotState.WARM and slot.instance_id:
                slot.state = SlotState.ADOPTING
                slot.since = time.time()
                self._publish()
                return slot
        return None

    async def _discard(self, slot: Slot, why: str) -> None:
        """Delete a slot's VM, then forget the slot (a failed delete leaves it recorded, so the
        next pass deletes the VM as an orphan of a forgotten slot... or retries)."""
        self.slots.pop(slot.id, None)
        try:
            if slot.instance_id:
                await self.provider.delete(slot.instance_id)
            await self.record.remove(slot.id)
        except PeerpodsError as exc:
            log.warning("warm pool: slot %s (%s): delete failed: %s", slot.id, why, exc)
        self._publish()

    # --- the keeper's loop ---------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Keep the pools (first pass at once); the caller owns it through stop()."""
        return self._loop_task.start(self._loop)

    async def stop(self) -> None:
        """End the loop and the launches in flight (their slots stay recorded, their VMs are
        found again by the next start)."""
        await self._loop_task.stop()
        launches = list(self._launches)
        for task in launches:
            task.cancel()
        await asyncio.gather(*launches, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            try:
                await self.keep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a cloud or state error: the next pass tries again
                log.warning("warm pool: pass failed, retried: %s", exc)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.interval_seconds):
                    await self._wake.wait()

    async def keep(self) -> None:
        """One pass: orphans and interrupted adoptions cleaned, pools drained, then refilled."""
        async with self._pass_lock:
            listed_at = time.time()
            vms = await self.provider.warm_vms()
            members = await self.record.members()
            claims = await self.record.claims()
            await self._clean(vms, members, claims)
            await self._forget_gone(vms, listed_at)
            await self._drain_unwanted()
            await self._refill()
            self.passes += 1
            self._publish()

    async def _clean(
        self, vms: list[Instance], members: dict[str, Member], claims: dict[str, str]
    ) -> None:
        by_slot = {vm.tags.get(TAG_WARM_SLOT, ""): vm for vm in vms}
        for vm in vms:
            slot_id = vm.tags.get(TAG_WARM_SLOT, "")
            if vm.tags.get(TAG_WARM_POOL) != self.provider.owner_id:
                continue
            if slot_id not in members and slot_id not in self.slots:
                log.info("warm pool: deleting orphan VM %s (slot %s unknown)", vm.id, slot_id)
                with contextlib.suppress(PeerpodsError):
                    await self.provider.delete(vm.id)
        for slot_id, sandbox_id in claims.items():
            if slot_id in self.slots:
                continue  # an adoption of this process, in flight
            claimed = by_slot.get(slot_id)
            log.warning(
                "warm pool: slot %s was being adopted by sandbox %s when the daemon stopped; %s",
                slot_id,
                sandbox_id,
                f"deleting its VM {claimed.id}"
                if claimed is not None
                else "its VM is the sandbox's now",
            )
            if claimed is not None:
                with contextlib.suppress(PeerpodsError):
                    await self.provider.delete(claimed.id)
            await self.record.remove(slot_id)
            members.pop(slot_id, None)
        if not self._loaded:
            self._load(members, by_slot)
            self._loaded = True

    async def _forget_gone(self, vms: list[Instance], listed_at: float) -> None:
        """Forget the warm slots whose VM the listing no longer shows (deleted by
        `peerpods warm-pool drain` or by hand), so the refill replaces them instead of an
        adoption failing on them first. Only slots warm before the listing was asked for: one
        that warmed since may be missing from it."""
        listed = {vm.id for vm in vms if vm.extra.get("power") != GONE}
        for slot in list(self.slots.values()):
            if (
                slot.state is SlotState.WARM
                and slot.since < listed_at
                and slot.instance_id not in listed
            ):
                log.info("warm pool: slot %s: its VM %s is gone", slot.id, slot.instance_id)
                self.slots.pop(slot.id, None)
                await self.record.remove(slot.id)

    def _load(self, members: dict[str, Member], by_slot: dict[str, Instance]) -> None:
        """The slots a previous process recorded: warm when their VM is stopped, else watched
        (or launched again: the launch of a slot is idempotent) until it is."""
        for slot_id, member in members.items():
            pool = Pool(member.instance_type, 0, member.zone)
            pool = next((p for p in self.config.pools if _same(p, pool)), pool)
            vm = by_slot.get(slot_id)
            slot = Slot(slot_id, pool, member.image, vm.id if vm else "", since=time.time())
            self.slots[slot_id] = slot
            if vm is not None and vm.extra.get("power") == STOPPED:
                slot.state = SlotState.WARM
            elif self._wanted(pool) == "":
                self._spawn(slot)
            log.info("warm pool: slot %s (%s) found %s", slot_id, pool.key, slot.state.value)

    def _wanted(self, pool: Pool) -> str:
        """Why a pool's VMs are not wanted ("" when they are)."""
        if not any(_same(p, pool) for p in self.config.pools):
            return f"{pool.key} is no longer configured"
        if not self.sources.allowed(pool.instance_type):
            return f"{pool.instance_type} is not in the allowed instance types"
        catalog = self.sources.catalog()
        if catalog is not None and pool.instance_type not in catalog.by_name():
            return f"{pool.instance_type} is not in the {catalog.cloud} {catalog.region} catalog"
        return self.provider.cannot_stop(pool.instance_type)

    async def _drain_unwanted(self) -> None:
        for slot in list(self.slots.values()):
            if slot.state is SlotState.ADOPTING:
                continue
            why = self._wanted(slot.pool)
            if not why:
                why = self._surplus(slot)
            if why:
                log.info("warm pool: draining slot %s (%s): %s", slot.id, slot.instance_id, why)
                await self._discard(slot, why)

    def _surplus(self, slot: Slot) -> str:
        """Why a warm slot is one too many for its (shrunk) pool."""
        if slot.state is not SlotState.WARM:
            return ""
        held = [
            s
            for s in self.slots.values()
            if s.pool == slot.pool and s.state is not SlotState.ADOPTING
        ]
        if len(held) > slot.pool.size and held[-1] is slot:
            return f"{slot.pool.key} holds more than its {slot.pool.size}"
        return ""

    async def drain(self) -> None:
        """Delete every pool VM and forget every slot (an uninstall: --warm-pool-drain-on-exit)."""
        await self.stop()
        async with self._pass_lock:
            for slot in list(self.slots.values()):
                await self._discard(slot, "drained")
            for vm in await self.provider.warm_vms():
                if vm.tags.get(TAG_WARM_POOL) == self.provider.owner_id:
                    with contextlib.suppress(PeerpodsError):
                        await self.provider.delete(vm.id)
            for slot_id in await self.record.members():
                await self.record.remove(slot_id)
            self._publish()

    # --- refill ----------------------------------------------------------------------------------

    def cost_per_hour(self) -> float:
        """What the pools' VMs bill while stopped."""
        return sum(
            self.provider.stopped_cost_per_hour(s.pool.instance_type) for s in self.slots.values()
        )

    async def _refill(self) -> None:
        self.refused.clear()
        for pool in self.config.pools:
            why = self._wanted(pool) or self._waiting(pool)
            if why:
                self.refused[pool.key] = why
                continue
            held = sum(
                1
                for s in self.slots.values()
                if s.pool == pool and s.state is not SlotState.ADOPTING
            )
            for _ in range(pool.size - held):
                why = await self._over_caps(pool)
                if why:
                    if self._said.get(pool.key) != why:  # once per reason, not every pass
                        log.info("warm pool: %s not refilled: %s", pool.key, why)
                    self.refused[pool.key] = self._said[pool.key] = why
                    break
                slot = Slot(Slot.new_id(), pool, self.default_image, since=time.time())
                member = Member(pool.instance_type, pool.zone, slot.image)
                await self.record.add(slot.id, member)  # before the launch: never an orphan
                self.slots[slot.id] = slot
                self._spawn(slot)

    def _waiting(self, pool: Pool) -> str:
        """Why a pool whose warm-ups failed is not refilled yet ("" when it may be)."""
        failures, until = self._backoff.get(pool.key, (0, 0.0))
        left = until - time.monotonic()
        return f"{failures} warm-up(s) failed; next try in {left:.0f}s" if left > 0 else ""

    def _failed(self, pool: Pool) -> None:
        """Back off a pool's refill: the interval, doubled at each failure in a row (at most
        32 times)."""
        failures = self._backoff.get(pool.key, (0, 0.0))[0] + 1
        pause = self.config.interval_seconds * 2 ** min(failures, 5)
        self._backoff[pool.key] = (failures, time.monotonic() + pause)

    async def _over_caps(self, pool: Pool) -> str:
        """Why one more VM of `pool` may not be launched ("" when it may)."""
        if len(self.slots) >= self.config.max_vms:
            return f"the warm pools hold {len(self.slots)} VMs, the cap (--warm-pool-max-vms)"
        cost = self.cost_per_hour() + self.provider.stopped_cost_per_hour(pool.instance_type)
        if cost > self.config.max_cost_per_hour:
            return (
                f"${cost:.2f}/h would exceed the cap of ${self.config.max_cost_per_hour:.2f}/h "
                "(--warm-pool-max-cost-per-hour)"
            )
        cache = self.sources.account_quota()
        catalog = self.sources.catalog()
        if cache is None or catalog is None:
            return ""
        account = await cache.get()
        known = catalog.by_name().get(pool.instance_type)
        if account is None or known is None:
            return ""
        launching = [
            catalog.by_name()[s.pool.instance_type]
            for s in self.slots.values()
            if s.state is SlotState.LAUNCHING and s.pool.instance_type in catalog.by_name()
        ]
        return account.over(known, False, None, [(t, False, None) for t in launching])

    def _spawn(self, slot: Slot) -> None:
        task = asyncio.get_running_loop().create_task(self._warm_up(slot), name=f"warm-{slot.id}")
        self._launches.add(task)
        task.add_done_callback(self._launches.discard)

    async def _warm_up(self, slot: Slot) -> None:
        """Launch the slot's VM (or find it), wait for its power-off, make sure it is stopped."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.config.ready_timeout_seconds):
                if not slot.instance_id:
                    spec = WarmSpec(
                        slot.id,
                        slot.pool.instance_type,
                        slot.pool.zone,
                        slot.image,
                        warm_user_data(self.config.images),
                    )
                    slot.instance_id = (await self.provider.launch_warm(spec)).id
                    log.info("warm pool: slot %s launched %s", slot.id, slot.instance_id)
                while (power := await self.provider.power_state(slot.instance_id)) != STOPPED:
                    if power == GONE:
                        raise PeerpodsError(f"warm VM {slot.instance_id} is gone")
                    await asyncio.sleep(self.config.poll_seconds)
            await self.provider.stop_warm(slot.instance_id)
        except asyncio.CancelledError:
            raise  # stop(): the slot stays recorded, the next start watches it again
        except (PeerpodsError, TimeoutError) as exc:
            log.warning(
                "warm pool: slot %s (%s) failed: %s", slot.id, slot.pool.key, exc or "timeout"
            )
            self._failed(slot.pool)
            await self._discard(slot, "warm-up failed")
            return
        self._backoff.pop(slot.pool.key, None)
        slot.state = SlotState.WARM
        slot.since = time.time()
        metrics.WARM_POOL_REFILL_SECONDS.observe(time.monotonic() - started)
        log.info("warm pool: slot %s warm (%s, %s)", slot.id, slot.pool.key, slot.instance_id)
        self._publish()

    # --- what it shows ---------------------------------------------------------------------------

    def _publish(self) -> None:
        for pool in self.config.pools:
            for state in SlotState:
                count = sum(1 for s in self.slots.values() if s.pool == pool and s.state is state)
                metrics.WARM_POOL_SIZE.labels(pool=pool.key, state=state.value).set(count)
        metrics.WARM_POOL_COST_PER_HOUR.set(self.cost_per_hour())

    def snapshot(self) -> dict[str, object]:
        """What the status API lists: each pool, each VM, the cost and the caps."""
        pools = []
        for pool in self.config.pools:
            mine = [s for s in self.slots.values() if s.pool == pool]
            pools.append(
                {
                    "pool": pool.key,
                    "instance_type": pool.instance_type,
                    "zone": pool.zone,
                    "size": pool.size,
                    **{state.value: sum(s.state is state for s in mine) for state in SlotState},
                    "not_filled": self.refused.get(pool.key, ""),
                }
            )
        return {
            "pools": pools,
            "vms": [
                {
                    "slot": s.id,
                    "pool": s.pool.key,
                    "vm_id": s.instance_id,
                    "state": s.state.value,
                    "since": s.since,
                }
                for s in self.slots.values()
            ],
            "cost_per_hour": round(self.cost_per_hour(), 4),
            "max_cost_per_hour": self.config.max_cost_per_hour,
            "max_vms": self.config.max_vms,
            "images": list(self.config.images),
        }


def _same(a: Pool, b: Pool) -> bool:
    return a.instance_type == b.instance_type and a.zone == b.zone
