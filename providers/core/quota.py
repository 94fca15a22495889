"""The adaptor's shared GPU quota pool: limits on the GPUs and vCPUs its sandboxes hold.

A cloud refuses a VM over quota only after the pod has waited for it; the pool refuses first,
in selection, with a message a person can act on ("quota for H100 exhausted (8/8)").

The spec is `--gpu-quota`, comma-separated `KEY=LIMIT` items:

    h100-80gb=8       GPUs of one model (any alias: h100, "NVIDIA H100 80GB HBM3")
    gpus:t4=4         the same, spelled out
    gpus=16           GPUs of any model
    family:p5=16      GPUs on instance types of one family
    vcpus:p5=192      vCPUs on instance types of one family
    vcpus=512         vCPUs of every sandbox

Usage is what the adaptor's sandboxes hold (their VMs' instance types, counted from the catalog)
plus reservations of StartVMs that chose candidates but have no VM yet. Reservations are taken
under one lock, so two StartVMs racing for the last GPUs cannot both get them.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from providers.core.catalog import Catalog, InstanceType
from providers.core.errors import InvalidRequest, QuotaExhausted
from providers.core.gpus import GPU_MODELS, models_matching, resolve_gpu

__all__ = [
    "Demand",
    "Holdings",
    "QuotaLimit",
    "QuotaPool",
    "Reservation",
    "demand_of_name",
    "demand_of_type",
    "family_of",
    "parse_quota",
]

Kind = Literal["gpus", "family", "vcpus"]

# A sandbox id -> the instance type its VM has ("" while it has none but may still start).
# Sandboxes absent from the mapping hold nothing (stopped, or failed without a VM).
Holdings = Callable[[], Awaitable[Mapping[str, str]]]

_FAMILY_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]*$")


@dataclass(frozen=True)
class Demand:
    """What one VM takes from the pool."""

    gpu_model: str | None = None  # canonical id
    gpus: float = 0.0  # a fractional GPU counts as its share
    family: str = ""  # lower case
    vcpus: int = 0


@dataclass(frozen=True)
class QuotaLimit:
    """One limit: `kind` of what, `key` narrows it ("" = everything), `limit` the most allowed."""

    kind: Kind
    key: str
    limit: int

    def amount(self, demand: Demand) -> float:
        """How much of this limit a demand takes."""
        if self.kind == "gpus":
            if self.key and demand.gpu_model != self.key:
                return 0.0
            return demand.gpus
        if self.kind == "family":
            return demand.gpus if demand.family == self.key else 0.0
        if self.key and demand.family != self.key:
            return 0.0
        return float(demand.vcpus)

    @property
    def label(self) -> str:
        """How messages name the limit ("H100", "family p5 GPUs", "p5 vCPUs")."""
        if self.kind == "gpus":
            return _model_label(self.key) if self.key else "GPUs"
        if self.kind == "family":
            return f"family {self.key} GPUs"
        return f"{self.key} vCPUs" if self.key else "vCPUs"

    def __str__(self) -> str:
        prefix = {"gpus": "gpus", "family": "family", "vcpus": "vcpus"}[self.kind]
        return f"{prefix}:{self.key}={self.limit}" if self.key else f"{prefix}={self.limit}"


def _model_label(model_id: str) -> str:
    """ "H100" for the model its family name means, else the id ("A100 80GB", "H100 NVL")."""
    family = GPU_MODELS[model_id].family
    try:
        default = resolve_gpu(family).id
    except InvalidRequest:
        default = ""
    if default == model_id or models_matching(family) == frozenset({model_id}):
        return family.upper()
    return model_id.replace("-", " ").upper()


def _figure(value: float) -> str:
    return f"{value:g}" if value != int(value) else str(int(value))


def parse_quota(text: str) -> tuple[QuotaLimit, ...]:
    """The limits of a `--gpu-quota` spec; InvalidRequest naming the bad item otherwise."""
    limits: dict[tuple[Kind, str], QuotaLimit] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            if text.strip():
                raise InvalidRequest(f"--gpu-quota {text!r}: empty item")
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise InvalidRequest(f"--gpu-quota item {item!r}: want KEY=LIMIT, e.g. h100=8")
        if not value.isdigit():
            raise InvalidRequest(
                f"--gpu-quota item {item!r}: the limit must be a whole number >= 0"
            )
        limit = _limit(item, key, int(value))
        ident = (limit.kind, limit.key)
        if ident in limits:
            raise InvalidRequest(f"--gpu-quota item {item!r}: {key} is limited twice")
        limits[ident] = limit
    return tuple(limits.values())


def _limit(item: str, key: str, value: int) -> QuotaLimit:
    prefix, colon, rest = key.partition(":")
    prefix = prefix.strip().lower()
    rest = rest.strip()
    if not colon:
        if prefix in ("gpus", "vcpus"):
            return QuotaLimit("gpus" if prefix == "gpus" else "vcpus", "", value)
        return QuotaLimit("gpus", _model(item, key), value)
    if prefix in ("gpus", "gpu"):
        return QuotaLimit("gpus", _model(item, rest), value)
    if prefix in ("family", "vcpus"):
        if not rest or not _FAMILY_KEY.fullmatch(rest):
            raise InvalidRequest(f"--gpu-quota item {item!r}: name an instance family")
        return QuotaLimit("family" if prefix == "family" else "vcpus", rest.lower(), value)
    raise InvalidRequest(
        f"--gpu-quota item {item!r}: unknown kind {prefix!r} (want a GPU model, gpus:MODEL, "
        "family:FAMILY, vcpus:FAMILY, gpus or vcpus)"
    )


def _model(item: str, name: str) -> str:
    try:
        return resolve_gpu(name).id
    except InvalidRequest:
        raise InvalidRequest(f"--gpu-quota item {item!r}: unknown GPU model {name!r}") from None


def family_of(t: InstanceType) -> str:
    """A type's family: the catalog's, else the name's prefix (p5.48xlarge -> p5, a3-... -> a3)."""
    if t.family:
        return t.family.lower()
    name = t.name.lower()
    return name.split(".", 1)[0] if "." in name else name.split("-", 1)[0]


