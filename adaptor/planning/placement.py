"""Where a sandbox goes and what its containers get: the typed StartVM plan.

`Placement.plan(intent, sandbox_id)` is StartVM's one decision: selection over the provider's
catalog (the bundled snapshot of its region), with the allow list (globs) and zones the provider
declares applied once, here; the GPU quota pool's reservation (`--gpu-quota`), if any; and, per
candidate, what the VM will carry, from which the device plan follows. The result is a `Plan`:
typed candidates (instance type, zones, attached accelerator and count, price) that go to the
provider as `VMCandidate`s, and the device plan of whichever candidate the VM lands on (stored
with the sandbox so a restarted daemon rewrites CreateContainer the same way).

Providers without a catalog (static, local) have no selection: the explicit machine_type (else
the provider's default type), if any, is the one candidate, and devices are sized from the
intent alone. `release` forgets the sandbox's quota reservation when its StartVM fails or it
stops; once its VM exists, the pool counts its instance type from the state store.
"""

from __future__ import annotations

import fnmatch
import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from adaptor.devices import CdiNaming, DevicePlan, plan_devices
from adaptor.runtime import metrics
from adaptor.state import StateStore
from providers.core.account_quota import AccountQuotaCache
from providers.core.base import Accelerator, Instance, Provider, VMCandidate, VMSpec
from providers.core.catalog import Catalog, GpuSpec, InstanceType
from providers.core.contract import VMIntent
from providers.core.errors import InvalidRequest, NoMatch
from providers.core.gpus import resolve_gpu
from providers.core.mig import min_gpus
from providers.core.quota import Demand, Holdings, QuotaPool, demand_of_type, parse_quota
from providers.core.selection import Candidate, Selection, Selector

log = logging.getLogger(__name__)

MAX_CANDIDATES = 8
# Candidate lists a placement keeps, by request (pods mostly ask for one of a few shapes); the
# memo starts afresh when full.
CANDIDATE_MEMO_SIZE = 256

# What a VM will carry: its catalog entry (attached GPUs folded in) or (GPU count, GPU model id).
Inventory = InstanceType | tuple[int, str]


@dataclass(frozen=True)
class PlanCandidate:
    """One candidate of a plan: what the provider is told and what the VM will carry."""

    vm: VMCandidate
    inventory: Inventory
    gpu_model: str | None = None

    @property
    def instance_type(self) -> str:
        return self.vm.instance_type

    @property
    def zones(self) -> tuple[str, ...]:
        return self.vm.zones

    @property
    def accelerator(self) -> Accelerator | None:
        return self.vm.accelerator

    @property
    def price_per_hour(self) -> float | None:
        return self.vm.price_per_hour

    def __str__(self) -> str:
        return str(self.vm)


