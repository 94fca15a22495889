"""Instance selection: every type of a catalog checked against a request, the fits ranked.

Each type is checked in full (no ordering or monotonicity is assumed: CAA's binary search misses
fits, docs/gpus.md section 2). Checks run in a fixed order of stages, GPU first, policy last, and
the first that
fails is the type's rejection; when nothing fits, the rejections that got furthest say why in one
line ("no type offers MIG profile 9g.99gb", "16 h100-80gb GPUs exceed the largest type, 8").

Ranking: price ascending, where a type no price source covers is priced by an estimate from its
GPUs, vCPUs and memory (providers.core.estimates) and a real price wins a tie; GCP N1 types cost the
machine plus the GPUs attached. A Spot request (provisioning "spot") ranks by Spot prices, and a
type with no published Spot price by its on-demand price (what a Spot VM costs at most), marked
as an estimate. Then smallest fit (GPUs, GPU memory, vCPUs, memory); then name.
A type the cloud does not sell the way the pod is provisioned (GCP's 1-, 2- and 4-GPU A3 High are
Spot or Flex-start only) is no candidate for it. MIG devices are counted in GPUs by packing
them (providers.core.mig).

A `Selector` holds what selection precomputes for one catalog (the types in rank order, the GPU
verdicts of the asks seen): whoever selects from a catalog again and again (the adaptor's
placement, the webhook) keeps one per catalog; `select` builds one for a single selection.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Final, NamedTuple, get_args

from providers.core.catalog import RESERVED, AttachableGpu, Catalog, InstanceType, Provisioning
from providers.core.errors import NoMatch
from providers.core.estimates import catalog_gpu_rates, estimate_price, gpu_hourly_usd
from providers.core.gpus import GPU_MODELS, models_matching
from providers.core.mig import MigLayout, pack, profiles_for
from providers.core.request import InstanceRequest
from providers.core.skus import product_key, product_name

__all__ = ["STAGE_NAMES", "Candidate", "Rejection", "Selection", "Selector", "select"]

# Stages, in check order; a rejection at a later stage came closer to fitting.
NO_GPU: Final = 0  # the type has no GPU (or has one the request does not want)
GPU_MODEL: Final = 1
GPU_MEMORY: Final = 2
FRACTIONAL: Final = 3
MIG_PROFILE: Final = 4
GPU_COUNT: Final = 5
ARCH: Final = 6
RDMA: Final = 7
VCPUS: Final = 8
MEMORY: Final = 9
OFFERED: Final = 10
POLICY: Final = 11
STAGE_NAMES: Final = (
    "GPU presence", "GPU model", "GPU memory", "fractional GPU", "MIG profile", "GPU count",
    "architecture", "RDMA", "vCPUs", "memory", "offering (zone, region, provisioning)",
    "allow/deny lists",
)  # fmt: skip

# The NoMatch stage label of each stage: what a metric counts a failed selection by.
STAGE_LABELS: Final = (
    "gpu_model", "gpu_model", "memory", "gpu_model", "mig", "too_large", "arch", "rdma",
    "too_large", "too_large", "offering", "policy",
)  # fmt: skip

_GIB = 1024
_NVIDIA = frozenset(m.id for m in GPU_MODELS.values() if m.vendor == "NVIDIA")


class Rejection(NamedTuple):
    """A type that cannot serve the request, and why (a tuple: catalogs reject by the thousand)."""

    name: str
    reason: str
    stage: int = 0
    gpu_model: str = ""  # the GPU model the reason is about, if any
    have: int = 0  # what the type offers of the failing figure (GPUs, vCPUs, MiB)


@dataclass(frozen=True)
class _Fit:
    """How one type serves the request (the GPU side)."""

    gpu_model: str | None = None
    gpus: int = 0  # GPUs the VM gets (bundled count, or attached count on GCP N1)
    gpus_used: int = 0  # of which the request uses
    gpu_memory_mib: int = 0  # per GPU
    fraction: float = 1.0
    attach: int = 0  # GCP N1: GPUs to attach at create
    mig_layout: MigLayout | None = None
    zones: tuple[str, ...] = ()  # GCP N1: the only zones the attached GPU is offered in


@dataclass(frozen=True)
class Candidate:
    """A type that serves the request, with why it ranks where it does."""

    instance_type: InstanceType
    price_per_hour: float | None  # what it ranks by: the list price, else the estimate
    reasons: tuple[str, ...]
    gpu_model: str | None = None
    gpus: int = 0
    gpus_used: int = 0
    gpu_memory_mib: int = 0
    fraction: float = 1.0
    attach_gpus: int = 0
    mig_layout: MigLayout | None = None
    # The only zones it can be created in (GCP N1 with a GPU some zones lack); empty: any zone
    # offering the type.
    zones: tuple[str, ...] = ()
    price_estimated: bool = False  # no price source covers it (or its attached GPUs)

    @property
    def name(self) -> str:
        return self.instance_type.name

    @property
    def rank(self) -> tuple[float, int, int, int, int, int, str]:
        """The key selection ranks by, to compare the choices of two different requests."""
        t = self.instance_type
        price = self.price_per_hour if self.price_per_hour is not None else float("inf")
        return (
            round(price, 2),  # as _rank_key
            1 if self.price_estimated else 0,
            self.gpus,
            self.gpus * self.gpu_memory_mib,
            t.vcpus,
            t.memory_mib,
            t.name,
        )


# --- the per-catalog index --------------------------------------------------------------------


# One row per type, in static rank order: (type, vcpus, memory_mib, arch, rdma, zones,
# offered in the region, bundled GPU model or None, bundled GPU count, attaches GPUs).
_SpecKey = tuple[str, int, int, float, tuple[int, ...]]  # model, count, MiB, fraction, counts
_Row = tuple[InstanceType, int, int, str, bool, frozenset[str], bool, str | None, int, bool]


@dataclass
class _Index:
    """What selection precomputes once per catalog (held by its `Selector`)."""

    types: tuple[InstanceType, ...]
    by_name: Mapping[str, InstanceType]
    gpu_types: tuple[InstanceType, ...]  # bundled or attachable GPUs
    has_zones: bool
    rows: tuple[_Row, ...]  # every type, sorted by its request-independent rank key
    gpu_rows: tuple[_Row, ...]  # the rows of types with bundled or attachable GPUs
    # GPU verdicts per GPU ask (models, count, memory, MIG, fractional) and GPU configuration:
    # the same few asks recur (every pod of a Deployment), and MIG packing is the costly part.
    verdicts: dict[tuple[object, ...], dict[_SpecKey, _Fit | Rejection]] = field(
        default_factory=dict
    )
    rates: Mapping[str, float] = field(default_factory=dict)  # per-GPU rates for estimates
    # provisioning model -> names of the types not sold that way (usually none)
    not_sold: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # types sold differently per zone, or confidential sizes: `check` decides them in full
    special: frozenset[str] = frozenset()
    cloud: str = ""


_MAX_ASKS = 512  # distinct GPU asks remembered per catalog before starting over


def _static_key(
    t: InstanceType, rates: Mapping[str, float]
) -> tuple[float, int, int, int, int, int, str]:
    """The rank key of a type serving a request with its bundled GPUs (or none attached)."""
    gpus = t.gpu.count if t.gpu is not None else 0
    memory = t.gpu.memory_mib if t.gpu is not None else 0
    return _rank_key(t, _Fit(gpus=gpus, gpu_memory_mib=memory), rates)


def _index(catalog: Catalog) -> _Index:
    has_zones = any(t.zones for t in catalog.types)
    rates = {**catalog_gpu_rates(catalog.types), **catalog.gpu_prices}
    rows = tuple(
        (
            t,
            t.vcpus,
            t.memory_mib,
            t.arch,
            bool(t.rdma),
            frozenset(t.zones),
            bool(t.zones) or not has_zones,
            t.gpu.model if t.gpu is not None else None,
            t.gpu.count if t.gpu is not None else 0,
            bool(t.attachable_gpus),
        )
        for t in sorted(catalog.types, key=lambda t: _static_key(t, rates))
    )
    index = _Index(
        types=catalog.types,
        by_name=catalog.by_name(),
        gpu_types=tuple(t for t in catalog.types if t.gpu is not None or t.attachable_gpus),
        has_zones=has_zones,
        rows=rows,
        gpu_rows=tuple(r for r in rows if r[7] is not None or r[9]),
        rates=rates,
        cloud=catalog.cloud,
        not_sold={
            sold: frozenset(t.name for t in catalog.types if sold not in t.provisioning)
            for sold in get_args(Provisioning)
        },
        special=frozenset(t.name for t in catalog.types if t.zone_provisioning or t.confidential),
    )
    return index


# --- matching ---------------------------------------------------------------------------------


def _globs(patterns: Sequence[str]) -> re.Pattern[str] | None:
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(p.strip())})" for p in patterns))


def _mib(value: int) -> str:
    return f"{value / _GIB:g} GiB" if value % _GIB == 0 or value > 10 * _GIB else f"{value} MiB"


@dataclass(frozen=True)
class _Matcher:
    """A request compiled for repeated checks."""

    request: InstanceRequest
    models: frozenset[str]  # acceptable canonical models
    whole_gpus: int  # whole GPUs wanted (1 when only a model or memory was asked)
    allow: re.Pattern[str] | None
    deny: re.Pattern[str] | None
    has_zones: bool
    wants_gpu: bool
    gpu_cache: dict[_SpecKey, _Fit | Rejection] = field(
        default_factory=dict, compare=False, repr=False
    )
    cloud: str = ""
    products: frozenset[str] = frozenset()  # acceptable GPU forms (product keys); empty: any
    ways: frozenset[str] = frozenset({"on-demand"})  # how the pod may buy: its market, reserved

    @staticmethod
    def ways_of(request: InstanceRequest) -> frozenset[str]:
        """The ways a request buys a VM: its market, and reserved capacity when one is named."""
        ways: set[str] = {request.provisioning}
        if request.reservation:
            ways |= RESERVED
        return frozenset(ways)

    @classmethod
    def build(cls, request: InstanceRequest, index: _Index) -> _Matcher:
        if request.gpu_models:
            models = frozenset().union(*(models_matching(m) for m in request.gpu_models))
        else:  # `nvidia.com/gpu` means NVIDIA: Radeon or Gaudi types only when named
            models = _NVIDIA
        whole = request.gpus
        if request.wants_gpu and not request.gpus and not request.mig:
            whole = 1
        ask = (
            request.gpu_models,
            request.gpus,
            request.gpu_memory_mib,
            tuple(sorted(request.mig.items())),
            request.fractional,
        )
        cache = index.verdicts.get(ask)
        if cache is None:
            if len(index.verdicts) >= _MAX_ASKS:
                index.verdicts.clear()
            cache = index.verdicts[ask] = {}
        return cls(
            gpu_cache=cache,
            request=request,
            models=models,
            whole_gpus=whole,
            allow=_globs(request.allow),
            deny=_globs(request.deny),
            has_zones=index.has_zones,
            wants_gpu=request.wants_gpu,
            cloud=index.cloud,
            products=frozenset(request.gpu_products),
            ways=cls.ways_of(request),
        )

    def gpu_fit(
        self, model: str, count: int, memory_mib: int, fraction: float, counts: tuple[int, ...]
    ) -> _Fit | Rejection:
        """Whether `count` GPUs of `model` (or one of `counts` attached) serve the GPU request.

        Many types share a GPU configuration (every g6 size has one L4): decided once each.
        """
        key = (model, count, memory_mib, fraction, counts)
        found = self.gpu_cache.get(key)
        if found is None:
            found = self.gpu_cache[key] = self._gpu_fit(model, count, memory_mib, fraction, counts)
        return found

    def _gpu_fit(
        self, model: str, count: int, memory_mib: int, fraction: float, counts: tuple[int, ...]
    ) -> _Fit | Rejection:
        request = self.request
        if model not in self.models:
            wanted = "|".join(request.gpu_models) or "NVIDIA (name the model to use others)"
            return Rejection("", f"GPU {model} is not one of {wanted}", GPU_MODEL, model)
        # What the cloud reports for this type, in MiB, compared with the binary request
        # (A10G: 22888 MiB, short of 23Gi); the model's nominal figure only when none is known.
        nominal = GPU_MODELS[model].memory_mib if model in GPU_MODELS else 0
        effective = memory_mib or nominal
        if request.gpu_memory_mib and effective < request.gpu_memory_mib:
            return Rejection(
                "",
                f"{model} has {_mib(effective)} per GPU, need {_mib(request.gpu_memory_mib)}",
                GPU_MEMORY,
            )
        if fraction < 1:
            share = f"a {_fraction(fraction)} share of one {model}"
            if not request.fractional:
                return Rejection("", f"{share} (fractional GPUs not allowed)", FRACTIONAL)
            if request.mig or request.gpus > 1:
                wanted = "MIG devices" if request.mig else f"{request.gpus} GPUs"
                return Rejection("", f"{share} cannot serve {wanted}", FRACTIONAL)
        layout: MigLayout | None = None
        mig_gpus = 0
        if request.mig:
            offered = profiles_for(model)
            missing = sorted(p for p in request.mig if p not in offered)
            if missing:
                reason = f"{model} has no MIG profile {', '.join(missing)}"
                return Rejection("", reason, MIG_PROFILE, model)
            most = max(counts) if counts else count
            room = most - self.whole_gpus
            layout = pack(model, request.mig, room)
            if layout is None:
                reason = f"MIG devices {_mig(request.mig)} need more than {max(room, 0)} {model}"
                return Rejection("", reason, GPU_COUNT, model, most)
            mig_gpus = layout.gpus_used
        needed = self.whole_gpus + mig_gpus
        if counts:
            attach = next((c for c in sorted(counts) if c >= needed), 0)
            if not attach:
                reason = f"attaches at most {max(counts)} {model}, need {needed}"
                return Rejection("", reason, GPU_COUNT, model, max(counts))
            count = attach
        elif needed > count:
            return Rejection("", f"{count} {model}, need {needed}", GPU_COUNT, model, count)
        return _Fit(
            gpu_model=model,
            gpus=count,
            gpus_used=needed,
            gpu_memory_mib=memory_mib,
            fraction=fraction,
            attach=count if counts else 0,
            mig_layout=layout,
        )

    def check(self, t: InstanceType) -> _Fit | Rejection:
        """The fit of one type, or the first check it fails (stages in order: GPU, host, offering,
        policy)."""
        fit = self._gpu_stage(t)
        if isinstance(fit, Rejection):
            return fit
        rejection = self._host_rejection(t)
        if rejection is not None:
            return rejection
        fit = self._offered_fit(t, fit)
        if isinstance(fit, Rejection):
            return fit
        rejection = self._policy_rejection(t)
        return fit if rejection is None else rejection

    def _gpu_stage(self, t: InstanceType) -> _Fit | Rejection:
        """The GPU checks: the GPUs a type has or can attach, then the product forms allowed."""
        if self.wants_gpu and not t.attachable_gpus:  # the common shape: bundled GPUs or none
            g = t.gpu
            if g is None:
                return Rejection(t.name, "no GPU", NO_GPU)
            verdict = self.gpu_fit(g.model, g.count, g.memory_mib, g.fraction, ())
            if isinstance(verdict, Rejection):
                return Rejection(t.name, *verdict[1:])
            fit = verdict
        elif self.wants_gpu:
            chosen = self._attached_fit(t)
            if isinstance(chosen, Rejection):
                return chosen
            fit = chosen
        elif t.gpu is not None and not self.request.instance_type:  # named explicitly: take it
            return Rejection(t.name, f"has {t.gpu.count} {t.gpu.model}, no GPU requested", NO_GPU)
        else:
            fit = _NO_FIT
        if self.products and fit.gpu_model is not None:
            product = product_name(self.cloud, t.name, fit.gpu_model)
            if product_key(product) not in self.products:
                wanted = "|".join(sorted(self.products))
                reason = f"its {fit.gpu_model} is an {product!r}, not one of {wanted}"
                return Rejection(t.name, reason, GPU_MODEL, fit.gpu_model)
        return fit

    def _attached_fit(self, t: InstanceType) -> _Fit | Rejection:
        """The best of a type's GPU options (bundled, or each attachable model), or why none
        serves."""
        options: list[_Fit | Rejection] = []
        if t.gpu is not None:
            g = t.gpu
            options.append(self.gpu_fit(g.model, g.count, g.memory_mib, g.fraction, ()))
        options.extend(self._attachable_option(t, a) for a in t.attachable_gpus)
        if not options:
            return Rejection(t.name, "no GPU", NO_GPU)
        fits = [o for o in options if isinstance(o, _Fit)]
        if not fits:
            worst = max((o for o in options if isinstance(o, Rejection)), key=_stage)
            return Rejection(t.name, worst.reason, worst.stage, worst.gpu_model, worst.have)
        # the cheapest GPU to attach (list price, else its reference rate), then the fewest
        per_gpu = {a.model: a.price_per_hour for a in t.attachable_gpus}

        def attached_cost(f: _Fit) -> tuple[float, int, int, str]:
            model = f.gpu_model or ""
            rate = per_gpu.get(model)
            cost = f.attach * (rate if rate is not None else gpu_hourly_usd(model))
            return (round(cost, 6), f.gpus, f.gpu_memory_mib, model)

        return min(fits, key=attached_cost)

    def _attachable_option(self, t: InstanceType, a: AttachableGpu) -> _Fit | Rejection:
        """One attachable GPU model's verdict for a type, narrowed to the zones that have it."""
        request = self.request
        if request.zone and a.zones and request.zone not in a.zones:
            reason = f"{a.model} cannot be attached in zone {request.zone}"
            return Rejection(t.name, reason, OFFERED, a.model)
        verdict = self.gpu_fit(a.model, 0, a.memory_mib, 1.0, a.counts)
        if a.zones and isinstance(verdict, _Fit):  # only some zones have this GPU
            where = tuple(z for z in a.zones if not t.zones or z in t.zones)
            if request.zone:
                where = tuple(z for z in where if z == request.zone)
            if not where:
                reason = f"{a.model} cannot be attached in any zone offering {t.name}"
                return Rejection(t.name, reason, OFFERED, a.model)
            verdict = replace(verdict, zones=where)
        return verdict

    def _host_rejection(self, t: InstanceType) -> Rejection | None:
        """The host checks: architecture, RDMA, vCPUs, memory."""
        request = self.request
        if t.arch != request.arch:
            return Rejection(t.name, f"{t.arch}, the image is {request.arch}", ARCH)
        if request.rdma and not t.rdma:
            return Rejection(t.name, "no RDMA (EFA/InfiniBand)", RDMA)
        if request.rdma_devices > 1 and rdma_devices(t) < request.rdma_devices:
            have = rdma_devices(t)
            reason = f"{have} RDMA device(s), need {request.rdma_devices}"
            return Rejection(t.name, reason, RDMA, have=have)
        if t.vcpus < request.vcpus:
            return Rejection(t.name, f"{t.vcpus} vCPUs, need {request.vcpus}", VCPUS, have=t.vcpus)
        if t.memory_mib < request.memory_mib:
            reason = f"{_mib(t.memory_mib)} memory, need {_mib(request.memory_mib)}"
            return Rejection(t.name, reason, MEMORY, have=t.memory_mib)
        return None

    def _offered_fit(self, t: InstanceType, fit: _Fit) -> _Fit | Rejection:
        """The offering checks (confidential or not, sold the pod's way, zone, region); the fit
        narrowed to the zones that sell it."""
        request = self.request
        if t.confidential != request.confidential:
            reason = (
                "a confidential VM size, only for a pod that asks for confidential computing"
                if t.confidential
                else "not a confidential VM size (the pod asks for confidential computing)"
            )
            return Rejection(t.name, reason, OFFERED)
        selling = t.zones_selling(self.ways)
        if selling is not None:
            if request.zone:
                selling = tuple(z for z in selling if z == request.zone)
            if fit.zones:
                selling = tuple(z for z in selling if z in fit.zones)
            if not selling:
                return Rejection(t.name, _not_sold(t, request), OFFERED)
            if t.zone_provisioning:
                fit = replace(fit, zones=selling)
        if request.zone and t.zones and request.zone not in t.zones:
            return Rejection(t.name, f"not offered in zone {request.zone}", OFFERED)
        if self.has_zones and not t.zones:
            return Rejection(t.name, "not offered in this region", OFFERED)
        return fit

    def _policy_rejection(self, t: InstanceType) -> Rejection | None:
        """The operator's allow and deny lists."""
        if self.deny is not None and self.deny.match(t.name):
            return Rejection(t.name, "denied by --deny", POLICY)
        if self.allow is not None and not self.allow.match(t.name):
            return Rejection(t.name, "not in the allow list", POLICY)
        return None


