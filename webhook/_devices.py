"""Virtual DRA devices built from a catalog, the things DRA selectors are evaluated against.

At admission no pod VM exists, so no real device can be inspected. Each GPU form the catalog
offers (model, the product name its GPUs report on that instance type, the memory the cloud
reports for the type: `providers.core.skus`) becomes one virtual `gpu` device, and each MIG
profile of
it one virtual `mig` device, published as NVIDIA's DRA driver publishes real ones (driver
`gpu.nvidia.com`; attributes `type`, `productName`, `architecture`, `brand`,
`cudaComputeCapability` as a semver, `profile` for MIG; capacity `memory`). A MIG device's memory
is the size in its profile name.

A GPU the catalog also sells in shares (AWS g6f, Azure NV*ads_A10_v5) is published a second time
as a shareable device (KEP-5075 consumable capacity, `allowMultipleAllocations: true`) whose
memory `requestPolicy` lists the shares on offer as `validValues`: a capacity request is rounded
up to the next share, and the whole GPU is the largest.

Attributes that exist only after boot (`uuid`, `driverVersion`, `parentUUID`, PCI addresses) are
absent. Policy: a selector that reads one of them is denied with a message naming it (the pod
could never be matched reliably), while a presence test (`'uuid' in ...`) sees it as absent.

Selectors are written by tenants, so they are bounded: each evaluation is metered
(`_cel.COST_LIMIT` per device), all evaluations of one admission share a wall-clock deadline
(the `SelectorLimits` the admission passes to `DeviceSpace.match`), and the webhook server runs
them in worker processes it can kill (`_celworker.py`). Results are cached per expression, least
recently used dropped first.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from celpy import celtypes

from providers.core.catalog import Catalog
from providers.core.errors import Fault
from providers.core.gpus import COMPUTE_CAPABILITY as _COMPUTE
from providers.core.gpus import GPU_MODELS
from providers.core.mig import profiles_for
from providers.core.skus import product_name
from webhook._cel import (
    CelBudgetExceeded,
    CelError,
    Meter,
    Quantity,
    Semver,
    compile_selector,
    evaluate,
)
from webhook._resolver import LookupFailed, NotInMemory

log = logging.getLogger(__name__)

DRIVER = "gpu.nvidia.com"
POST_BOOT_ATTRIBUTES = (
    "uuid",
    "driverVersion",
    "parentUUID",
    "pcieBusID",
    "pcieRoot",
    "index",
    "minor",
    "parentIndex",
)
_MIB = 1 << 20
_GIB = 1 << 30
_PROFILE_MEMORY = re.compile(r"\.([0-9]+)gb")
SELECTOR_CACHE_SIZE = 1024  # selector results kept per device space (least recently used go)


@dataclass(frozen=True)
class Outcome:
    """One selector against every device of a space: the accepted device ids and the first
    evaluation error, or a denial (a selector that cannot be used at all) or a time-out."""

    accepted: frozenset[str] = frozenset()
    error: str = ""
    # (device id, what went wrong) for each device the selector failed on: a failure on a
    # device the earlier selectors still admit fails the claim, as in Kubernetes' allocator
    errors: tuple[tuple[str, str], ...] = ()
    denial: str = ""
    over_budget: bool = False
    timed_out: bool = False
    busy: bool = False  # no worker was free before the deadline (load, not the selector)
    refused: bool = False  # the tenant already holds its share of the workers


class SelectorsBusy(LookupFailed):
    """Every selector worker stayed busy until this admission's deadline (a transient denial)."""


class SelectorShareExceeded(SelectorsBusy):
    """The namespace already holds its share of the selector workers: refused, not queued."""

    fault = Fault.EXHAUSTED


# Where selectors are evaluated: (space, expression, deadline, tenant) -> Outcome; None: here.
# The tenant (the review's namespace) is what a runner shares its workers out by.
SelectorRunner = Callable[["DeviceSpace", str, "float | None", str], Outcome]


@dataclass(frozen=True)
class SelectorLimits:
    """How one admission's selectors are evaluated: by `runner` (None: in this thread), all of
    them by `deadline` (None: no limit), and whose share of the workers they take (`tenant`)."""

    runner: SelectorRunner | None = None
    seconds: float = 0.0  # the wall-clock limit, as configured (for messages)
    deadline: float | None = None  # time.monotonic() by which every selector must be done
    tenant: str = ""
    # cached outcomes only: a selector not evaluated yet raises NotInMemory, never waits
    memory_only: bool = False

    @classmethod
    def starting(
        cls,
        runner: SelectorRunner | None,
        seconds: float,
        tenant: str = "",
        started: float | None = None,
    ) -> SelectorLimits:
        """The limits of one admission of `tenant`: every selector done within `seconds` of
        `started` (a time.monotonic() value, default now: the server passes the request's
        arrival, so time spent queueing counts); 0 seconds: no limit."""
        begun = time.monotonic() if started is None else started
        deadline = begun + seconds if seconds > 0 else None
        return cls(runner, seconds, deadline, tenant)