@dataclass(frozen=True)
class Plan:
    """StartVM's decision for one sandbox: candidates best first, and their device plans (those
    the VM is told, by GPU model, worked out when the plan is made: `by_model`)."""

    sandbox_id: str
    intent: VMIntent
    candidates: tuple[PlanCandidate, ...] = ()
    naming: CdiNaming = field(default_factory=CdiNaming)
    # (instance type, why) of candidates moved to the end: over a cloud account quota
    ranked_away: tuple[tuple[str, str], ...] = ()
    # candidate position -> its device plan, or why the VM could not hold it
    _devices: dict[int, DevicePlan | InvalidRequest] = field(
        default_factory=dict, compare=False, repr=False
    )
    # GPU model -> the device plan a VM of that model applies (`devices_by_model`)
    by_model: Mapping[str, DevicePlan] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_model", MappingProxyType(self.devices_by_model()))

    def vm_candidates(self) -> tuple[VMCandidate, ...]:
        """The candidates as the provider takes them."""
        return tuple(c.vm for c in self.candidates)

    def vm_spec(self, user_data: str = "") -> VMSpec:
        """What the provider is asked to create."""
        return VMSpec(
            sandbox_id=self.sandbox_id,
            pod_namespace=self.intent.pod_namespace,
            pod_name=self.intent.pod_name,
            candidates=self.vm_candidates(),
            user_data=user_data,
            image=self.intent.image,
            vcpus=self.intent.vcpus,
            memory_mib=self.intent.memory_mib,
            gpus=self.intent.gpu.gpus,
            capacity_type=self.intent.capacity_type,
        )

    def devices(self, candidate: PlanCandidate) -> DevicePlan:
        """The device plan if the VM lands on `candidate` (InvalidRequest if it cannot hold it)."""
        key = next((i for i, c in enumerate(self.candidates) if c is candidate), -1)
        cached = self._devices.get(key)
        if cached is None:
            try:
                cached = plan_devices(None, self.intent.gpu, candidate.inventory, self.naming)
            except InvalidRequest as exc:
                cached = exc
            if key >= 0:
                self._devices[key] = cached
        if isinstance(cached, InvalidRequest):
            raise cached
        return cached

    def candidate_for(self, instance: Instance) -> PlanCandidate | None:
        """The candidate a created VM is (the first of its instance type)."""
        return next((c for c in self.candidates if c.instance_type == instance.instance_type), None)

    def devices_for(self, instance: Instance) -> DevicePlan:
        """The sandbox's device plan on the VM it got; a VM of no candidate's type (a provider
        without a catalog) is assumed to carry exactly what the intent asks for."""
        candidate = self.candidate_for(instance)
        if candidate is None:
            inventory = intent_inventory(self.intent)
            candidate = PlanCandidate(VMCandidate(instance.instance_type), inventory)
        return self.devices(candidate)

    def devices_by_model(self) -> dict[str, DevicePlan]:
        """The device plan each GPU model among the candidates would get, best candidate first.

        The VM is told all of them (a capacity fallback may land on another model, whose MIG
        profile names and packing differ) and applies the one matching its GPUs. Types of one
        model differ only in their RDMA device count, so each model's plan names the most RDMA
        devices any of its candidates has (their names are a prefix of that list).
        """
        plans: dict[str, DevicePlan] = {}
        if self.intent.gpu.empty:
            return plans
        for candidate in self.candidates:
            model = candidate.gpu_model
            if model is None:
                continue
            try:
                devices = self.devices(candidate)
            except InvalidRequest:
                continue
            seen = plans.get(model)
            if seen is None:
                plans[model] = devices
            elif len(devices.rdma) > len(seen.rdma):
                plans[model] = seen.model_copy(update={"rdma": devices.rdma})
        return plans