_SOLD = ("sold only as", "a confidential VM size", "not a confidential VM size")


def _not_sold(t: InstanceType, request: InstanceRequest) -> str:
    """Why a type is not sold the way the pod buys (the prefix `_summarise` looks for)."""
    ways = t.sold_in(request.zone) if request.zone else t.provisioning
    if t.zone_provisioning and not request.zone:
        ways = tuple(dict.fromkeys(w for z in t.zones for w in t.sold_in(z)))
    reason = f"sold only as {' or '.join(ways) or 'nothing'}, not {request.provisioning}"
    if RESERVED & set(ways) and not request.reservation:
        reason += " (a reservation or capacity block is used only when the operator names it)"
    return reason


def _stage(rejection: Rejection) -> int:
    return rejection.stage


def _fraction(value: float) -> str:
    denominator = round(1 / value)
    return f"1/{denominator}" if abs(1 / denominator - value) < 1e-3 else f"{value:g}"


def _mig(profiles: dict[str, int]) -> str:
    return ",".join(f"{p}={n}" for p, n in sorted(profiles.items()))


# --- ranking ----------------------------------------------------------------------------------


def _price(
    t: InstanceType, fit: _Fit, rates: Mapping[str, float], spot: bool = False
) -> tuple[float, bool]:
    """USD per hour of the VM this fit creates (as Spot when `spot`), and whether any of it is
    an estimate."""
    if spot:
        gpu = next((a for a in t.attachable_gpus if a.model == fit.gpu_model), None)
        gpu_spot = gpu.spot_price_per_hour if gpu is not None else None
        if t.spot_price_per_hour is not None and (not fit.attach or gpu_spot is not None):
            return _cost(t, fit, t.spot_price_per_hour, rates, gpu_spot)
        return _cost(t, fit, t.price_per_hour, rates)[0], True
    return _cost(t, fit, t.price_per_hour, rates)


