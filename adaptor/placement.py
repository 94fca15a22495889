"""Where a sandbox goes and what its containers get: selection at StartVM, then the device plan.

The adaptor holds the catalog of its provider's region (the bundled snapshot, cached). StartVM
asks for ranked candidates (`candidates`); once the VM exists its instance type fixes the device
plan (`device_plan`), stored with the sandbox so a restarted daemon rewrites CreateContainer the
same way. Providers without a catalog (static, local) have no selection: the explicit
machine_type, if any, is passed through, and the device plan is sized from the intent alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from adaptor import metrics
from adaptor.devices import CdiNaming, DevicePlan, plan_devices
from providers.base import Instance
from providers.catalog import Catalog, InstanceType
from providers.contract import VMIntent
from providers.errors import InvalidRequest, NoMatch
from providers.gpus import resolve_gpu
from providers.mig import min_gpus
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

    def ranked(self, intent: VMIntent) -> list[Candidate]:
        """Ranked candidates for the intent; NoMatch (counted by reason) when none serves it."""
        if self.catalog is None:
            return []
        request = intent.to_request(allow=self.allowed, deny=self.denied)
        try:
            return select(self.catalog, request).candidates[: self.max_candidates]
        except NoMatch as exc:
            metrics.SELECTION_FAILURES.labels(
                reason=metrics.selection_reason_category(str(exc))
            ).inc()
            raise

    def candidates(self, intent: VMIntent) -> tuple[str, ...]:
        """Instance type names to try, best first (empty: let the provider decide)."""
        if self.catalog is None:
            return (intent.machine_type,) if intent.machine_type else ()
        return tuple(c.name for c in self.ranked(intent))

    def plans_by_model(
        self, intent: VMIntent, candidates: tuple[str, ...]
    ) -> dict[str, DevicePlan]:
        """The device plan each GPU model among the candidates would get, best candidate first.

        The VM is told all of them (a capacity fallback may land on another model, whose MIG
        profile names and packing differ) and applies the one matching its GPUs.
        """
        plans: dict[str, DevicePlan] = {}
        if self.catalog is None or intent.gpu.empty:
            return plans
        types = self.catalog.by_name()
        for name in candidates:
            known = types.get(name)
            if known is None or known.gpu is None or known.gpu.model in plans:
                continue
            try:
                plans[known.gpu.model] = plan_devices(None, intent.gpu, known, self.naming)
            except InvalidRequest:
                continue
        return plans

    def device_plan(self, intent: VMIntent, instance: Instance) -> DevicePlan:
        """The sandbox's device inventory on the VM it got (InvalidRequest if it cannot hold it)."""
        return plan_devices(None, intent.gpu, self._inventory(intent, instance), self.naming)

    def _inventory(self, intent: VMIntent, instance: Instance) -> InstanceType | tuple[int, str]:
        if self.catalog is not None:
            known = self.catalog.by_name().get(instance.instance_type)
            if known is not None:
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