@dataclass(frozen=True)
class Placement:
    """Selection, quota and device planning over one catalog (None: a provider without one).

    Built whole, once (`for_provider`, or the constructor), and never changed: its quota pool
    and the account's quotas are given, never added later. A rewritten snapshot file gives a
    new placement over the new catalog that shares this one's quota pool and account quotas
    (adaptor.node.catalogs), so a plan is made over one catalog from start to end."""

    catalog: Catalog | None = None
    allowed: tuple[str, ...] = ()  # instance type globs (fnmatch); empty: any
    denied: tuple[str, ...] = ()
    # The zones the provider creates VMs in (empty: unknown); a candidate whose GPU is offered
    # in none of them is dropped.
    zones: tuple[str, ...] = ()
    default_type: str = ""  # without a catalog: the type when the pod names none
    max_candidates: int = MAX_CANDIDATES
    # the capacity reservation or block the operator named (--capacity-reservation): types the
    # cloud sells only that way become candidates and are launched into it; "": none
    reservation: str = ""
    naming: CdiNaming = field(default_factory=CdiNaming)
    quota: QuotaPool | None = None
    # the cloud account's own quotas, shared by every node (None: not read); the per-node pool
    # above stays the floor
    account_quota: AccountQuotaCache | None = None

    @classmethod
    def for_provider(
        cls,
        provider: Provider,
        catalog: Catalog | None,
        naming: CdiNaming | None = None,
        *,
        quota: QuotaPool | None = None,
        account_quota: AccountQuotaCache | None = None,
    ) -> Placement:
        """Selection as the provider declares it (its allow list, zones and default type), with
        the node's GPU quota pool and the cloud account's quotas, if any."""
        return cls(
            catalog=catalog,
            allowed=tuple(provider.allowed_types),
            zones=tuple(provider.zones),
            default_type=provider.default_type,
            max_candidates=getattr(provider, "max_candidate_types", MAX_CANDIDATES),
            reservation=getattr(provider, "capacity_reservation", ""),
            naming=naming or CdiNaming(),
            quota=quota,
            account_quota=account_quota,
        )

    # --- selection -------------------------------------------------------------------------------

    @cached_property
    def selector(self) -> Selector:
        """Selection over `catalog` (its index), built on first use: a function of the catalog,
        kept as long as this placement. Needs a catalog."""
        if self.catalog is None:
            raise NoMatch("this provider has no catalog to select from")
        return Selector(self.catalog)

    def explain(self, intent: VMIntent) -> Selection:
        """The whole selection for the intent under this placement's allow and deny lists: every
        type ranked or rejected with its reason (what `plan` prints). Needs a catalog."""
        selector = self.selector
        request = intent.to_request(
            allow=self.allowed, deny=self.denied, reservation=self.reservation
        )
        return selector.select(request)

    def ranked(self, intent: VMIntent) -> list[Candidate]:
        """Ranked candidates for the intent; NoMatch (counted by reason) when none serves it."""
        if self.catalog is None:
            return []
        try:
            selection = self.explain(intent)
            selection.selected  # noqa: B018 - raises NoMatch with selection's summary when empty
            if not self.zones:
                return selection.top(self.max_candidates)
            zones = set(self.zones)
            found = itertools.islice(
                (c for c in selection.iter_candidates() if not c.zones or set(c.zones) & zones),
                self.max_candidates,
            )
            kept = list(found)
            if not kept:
                raise NoMatch(
                    f"no candidate's GPU is offered in the zones {', '.join(self.zones)}",
                    stage="offering",
                )
            return kept
        except NoMatch as exc:
            metrics.SELECTION_FAILURES.labels(reason=exc.stage).inc()
            raise

    @cached_property
    def _found(self) -> dict[str, tuple[PlanCandidate, ...]]:
        """The candidates `candidates` found, by the intent less its pod: a function of the
        placement's (frozen) catalog and lists, so each StartVM of a shape seen before reuses
        them instead of selecting again."""
        return {}

    def candidates(self, intent: VMIntent) -> tuple[PlanCandidate, ...]:
        """The candidates to try, best first (empty: let the provider decide). A request
        selection refuses (NoMatch) is selected again each time, and counted each time."""
        if self.catalog is None:
            name = intent.machine_type or self.default_type
            if not name:
                return ()
            if not allowed(name, self.allowed):
                error = NoMatch(
                    f"instance type {name} is not in the allowed list {', '.join(self.allowed)}",
                    stage="policy",
                )
                metrics.SELECTION_FAILURES.labels(reason=error.stage).inc()
                raise error
            return (PlanCandidate(VMCandidate(name), intent_inventory(intent)),)
        key = intent.model_dump_json(exclude=_POD_FIELDS)
        found = self._found.get(key)
        if found is None:
            market = "spot" if intent.capacity_type.wants_spot else "on-demand"
            found = tuple(_typed(c, market, self.reservation) for c in self.ranked(intent))
            if len(self._found) >= CANDIDATE_MEMO_SIZE:
                self._found.clear()
            self._found[key] = found
        return found

    async def plan(self, intent: VMIntent, sandbox_id: str) -> Plan:
        """StartVM's plan: the candidates, less those over the quota pool, reserved for the
        sandbox. QuotaExhausted ("quota for H100 exhausted (8/8)") when none fits, before any
        cloud call; NoMatch when selection finds nothing."""
        candidates = self.candidates(intent)
        if self.quota is not None and self.catalog is not None and candidates:
            candidates = await self._reserve(sandbox_id, candidates)
        candidates, away = await self._account_order(intent, candidates)
        for name, reason in away:
            log.info("sandbox %s: candidate %s ranked last: %s", sandbox_id, name, reason)
        return Plan(sandbox_id, intent, candidates, self.naming, away)

    async def _account_order(
        self, intent: VMIntent, candidates: tuple[PlanCandidate, ...]
    ) -> tuple[tuple[PlanCandidate, ...], tuple[tuple[str, str], ...]]:
        """The candidates with those over a cloud account quota moved last (kept: the quota may
        have been raised since it was read, and the cloud has the last word), and why."""
        if self.account_quota is None or not candidates:
            return candidates, ()
        account = await self.account_quota.get()
        if account is None:
            return candidates, ()
        spot = intent.capacity_type.wants_spot
        fit: list[PlanCandidate] = []
        over: list[PlanCandidate] = []
        away: list[tuple[str, str]] = []
        for c in candidates:
            t = c.inventory if isinstance(c.inventory, InstanceType) else None
            accel = c.accelerator
            attached = (accel.model, accel.count) if accel is not None else None
            reason = account.over(t, spot, attached) if t is not None else ""
            if reason:
                over.append(c)
                away.append((c.instance_type, reason))
            else:
                fit.append(c)
        return (*fit, *over), tuple(away)

    async def _reserve(
        self, sandbox_id: str, candidates: Sequence[PlanCandidate]
    ) -> tuple[PlanCandidate, ...]:
        assert self.quota is not None
        options = [(str(i), _demand(c)) for i, c in enumerate(candidates)]
        reservation = await self.quota.reserve(sandbox_id, options)
        for key, reason in reservation.dropped:
            log.info(
                "sandbox %s: candidate %s dropped: %s", sandbox_id, candidates[int(key)], reason
            )
        return tuple(candidates[int(key)] for key in reservation.kept)

    def release(self, sandbox_id: str) -> None:
        """Forget the sandbox's quota reservation (StartVM failed, or the sandbox stopped)."""
        if self.quota is not None:
            self.quota.release(sandbox_id)