def _cost(
    t: InstanceType,
    fit: _Fit,
    price: float | None,
    rates: Mapping[str, float],
    gpu_price: float | None = None,
) -> tuple[float, bool]:
    """The machine's `price` plus the attached GPUs' (the on-demand list price when no
    `gpu_price` is given), estimated where no price is known."""
    if not fit.attach:
        if price is not None:
            return price, False
        return estimate_price(t, rates=rates), True
    if gpu_price is None:
        gpu_price = next(
            (a.price_per_hour for a in t.attachable_gpus if a.model == fit.gpu_model), None
        )
    if price is not None and gpu_price is not None:
        return round(price + fit.attach * gpu_price, 6), False
    machine = price if price is not None else estimate_price(t, rates=rates)
    gpus = (
        fit.attach * gpu_price
        if gpu_price is not None
        else estimate_price(t, fit.attach, fit.gpu_model, rates) - estimate_price(t, rates=rates)
    )
    return round(machine + gpus, 6), True


def _rank_key(
    t: InstanceType, fit: _Fit, rates: Mapping[str, float], spot: bool = False
) -> tuple[float, int, int, int, int, int, str]:
    price, estimated = _price(t, fit, rates, spot)
    return (
        round(price, 2),  # an estimate equal to a list price to the cent ranks after it
        1 if estimated else 0,
        fit.gpus,
        fit.gpus * fit.gpu_memory_mib,
        t.vcpus,
        t.memory_mib,
        t.name,
    )