NO_LIMITS = SelectorLimits()


def _short(expression: str, limit: int = 120) -> str:
    return repr(expression if len(expression) <= limit else expression[:limit] + "...")


@dataclass(frozen=True)
class RequestPolicy:
    """KEP-5075 `CapacityRequestPolicy` of a device's memory (MiB): how a request is rounded.

    `validValues` (ascending): the smallest value at least the request; `validRange` (min, max,
    step): below min rounds up to min, off-step rounds up to min + n * step; over the largest
    value or max the request does not fit this device. No request takes `default`.
    """

    default_mib: int
    valid_values: tuple[int, ...] = ()
    valid_range: tuple[int, int | None, int | None] | None = None  # min, max, step

    def consumed(self, request_mib: int | None) -> int | None:
        """What a request consumes, or None when the policy does not admit it."""
        if request_mib is None:
            return self.default_mib
        if self.valid_values:
            return next((v for v in self.valid_values if v >= request_mib), None)
        if self.valid_range is not None:
            low, high, step = self.valid_range
            value = max(request_mib, low)
            if step:
                value = low + -(-(value - low) // step) * step
            return None if high is not None and value > high else value
        return request_mib


@dataclass(frozen=True)
class VirtualDevice:
    """One device the catalog could give a pod VM."""

    id: str
    kind: Literal["gpu", "mig"]
    model: str
    memory_mib: int
    profile: str = ""
    product: str = ""
    # KEP-5075: a shareable device's memory policy; None: allocated whole (exclusive)
    policy: RequestPolicy | None = None
    activation: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def _s(text: str) -> celtypes.StringType:
    return celtypes.StringType(text)


def _activation(
    kind: str, model: str, memory_mib: int, product: str, profile: str = "", shared: bool = False
) -> dict[str, Any]:
    info = GPU_MODELS[model]
    attributes: dict[celtypes.StringType, Any] = {
        _s("type"): _s(kind),
        _s("productName"): _s(product),
        _s("architecture"): _s(info.architecture),
        _s("brand"): _s("Nvidia" if info.vendor == "NVIDIA" else info.vendor),
    }
    if model in _COMPUTE:
        attributes[_s("cudaComputeCapability")] = Semver(_COMPUTE[model])
    if profile:
        attributes[_s("profile")] = _s(profile)
    capacity = {_s("memory"): Quantity(Decimal(memory_mib) * _MIB)}
    device = celtypes.MapType(
        {
            _s("driver"): _s(DRIVER if info.vendor == "NVIDIA" else info.vendor.lower()),
            _s("attributes"): celtypes.MapType({_s(DRIVER): celtypes.MapType(attributes)}),
            _s("capacity"): celtypes.MapType({_s(DRIVER): celtypes.MapType(capacity)}),
            _s("allowMultipleAllocations"): celtypes.BoolType(shared),
        }
    )
    return {"device": device}


class _Pending:
    """One expression being evaluated: who evaluates it, and what it came to."""

    def __init__(self) -> None:
        self.leader: threading.Thread | None = None
        self.finished = threading.Event()
        self.outcome: Outcome | None = None

    def done(self, outcome: Outcome | None) -> None:
        self.outcome = outcome
        self.finished.set()


def profile_memory_mib(profile: str) -> int:
    """The memory a MIG profile name promises ("1g.10gb" -> 10 GiB)."""
    match = _PROFILE_MEMORY.search(profile)
    return int(match[1]) * 1024 if match else 0


@dataclass(frozen=True)
class Match:
    """The devices every selector accepted."""

    devices: tuple[VirtualDevice, ...]

    @property
    def gpus(self) -> tuple[VirtualDevice, ...]:
        """Whole GPUs, shareable ones included (a request without capacity takes all of one)."""
        return tuple(d for d in self.devices if d.kind == "gpu")

    @property
    def gpu_models(self) -> frozenset[str]:
        return frozenset(d.model for d in self.gpus)

    @property
    def mig(self) -> tuple[VirtualDevice, ...]:
        return tuple(d for d in self.devices if d.kind == "mig")


class DeviceSpace:
    """Every virtual device of one catalog, with selector results cached per expression."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        whole, shares, self.max_count = _gpus_offered(catalog)
        devices = _whole_devices(whole) + _shared_devices(whole, shares)
        self.devices = tuple(devices)
        self.models = frozenset(d.model for d in devices)
        self.products = frozenset((d.model, d.product) for d in devices if d.kind == "gpu")
        self.token = uuid.uuid4().hex  # names this space to worker processes
        self._cache: OrderedDict[str, Outcome] = OrderedDict()
        self._lock = threading.Lock()
        # expressions being evaluated now, each with what its evaluation came to (once done)
        self._pending: dict[str, _Pending] = {}

    def evaluate(self, expression: str, deadline: float | None = None) -> Outcome:
        """Every device against one selector, here and now, within COST_LIMIT per device and
        the deadline (a time.monotonic() value) overall. A denial never quotes the expression:
        the caller names the selector by where it stands."""
        try:
            program = compile_selector(expression)
        except CelError as exc:
            return Outcome(denial=str(exc))
        accepted: set[str] = set()
        first_error = ""
        errors: list[tuple[str, str]] = []
        for device in self.devices:
            try:
                if evaluate(program, device.activation, Meter(deadline=deadline)):
                    accepted.add(device.id)
            except CelBudgetExceeded as exc:
                if exc.timed_out:
                    return Outcome(timed_out=True)
                return Outcome(denial=str(exc), over_budget=True)
            except CelError as exc:
                post_boot = next((a for a in POST_BOOT_ATTRIBUTES if f"'{a}'" in str(exc)), "")
                if post_boot:
                    return Outcome(
                        denial=f"reads {DRIVER}/{post_boot}, which exists only after the "
                        "pod VM boots; peer pods cannot be matched on it"
                    )
                first_error = first_error or exc.public
                errors.append((device.id, exc.public))
        return Outcome(frozenset(accepted), first_error, errors=tuple(errors))

    def _one(
        self, label: str, expression: str, candidates: frozenset[str], limits: SelectorLimits
    ) -> tuple[frozenset[str], str]:
        if limits.memory_only:
            outcome = self._cached(expression)
            if outcome is None:
                raise NotInMemory(label)
        else:
            outcome = self._shared(expression, limits.deadline)
        if outcome is None:
            with self._lock:
                pending = self._pending.setdefault(expression, _Pending())
                leading = pending.leader is None
                if leading:
                    pending.leader = threading.current_thread()
            try:
                runner = limits.runner
                if runner is not None:
                    outcome = runner(self, expression, limits.deadline, limits.tenant)
                else:
                    outcome = self.evaluate(expression, limits.deadline)
            finally:
                if leading:
                    with self._lock:
                        del self._pending[expression]
                        if outcome is not None and not (
                            outcome.timed_out or outcome.busy or outcome.refused
                        ):  # the rest is load-dependent, never cached
                            self._cache[expression] = outcome
                            while len(self._cache) > SELECTOR_CACHE_SIZE:
                                self._cache.popitem(last=False)
                    pending.done(outcome)
        if outcome.refused:
            raise SelectorShareExceeded(
                f"namespace {limits.tenant or '(none)'} already uses its share of the CEL "
                "workers (its other pods' selectors are running); retry"
            )
        if outcome.busy:
            raise SelectorsBusy(
                f"no CEL worker became free within the {limits.seconds:g}s limit of this "
                "admission (other pods' selectors are running); retry"
            )
        if outcome.timed_out:
            raise CelBudgetExceeded(
                f"{label} did not finish within the CEL time limit "
                f"of {limits.seconds:g}s per admission",
                timed_out=True,
            )
        if outcome.over_budget:
            raise CelBudgetExceeded(f"{label} {outcome.denial}")
        if outcome.denial:
            raise CelError(f"{label}: {outcome.denial}")
        # Kubernetes evaluates a selector on the devices the earlier ones admitted, and a
        # runtime error there fails the allocation (CEL runtime error): never "no match"
        failed = next((why for device, why in outcome.errors if device in candidates), "")
        if failed:
            raise CelError(f"{label}: CEL runtime error: {failed}")
        return outcome.accepted, ""

    def _cached(self, expression: str) -> Outcome | None:
        with self._lock:
            outcome = self._cache.get(expression)
            if outcome is not None:
                self._cache.move_to_end(expression)
            return outcome

    def _shared(self, expression: str, deadline: float | None) -> Outcome | None:
        """A cached outcome; or, while another admission evaluates the same expression, its
        outcome once it has one (a burst of pods made from one template takes one worker,
        not one each); None when this admission must evaluate it itself."""
        outcome = self._cached(expression)
        if outcome is not None:
            return outcome
        with self._lock:
            pending = self._pending.get(expression)
        if pending is None:
            return None
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not pending.finished.wait(left):
            return Outcome(timed_out=True)  # this admission's own time ran out meanwhile
        found = pending.outcome
        if found is None or found.busy or found.refused:
            return None  # the other admission's load or share, not this one's: evaluate here
        return found  # a time-out too: the same expression, as slow for this admission

    def match(
        self, selectors: list[tuple[str, str]], limits: SelectorLimits = NO_LIMITS
    ) -> tuple[Match, str]:
        """Devices accepted by every selector, given as (where it stands, expression), and the
        first evaluation failure seen (if any), evaluated under the admission's `limits`.
        Messages name a selector by where it stands, never by its text: a review may name a
        namespace its sender does not own."""
        ids = frozenset(d.id for d in self.devices)
        error = ""
        for label, expression in selectors:
            accepted, err = self._one(label, expression, ids, limits)
            ids &= accepted
            error = error or err
        return Match(tuple(d for d in self.devices if d.id in ids)), error


_Whole = set[tuple[str, str, int]]  # (model, product, MiB) of every whole GPU offered
_Shares = dict[tuple[str, str], set[tuple[int, float]]]  # (model, product) -> (MiB, fraction)


def _gpus_offered(catalog: Catalog) -> tuple[_Whole, _Shares, dict[str, int]]:
    """The NVIDIA GPUs a catalog's types have or attach: whole ones, shares of one, and the
    most of each model one type holds."""
    whole: _Whole = set()
    shares: _Shares = {}
    max_count: dict[str, int] = {}
    for itype in catalog.types:
        gpus = [
            (a.model, a.memory_mib, max(a.counts, default=1), 1.0) for a in itype.attachable_gpus
        ]
        if itype.gpu is not None:
            g = itype.gpu
            gpus.append((g.model, g.memory_mib, g.count, g.fraction))
        for model, mib, count, fraction in gpus:
            if model not in GPU_MODELS or GPU_MODELS[model].vendor != "NVIDIA":
                continue  # unknown, AMD, Habana: no gpu.nvidia.com device a pod can get
            product = product_name(catalog.cloud, itype.name, model)
            mib = mib or GPU_MODELS[model].memory_mib
            if fraction < 1:
                # a partitioned GPU reports the memory of its share (as selection reads it)
                shares.setdefault((model, product), set()).add((mib, fraction))
                continue
            whole.add((model, product, mib))
            max_count[model] = max(max_count.get(model, 0), count)
    return whole, shares, max_count


def _whole_devices(whole: _Whole) -> list[VirtualDevice]:
    """A device per whole GPU offered, each followed by its MIG partitions."""
    devices: list[VirtualDevice] = []
    for model, product, mib in sorted(whole):
        devices.append(
            VirtualDevice(
                f"gpu/{model}/{product}/{mib}",
                "gpu",
                model,
                mib,
                product=product,
                activation=_activation("gpu", model, mib, product),
            )
        )
        for spec in profiles_for(model).values():
            pmib = profile_memory_mib(spec.name)
            devices.append(
                VirtualDevice(
                    f"mig/{model}/{product}/{mib}/{spec.name}",
                    "mig",
                    model,
                    pmib,
                    spec.name,
                    product,
                    activation=_activation("mig", model, pmib, product, spec.name),
                )
            )
    return devices


def _shared_devices(whole: _Whole, shares: _Shares) -> list[VirtualDevice]:
    """A shareable device per GPU offered in shares: its capacity the whole GPU's memory, the
    values a claim may ask for the shares offered (and the whole, where one is offered)."""
    devices: list[VirtualDevice] = []
    for (model, product), sizes in sorted(shares.items()):
        offered = {m for m, _ in sizes}
        whole_mib = [m for w, p, m in whole if (w, p) == (model, product)]
        full = max(whole_mib, default=max(round(m / f) for m, f in sizes))
        valid = tuple(sorted(offered | ({full} if whole_mib else set())))
        devices.append(
            VirtualDevice(
                f"shared/{model}/{product}/{full}",
                "gpu",
                model,
                full,
                product=product,
                policy=RequestPolicy(default_mib=full, valid_values=valid),
                activation=_activation("gpu", model, full, product, shared=True),
            )
        )
    return devices