def quota_pool(spec: str, catalog: Catalog | None, holdings: Holdings | None) -> QuotaPool | None:
    """The GPU quota pool of a `--gpu-quota` spec (None for ""), counting `holdings`' VMs."""
    limits = parse_quota(spec)
    return QuotaPool(limits, catalog, holdings) if limits else None


def account_quota_cache(
    provider: Provider, catalog: Catalog | None, refresh_seconds: float
) -> AccountQuotaCache | None:
    """The cloud account's quotas (where the provider's API offers them), read at most every
    `refresh_seconds` (0: never); None where there is nothing to read."""
    from providers.clouds.quotas import account_reader

    reader = account_reader(provider, catalog) if refresh_seconds > 0 else None
    return AccountQuotaCache(reader, refresh_seconds) if reader else None


def allowed(name: str, patterns: Sequence[str]) -> bool:
    """Whether an instance type matches the allow list (globs; empty allows all)."""
    return not patterns or any(fnmatch.fnmatchcase(name, p.strip()) for p in patterns)


# What names the pod in a VMIntent, not what it asks of its VM.
_POD_FIELDS = {"pod_name", "pod_namespace"}


def _typed(candidate: Candidate, market: str = "on-demand", reservation: str = "") -> PlanCandidate:
    """A selection candidate as the plan carries it: attached GPUs typed, inventory folded, and
    the reservation to launch into when the cloud does not sell it in the pod's market."""
    t = candidate.instance_type
    accelerator = None
    inventory: Inventory = t
    if candidate.attach_gpus and candidate.gpu_model:
        accelerator = Accelerator(candidate.gpu_model, candidate.attach_gpus)
        memory = next(
            (a.memory_mib for a in t.attachable_gpus if a.model == candidate.gpu_model), 0
        )
        gpu = GpuSpec(model=candidate.gpu_model, count=candidate.attach_gpus, memory_mib=memory)
        inventory = t.model_copy(update={"gpu": gpu})
    vm = VMCandidate(
        instance_type=t.name,
        zones=tuple(candidate.zones),
        accelerator=accelerator,
        price_per_hour=candidate.price_per_hour,
        reservation=reservation if market not in t.provisioning else "",
    )
    return PlanCandidate(vm, inventory, candidate.gpu_model)


def _demand(candidate: PlanCandidate) -> Demand:
    inventory = candidate.inventory
    if isinstance(inventory, InstanceType):
        return demand_of_type(inventory)
    gpus, model = inventory
    return Demand(model or None, float(gpus), "", 0)


def intent_inventory(intent: VMIntent) -> tuple[int, str]:
    """What a VM of no known type carries: exactly the GPUs the intent asks for."""
    model = ""
    for name in intent.gpu.models:
        try:
            model = resolve_gpu(name).id
            break
        except InvalidRequest:
            continue
    gpus = intent.gpu.gpus
    if intent.gpu.mig and model:
        gpus += min_gpus(model, intent.gpu.mig) or 0
    return (gpus, model)


def store_holdings(store: StateStore) -> Holdings:
    """The quota pool's view of the state store: each sandbox's VM type ("" while it has none).

    A sandbox leaves the store at StopVM; until then it may (again) be starting a VM, so its
    reservation stands.
    """

    async def holdings() -> Mapping[str, str]:
        return {
            r.id: r.instance.instance_type if r.instance is not None else ""
            for r in await store.records()
        }

    return holdings