def _describe(t: InstanceType, fit: _Fit) -> str:
    parts: list[str] = []
    if fit.gpu_model:
        if fit.fraction < 1:
            parts.append(f"{_fraction(fit.fraction)} of one {fit.gpu_model}")
        else:
            verb = "attach " if fit.attach else ""
            parts.append(f"{verb}{fit.gpus} x {fit.gpu_model} ({_mib(fit.gpu_memory_mib)} each)")
        if fit.mig_layout is not None:
            parts.append(f"MIG packed on {fit.mig_layout.gpus_used} GPU(s)")
    parts.append(f"{t.vcpus} vCPUs, {_mib(t.memory_mib)}")
    if t.rdma:
        parts.append(t.rdma)
    return "fits: " + ", ".join(parts)


def _dollars(price: float, estimated: bool, spot: bool = False) -> str:
    if spot:
        if estimated:
            return f"~${price:.4g}/h Spot (at most: no Spot price known, on-demand shown)"
        return f"${price:.4g}/h Spot"
    return f"~${price:.4g}/h (estimate: no list price known)" if estimated else f"${price:.4g}/h"


def _why_here(
    position: int,
    best: tuple[float, bool],
    name: str,
    price: tuple[float, bool],
    total: int,
    spot: bool = False,
) -> str:
    if position == 0:
        return f"cheapest of {total} at {_dollars(*price, spot)}"
    more = price[0] - best[0]
    if more <= 0:
        return f"{_dollars(*price, spot)}, as cheap as {name}; larger or listed after it"
    return f"{_dollars(*price, spot)}, ${more:.4g}/h more than {name}"


