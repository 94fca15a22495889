"""Where a sandbox goes and what its containers get: selection at StartVM, then the device plan.

The adaptor holds the catalog of its provider's region (the bundled snapshot, cached). StartVM
asks for ranked candidates (`candidates`); once the VM exists its instance type fixes the device
plan (`device_plan`), stored with the sandbox so a restarted daemon rewrites CreateContainer the
same way. Providers without a catalog (static, local) have no selection: the explicit
machine_type, if any, is passed through, and the device plan is sized from the intent alone.

With a GPU quota pool (`--gpu-quota`), StartVM calls `reserve` instead of `candidates`: the
candidates that would exceed the pool are dropped, the rest reserved until the VM exists (its
instance type is then counted from the state store), and `release` forgets the reservation when
the StartVM fails or the sandbox stops.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from adaptor import metrics
from adaptor.devices import CdiNaming, DevicePlan, plan_devices
from adaptor.state import StateStore
from providers.base import Instance
from providers.catalog import Catalog, GpuSpec, InstanceType
from providers.contract import VMIntent
from providers.errors import InvalidRequest, NoMatch
from providers.gcp import n1_candidate
from providers.gpus import resolve_gpu
from providers.mig import min_gpus
from providers.quota import Demand, Holdings, QuotaPool, demand_of_type, parse_quota
from providers.selection import Candidate, select

log = logging.getLogger(__name__)

MAX_CANDIDATES = 8


@dataclass
class Placement:
    """Selection and device planning over one catalog (None: a provider without one)."""

    catalog: Catalog | None = None
    allowed: tuple[str, ...] = ()
    denied: tuple[str, ...] = ()
    max_candidates: int = MAX_CANDIDATES
    naming: CdiNaming = field(default_factory=CdiNaming)
    quota: QuotaPool | None = None
    # The zones the provider creates VMs in (empty: unknown); a candidate whose GPU is offered
    # in none of them is dropped.
    zones: tuple[str, ...] = ()
    # candidate name -> the zones it is restricted to (catalog facts, learnt while ranking)
    _candidate_zones: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)

    def ranked(self, intent: VMIntent) -> list[Candidate]:
        """Ranked candidates for the intent; NoMatch (counted by reason) when none serves it."""
        if self.catalog is None:
            return []
        request = intent.to_request(allow=self.allowed, deny=self.denied)
        try:
            selection = select(self.catalog, request)
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
                raise NoMatch(f"no candidate's GPU is offered in the zones {', '.join(self.zones)}")
            return kept
        except NoMatch as exc:
            metrics.SELECTION_FAILURES.labels(
                reason=metrics.selection_reason_category(str(exc))
            ).inc()
            raise

    def candidates(self, intent: VMIntent) -> tuple[str, ...]:
        """Instance type names to try, best first (empty: let the provider decide)."""
        if self.catalog is None:
            return (intent.machine_type,) if intent.machine_type else ()
        return tuple(self.candidate_name(c) for c in self.ranked(intent))

    def candidate_name(self, candidate: Candidate) -> str:
        """How the provider is told a candidate: GCP N1 names its attached GPUs."""
        name = candidate.name
        if candidate.attach_gpus and candidate.gpu_model and self._cloud() == "gcp":
            name = n1_candidate(candidate.name, candidate.gpu_model, candidate.attach_gpus)
        if candidate.zones:
            self._candidate_zones[name] = tuple(candidate.zones)
        return name

    def zones_for(self, names: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        """The zone restrictions of these candidates (VMSpec.zones)."""
        return {n: self._candidate_zones[n] for n in names if n in self._candidate_zones}

    def _cloud(self) -> str:
        return self.catalog.cloud if self.catalog is not None else ""

    def use_quota(self, spec: str, store: StateStore) -> None:
        """Enable a `--gpu-quota` spec ("" leaves the pool off), counting the store's sandboxes."""
        limits = parse_quota(spec)
        if limits:
            self.quota = QuotaPool(limits, self.catalog, store_holdings(store))

    async def reserve(self, intent: VMIntent, sandbox_id: str) -> tuple[str, ...]:
        """`candidates`, less those over the quota pool, reserved for the sandbox.

        QuotaExhausted ("quota for H100 exhausted (8/8)") when none fits, before any cloud call.
        """
        if self.quota is None or self.catalog is None:
            return self.candidates(intent)
        options: list[tuple[str, Demand]] = []
        for c in self.ranked(intent):
            attached = (c.gpu_model, c.attach_gpus) if c.attach_gpus and c.gpu_model else None
            options.append((self.candidate_name(c), demand_of_type(c.instance_type, attached)))
        reservation = await self.quota.reserve(sandbox_id, options)
        for name, reason in reservation.dropped:
            log.info("sandbox %s: candidate %s dropped: %s", sandbox_id, name, reason)
        return reservation.kept

    def release(self, sandbox_id: str) -> None:
        """Forget the sandbox's quota reservation (StartVM failed, or the sandbox stopped)."""
        if self.quota is not None:
            self.quota.release(sandbox_id)

    def plans_by_model(
        self, intent: VMIntent, candidates: tuple[str, ...]
    ) -> dict[str, DevicePlan]:
        """The device plan each GPU model among the candidates would get, best candidate first.

        The VM is told all of them (a capacity fallback may land on another model, whose MIG
        profile names and packing differ) and applies the one matching its GPUs. Types of one
        model differ only in their RDMA device count, so each model's plan names the most RDMA
        devices any of its candidates has (their names are a prefix of that list).
        """
        plans: dict[str, DevicePlan] = {}
        if self.catalog is None or intent.gpu.empty:
            return plans
        types = self.catalog.by_name()
        for name in candidates:
            known = _attached(types, name)
            if known is None or known.gpu is None:
                continue
            seen = plans.get(known.gpu.model)
            try:
                plan = plan_devices(None, intent.gpu, known, self.naming)
            except InvalidRequest:
                continue
            if seen is None or len(plan.rdma) > len(seen.rdma):
                plans[known.gpu.model] = (
                    plan if seen is None else seen.model_copy(update={"rdma": plan.rdma})
                )
        return plans

    def device_plan(self, intent: VMIntent, instance: Instance) -> DevicePlan:
        """The sandbox's device inventory on the VM it got (InvalidRequest if it cannot hold it)."""
        return plan_devices(None, intent.gpu, self._inventory(intent, instance), self.naming)

    def _inventory(self, intent: VMIntent, instance: Instance) -> InstanceType | tuple[int, str]:
        if self.catalog is not None:
            known = _attached(self.catalog.by_name(), instance.instance_type)
            # An N1 VM reports its machine type alone: its GPUs are the ones the intent asked for.
            if known is not None and not (known.gpu is None and known.attachable_gpus):
                return known
        # No catalog entry: the VM is assumed to carry exactly what the intent asks for.
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


def _attached(types: Mapping[str, InstanceType], name: str) -> InstanceType | None:
    """The catalog entry of a candidate name; a GCP N1 name with GPUs gets them as its own."""
    base, plus, rest = name.partition("+")
    known = types.get(base)
    if known is None or not plus:
        return known
    accelerator, _, count = rest.partition(":")
    try:
        model = resolve_gpu(accelerator).id
    except InvalidRequest:
        return known
    memory = next((a.memory_mib for a in known.attachable_gpus if a.model == model), 0)
    if not (count.isascii() and count.isdigit() and len(count) <= 9) or int(count) < 1:
        return known
    return known.model_copy(
        update={"gpu": GpuSpec(model=model, count=int(count), memory_mib=memory)}
    )


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