def demand_of_type(t: InstanceType, attached: tuple[str, int] | None = None) -> Demand:
    """What a VM of type `t` takes; `attached` is (model, count) of GPUs attached at create."""
    if attached is not None and attached[1] > 0:
        return Demand(attached[0], float(attached[1]), family_of(t), t.vcpus)
    if t.gpu is not None:
        return Demand(t.gpu.model, t.gpu.count * t.gpu.fraction, family_of(t), t.vcpus)
    return Demand(None, 0.0, family_of(t), t.vcpus)


def demand_of_name(name: str, types: Mapping[str, InstanceType]) -> Demand | None:
    """What a VM of this instance type takes, as a VM reports its type (an N1 VM: its machine
    type alone; its attached GPUs are counted by the reservation that chose them).

    `types` is the catalog by name; None when it does not know the type (nothing to count).
    """
    t = types.get(name)
    return demand_of_type(t) if t is not None else None


@dataclass(frozen=True)
class Reservation:
    """The outcome of `QuotaPool.reserve`: the options kept (best first) and why others went."""

    kept: tuple[str, ...]
    dropped: tuple[tuple[str, str], ...] = ()


class QuotaPool:
    """Usage against limits, with reservations for StartVMs in flight."""

    def __init__(
        self,
        limits: Sequence[QuotaLimit],
        catalog: Catalog | None,
        holdings: Holdings | None = None,
    ) -> None:
        self.limits = tuple(limits)
        self.catalog = catalog
        self._types = catalog.by_name() if catalog is not None else {}
        self.holdings = holdings
        # sandbox id -> the demands of the options it may still get (the most of each counts)
        self._reserved: dict[str, tuple[Demand, ...]] = {}
        self._lock = asyncio.Lock()

    @property
    def reserved(self) -> Mapping[str, tuple[Demand, ...]]:
        """Reservations of StartVMs in flight (sandbox id -> the demands reserved for)."""
        return dict(self._reserved)

    async def _held(self) -> dict[str, tuple[Demand, ...]]:
        """Every sandbox's demand: its VM's type, else its reservation. Prunes stale ones."""
        holdings = dict(await self.holdings()) if self.holdings is not None else None
        if holdings is not None:
            for stale in [s for s in self._reserved if s not in holdings]:
                del self._reserved[stale]
        held = dict(self._reserved)
        for sandbox_id, instance_type in (holdings or {}).items():
            demand = demand_of_name(instance_type, self._types) if instance_type else None
            if demand is None:
                continue
            if sandbox_id in held and demand.gpus == 0 and _attaches(instance_type, self._types):
                continue  # an N1 VM reports its machine type only: the reservation knows its GPUs
            held[sandbox_id] = (demand,)
        return held

    def _used(self, held: Mapping[str, tuple[Demand, ...]]) -> dict[QuotaLimit, float]:
        return {
            limit: sum(max(limit.amount(d) for d in demands) for demands in held.values())
            for limit in self.limits
        }

    async def usage(self) -> dict[QuotaLimit, float]:
        """How much of each limit is taken now (held and reserved)."""
        async with self._lock:
            return self._used(await self._held())

    async def reserve(self, sandbox_id: str, options: Sequence[tuple[str, Demand]]) -> Reservation:
        """Keep the options that fit beside everything else held, and reserve for them.

        The reservation counts the most any kept option takes of each limit (the provider may
        fall back to any of them). QuotaExhausted when none fits; the pool is then unchanged.
        """
        async with self._lock:
            held = await self._held()
            held.pop(sandbox_id, None)
            used = self._used(held)
            kept: list[tuple[str, Demand]] = []
            dropped: list[tuple[str, str]] = []
            for name, demand in options:
                reason = _over(self.limits, used, demand)
                if reason:
                    dropped.append((name, reason))
                else:
                    kept.append((name, demand))
            if options and not kept:
                raise QuotaExhausted("; ".join(dict.fromkeys(reason for _, reason in dropped)))
            self._reserved[sandbox_id] = tuple(d for _, d in kept)
            if not kept:
                del self._reserved[sandbox_id]
            return Reservation(tuple(n for n, _ in kept), tuple(dropped))

    def release(self, sandbox_id: str) -> None:
        """Forget a sandbox's reservation (its StartVM failed, or it stopped)."""
        self._reserved.pop(sandbox_id, None)


def _attaches(name: str, types: Mapping[str, InstanceType]) -> bool:
    t = types.get(name)
    return t is not None and bool(t.attachable_gpus)


def _over(limits: Sequence[QuotaLimit], used: Mapping[QuotaLimit, float], demand: Demand) -> str:
    """Why `demand` does not fit beside `used` ("" when it does)."""
    for limit in limits:
        need = limit.amount(demand)
        if need <= 0:
            continue
        have = used[limit]
        if have + need > limit.limit:
            figures = f"{_figure(have)}/{limit.limit}"
            if have < limit.limit:
                figures += f", this sandbox needs {_figure(need)}"
            return f"quota for {limit.label} exhausted ({figures})"
    return ""