# --- the result -------------------------------------------------------------------------------


@dataclass
class Selection:
    """Ranked candidates (best first) and every rejection, with a one-line summary on failure.

    Candidates and rejections are built on first use: StartVM needs the best few, the CLI and
    a failure summary need the rest.
    """

    catalog: Catalog
    request: InstanceRequest
    _fits: list[tuple[InstanceType, _Fit]] = field(repr=False)
    _matcher: _Matcher = field(repr=False)
    _index: _Index = field(repr=False)
    _pool: tuple[InstanceType, ...] | None = field(default=None, repr=False)

    @property
    def count(self) -> int:
        """How many candidates there are (without building them)."""
        return len(self._fits)

    def top(self, n: int) -> list[Candidate]:
        """The best `n` candidates, without building the rest (StartVM's fallback list)."""
        if "candidates" in self.__dict__:
            return self.candidates[:n]
        total = len(self._fits)
        return [self._candidate(i, total) for i in range(min(n, total))]

    def iter_candidates(self) -> Iterator[Candidate]:
        """The candidates best first, each built only when reached."""
        total = len(self._fits)
        return (self._candidate(i, total) for i in range(total))

    @cached_property
    def candidates(self) -> list[Candidate]:
        total = len(self._fits)
        return [self._candidate(i, total) for i in range(total)]

    def _candidate(self, position: int, total: int) -> Candidate:
        t, fit = self._fits[position]
        best, best_fit = self._fits[0]
        spot = self.request.provisioning == "spot"
        rates = self._index.rates
        price = _price(t, fit, rates, spot)
        best_price = _price(best, best_fit, rates, spot)
        why = _why_here(position, best_price, best.name, price, total, spot)
        return Candidate(
            instance_type=t,
            price_per_hour=price[0],
            price_estimated=price[1],
            reasons=(_describe(t, fit), why),
            gpu_model=fit.gpu_model,
            gpus=fit.gpus,
            gpus_used=fit.gpus_used,
            gpu_memory_mib=fit.gpu_memory_mib,
            fraction=fit.fraction,
            attach_gpus=fit.attach,
            mig_layout=fit.mig_layout,
            zones=fit.zones,
        )

    @cached_property
    def rejections(self) -> list[Rejection]:
        """Every type that does not fit, furthest stage first, then by name."""
        chosen = {t.name for t, _ in self._fits}
        pool = self._pool if self._pool is not None else self.catalog.types
        found: list[Rejection] = []
        wants_gpu = self._matcher.wants_gpu
        for t in pool:
            if t.name in chosen:
                continue
            if wants_gpu and t.gpu is None and not t.attachable_gpus:
                found.append(Rejection(t.name, "no GPU", NO_GPU))  # what check() says, cheaper
                continue
            result = self._matcher.check(t)
            if isinstance(result, Rejection):
                found.append(result)
        return sorted(found, key=lambda r: (-r.stage, r.name))

    def not_sold(self) -> list[Rejection]:
        """Types that fit the pod but are not sold the way it buys (Spot only, a capacity block
        or reservation nobody named, a confidential size the pod did not ask for): what `plan`
        and `select` name as not chosen, and why."""
        return [r for r in self.rejections if r.stage == OFFERED and r.reason.startswith(_SOLD)]

    @property
    def selected(self) -> Candidate:
        """The best candidate; NoMatch with the summary when there is none."""
        if not self._fits:
            head = self._furthest()
            reasons = [f"{r.name}: {r.reason}" for r in head[:20]]
            summary = _summarise(self.request, head, self._index.gpu_types)
            stage = STAGE_LABELS[head[0].stage] if head else "other"
            raise NoMatch(summary, reasons, stage)
        if "candidates" in self.__dict__:
            return self.candidates[0]
        return self._candidate(0, len(self._fits))

    def _furthest(self) -> list[Rejection]:
        """The rejections a summary needs: for a GPU ask, GPU types' (the rest say "no GPU")."""
        if "rejections" in self.__dict__ or not self._matcher.wants_gpu or self._pool is not None:
            return self.rejections
        found = [self._matcher.check(t) for t in self._index.gpu_types]
        rejected = [r for r in found if isinstance(r, Rejection)]
        if not rejected:
            return self.rejections
        return sorted(rejected, key=lambda r: (-r.stage, r.name))

    def summary(self) -> str:
        """One line: what was chosen, or why nothing could be."""
        if self._fits:
            t, _ = self._fits[0]
            return f"{t.name} ({len(self._fits)} candidates, {len(self.rejections)} rejected)"
        return _summarise(self.request, self._furthest(), self._index.gpu_types)


def _summarise(
    request: InstanceRequest, rejections: Sequence[Rejection], gpu_types: Iterable[InstanceType]
) -> str:
    if not rejections:
        return "the catalog is empty"
    furthest = rejections[0].stage
    near = [r for r in rejections if r.stage == furthest]
    names = ", ".join(r.name for r in near[:3]) + (", ..." if len(near) > 3 else "")
    if furthest == NO_GPU:
        if request.wants_gpu:
            return "no instance type has a GPU"
        return f"only types with GPUs match ({names}), and no GPU was requested"
    if furthest == GPU_MODEL:
        return f"no type offers GPU model {'|'.join(request.gpu_models) or 'from NVIDIA'}"
    if furthest == GPU_MEMORY:
        return f"no GPU has {_mib(request.gpu_memory_mib)} of memory ({near[0].reason})"
    if furthest == FRACTIONAL:
        return f"only fractional GPUs match ({names}): {near[0].reason}"
    if furthest == MIG_PROFILE:
        offered = {p for t in gpu_types if t.gpu is not None for p in profiles_for(t.gpu.model)}
        missing = sorted(p for p in request.mig if p not in offered)
        if missing:
            return f"no type offers MIG profile {', '.join(missing)}"
        return f"no GPU model offers every MIG profile of {_mig(request.mig)}"
    if furthest == GPU_COUNT:
        return _too_many_gpus(request, near)
    if furthest == ARCH:
        return f"only {names} match, and not for {request.arch} images"
    if furthest == RDMA:
        return f"no matching type has RDMA ({names} have none)"
    if furthest == VCPUS:
        largest = max(r.have for r in near)
        return f"{request.vcpus} vCPUs exceed the largest matching type, {largest}"
    if furthest == MEMORY:
        largest = max(r.have for r in near)
        return (
            f"{_mib(request.memory_mib)} memory exceeds the largest matching type, {_mib(largest)}"
        )
    if furthest == OFFERED:
        return _not_offered(request, near, names)
    return f"the matching types ({names}) are excluded by the allow/deny lists"


def _too_many_gpus(request: InstanceRequest, near: Sequence[Rejection]) -> str:
    """Why the GPU count stopped every type: the largest type's GPUs are the bound."""
    model = near[0].gpu_model
    largest = max(r.have for r in near if r.gpu_model == model)
    if request.mig:
        return (
            f"MIG devices {_mig(request.mig)} need more {model} GPUs than the largest "
            f"type has, {largest}"
        )
    if not request.gpu_models:
        # any model was asked for: the largest type of every model is the bound
        largest = max(r.have for r in near)
        return f"{request.gpus} GPUs of any model exceed the largest GPU type, {largest}"
    return f"{request.gpus} {model} GPUs exceed the largest type, {largest}"


def _not_offered(request: InstanceRequest, near: Sequence[Rejection], names: str) -> str:
    """Why the offering stopped every type: not sold the pod's way, or not in its zone."""
    sold = [r for r in near if r.reason.startswith(_SOLD)]
    if sold:
        listed = ", ".join(r.name for r in sold[:3]) + (", ..." if len(sold) > 3 else "")
        if not sold[0].reason.startswith("sold only as"):  # confidential or not
            return f"the matching types cannot serve this pod ({listed}: {sold[0].reason})"
        return f"the matching types are not sold {request.provisioning} ({listed}: " + (
            sold[0].reason + ")"
        )
    where = f"zone {request.zone}" if request.zone else "this region"
    return f"no matching type is offered in {where} ({names})"


class Selector:
    """Selection over one catalog: the catalog's index is built once, here, and the GPU verdicts
    of the asks seen are kept with it (the same few recur: every pod of a Deployment), as long
    as this object lives. Safe to share between threads."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._index = _index(catalog)

    def select(self, request: InstanceRequest) -> Selection:
        """Every type of the catalog checked against the request; fits ranked best first."""
        catalog, index = self.catalog, self._index
        matcher = _Matcher.build(request, index)
        if request.instance_type:
            chosen = index.by_name.get(request.instance_type)
            if chosen is None:
                raise NoMatch(
                    f"instance type {request.instance_type} is not in the "
                    f"{catalog.cloud} {catalog.region} catalog"
                )
            result = matcher.check(chosen)
            fits = [] if isinstance(result, Rejection) else [(chosen, result)]
            return Selection(catalog, request, fits, matcher, index, (chosen,))
        return Selection(catalog, request, _scan(index, matcher), matcher, index)


def select(catalog: Catalog, request: InstanceRequest) -> Selection:
    """One selection over a catalog (its index is built for it: to select from the same catalog
    again, keep a `Selector`)."""
    return Selector(catalog).select(request)


_NO_FIT = _Fit()


def rdma_devices(t: InstanceType) -> int:
    """RDMA devices a type gives a pod VM: its EFA interfaces, one InfiniBand HCA, or none."""
    return max(t.efa_interfaces, 1) if t.rdma else 0


def _scan(index: _Index, matcher: _Matcher) -> list[tuple[InstanceType, _Fit]]:
    """The fits in rank order. Cheap necessary conditions first; `check` decides the rest."""
    if not matcher.wants_gpu:
        return _scan_without_gpus(index, matcher)
    return _scan_with_gpus(index, matcher)


def _scan_without_gpus(index: _Index, matcher: _Matcher) -> list[tuple[InstanceType, _Fit]]:
    """The fits of a request without GPUs: every condition of `check` inline, over all rows."""
    request = matcher.request
    vcpus, memory, arch, rdma, zone, nics = (
        request.vcpus,
        request.memory_mib,
        request.arch,
        request.rdma,
        request.zone,
        request.rdma_devices,
    )
    allow, deny = matcher.allow, matcher.deny
    fits: list[tuple[InstanceType, _Fit]] = []
    not_sold = frozenset[str].intersection(
        *(index.not_sold.get(way, frozenset()) for way in matcher.ways)
    )
    special = index.special
    for t, vc, mem, a, rd, zones, offered, model, _count, _attach in index.rows:
        if (
            vc >= vcpus
            and mem >= memory
            and a == arch
            and model is None
            and offered
            and (rd or not rdma)
            and (nics <= 1 or rdma_devices(t) >= nics)
            and (not zone or not zones or zone in zones)
            and (deny is None or not deny.match(t.name))
            and (allow is None or allow.match(t.name))
        ):
            if not_sold and t.name in not_sold:
                continue
            if special and t.name in special:
                verdict = matcher.check(t)
                if not isinstance(verdict, Rejection):
                    fits.append((t, verdict))
                continue
            fits.append((t, _NO_FIT))
    if request.provisioning == "spot":  # the index is in on-demand order
        rates = index.rates
        fits.sort(key=lambda pair: _rank_key(pair[0], pair[1], rates, True))
    return fits


def _scan_with_gpus(index: _Index, matcher: _Matcher) -> list[tuple[InstanceType, _Fit]]:
    """The fits of a request for GPUs: the GPU rows past the cheap conditions, each checked."""
    request = matcher.request
    vcpus, memory, arch, rdma = request.vcpus, request.memory_mib, request.arch, request.rdma
    sold_as = request.provisioning
    models = matcher.models
    fits: list[tuple[InstanceType, _Fit]] = []
    reorder = False
    for t, vc, mem, a, rd, _zones, offered, model, _count, attach in index.gpu_rows:
        if vc < vcpus or mem < memory or a != arch or not offered or (rdma and not rd):
            continue
        if not attach and (model is None or model not in models):
            continue
        result = matcher.check(t)
        if not isinstance(result, Rejection):
            fits.append((t, result))
            reorder = reorder or result.attach > 0
    if reorder or sold_as == "spot":  # attached GPUs, or Spot prices, change the order
        spot = sold_as == "spot"
        rates = index.rates
        fits.sort(key=lambda pair: _rank_key(pair[0], pair[1], rates, spot))
    return fits
