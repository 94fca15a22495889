"""Offline, what the scheduler would allocate a pod's claims from published pools.

Kubernetes 1.36's structured allocator as FACTS-DRA.md states it, for the fields peer-pod
claims use: pools of the highest generation that are complete, ordered by driver then pool
name, slices by name, devices in order; first fit, no scoring. A device already allocated is
taken only when it allows multiple allocations; counters are the set's value minus what every
allocated device of the pool consumes (a shared device once); a capacity request is rounded up
by the device's `requestPolicy` and must fit what is left of it. Requests: `exactly`
(`deviceClassName`, `selectors`, `count`, `allocationMode: ExactCount|All`,
`capacity.requests`) and `firstAvailable` (the first subrequest that fits wins). Selectors of
the class and the request are CEL, evaluated by `webhook._cel` against the device as the
scheduler presents it. Not modelled (the result is then refused with a reason, never guessed):
`constraints`, `adminAccess`, device taints. Each request is filled greedily in claim order,
with no backtracking across requests: where the real allocator would backtrack to satisfy a
later request, this says "no fit" (errs pessimistic).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from celpy import celtypes

from providers.core.errors import InvalidRequest
from providers.core.quantity import parse_quantity
from webhook._cel import CelError, Quantity, Semver, compile_selector, evaluate

__all__ = ["Allocation", "AllocationFailed", "Allocator", "Result", "cel_device"]


class AllocationFailed(InvalidRequest):
    """A claim the published pools cannot satisfy (or one this model does not cover)."""


@dataclass(frozen=True)
class Result:
    """One allocated device, as `status.allocation.devices.results[]` names it."""

    claim: str
    request: str
    driver: str
    pool: str
    device: str
    consumed: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Allocation:
    """The results of one pod's claims, in order."""

    results: list[Result] = field(default_factory=list)


@dataclass
class _Device:
    driver: str
    pool: str
    name: str
    raw: dict[str, Any]
    shared: bool
    capacity: dict[str, Decimal]
    activation: dict[str, Any]


def _s(text: str) -> celtypes.StringType:
    return celtypes.StringType(text)


def _cel_value(attribute: Mapping[str, Any]) -> Any:
    if "string" in attribute:
        return _s(str(attribute["string"]))
    if "bool" in attribute:
        return celtypes.BoolType(bool(attribute["bool"]))
    if "int" in attribute:
        return celtypes.IntType(int(attribute["int"]))
    if "version" in attribute:
        parts = str(attribute["version"]).split("-", 1)[0].split(".")
        major, minor, patch = (int(p) for p in [*parts, "0", "0"][:3])
        return Semver((major, minor, patch))
    raise InvalidRequest(f"attribute {attribute!r} has no known type")


def _qualified(name: str, driver: str) -> tuple[str, str]:
    domain, sep, short = name.rpartition("/")
    return (domain, short) if sep else (driver, name)


def cel_device(driver: str, device: Mapping[str, Any]) -> dict[str, Any]:
    """A published device as CEL selectors see it (`device.driver`, `device.attributes[domain]`,
    `device.capacity[domain]`, `device.allowMultipleAllocations`)."""
    attributes: dict[celtypes.StringType, dict[celtypes.StringType, Any]] = {}
    for name, attribute in (device.get("attributes") or {}).items():
        domain, short = _qualified(str(name), driver)
        attributes.setdefault(_s(domain), {})[_s(short)] = _cel_value(attribute)
    capacity: dict[celtypes.StringType, dict[celtypes.StringType, Any]] = {}
    for name, entry in (device.get("capacity") or {}).items():
        domain, short = _qualified(str(name), driver)
        capacity.setdefault(_s(domain), {})[_s(short)] = Quantity(parse_quantity(entry["value"]))
    value = celtypes.MapType(
        {
            _s("driver"): _s(driver),
            _s("attributes"): celtypes.MapType(
                {k: celtypes.MapType(v) for k, v in attributes.items()}
            ),
            _s("capacity"): celtypes.MapType({k: celtypes.MapType(v) for k, v in capacity.items()}),
            _s("allowMultipleAllocations"): celtypes.BoolType(
                bool(device.get("allowMultipleAllocations", False))
            ),
        }
    )
    return {"device": value}


def _complete_pools(slices: Iterable[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Each pool's slices of its highest generation, only where all of them exist; pools by
    driver then name, slices by name."""
    by_pool: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for slice_ in slices:
        spec = slice_.get("spec") or {}
        key = (str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", "")))
        by_pool.setdefault(key, []).append(slice_)
    pools: list[list[Mapping[str, Any]]] = []
    for key in sorted(by_pool):
        members = by_pool[key]
        top = max(int(s["spec"]["pool"].get("generation", 0)) for s in members)
        current = [s for s in members if int(s["spec"]["pool"].get("generation", 0)) == top]
        wanted = int(current[0]["spec"]["pool"].get("resourceSliceCount", 1))
        if len(current) == wanted:
            pools.append(sorted(current, key=lambda s: str(s["metadata"]["name"])))
    return pools


class Allocator:
    """The published pools and what is allocated of them; `allocate` adds a pod's claims."""

    def __init__(
        self,
        slices: Iterable[Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
        allocated: Iterable[Result] = (),
    ) -> None:
        self.classes = classes
        self.devices: list[_Device] = []
        self.counters: dict[tuple[str, str, str, str], Decimal] = {}
        for pool in _complete_pools(slices):
            for slice_ in pool:
                self._read(slice_)
        self.taken: dict[tuple[str, str, str], list[Result]] = {}
        for result in allocated:
            self._take(result)

    def _read(self, slice_: Mapping[str, Any]) -> None:
        spec = slice_["spec"]
        driver, pool = str(spec["driver"]), str(spec["pool"]["name"])
        for counter_set in spec.get("sharedCounters") or []:
            for name, counter in (counter_set.get("counters") or {}).items():
                key = (driver, pool, str(counter_set["name"]), str(name))
                self.counters[key] = parse_quantity(counter["value"])
        for device in spec.get("devices") or []:
            capacity = {
                _qualified(str(n), driver)[1]: parse_quantity(c["value"])
                for n, c in (device.get("capacity") or {}).items()
            }
            self.devices.append(
                _Device(
                    driver,
                    pool,
                    str(device["name"]),
                    dict(device),
                    bool(device.get("allowMultipleAllocations", False)),
                    capacity,
                    cel_device(driver, device),
                )
            )

    def _device(self, result: Result) -> _Device | None:
        return next(
            (
                d
                for d in self.devices
                if (d.driver, d.pool, d.name) == (result.driver, result.pool, result.device)
            ),
            None,
        )

    def _take(self, result: Result) -> None:
        key = (result.driver, result.pool, result.device)
        first = key not in self.taken
        self.taken.setdefault(key, []).append(result)
        device = self._device(result)
        if device is None or not first:
            return  # a shared device consumes its counters once
        for use in device.raw.get("consumesCounters") or []:
            for name, counter in (use.get("counters") or {}).items():
                ckey = (device.driver, device.pool, str(use["counterSet"]), str(name))
                self.counters[ckey] = self.counters.get(ckey, Decimal(0)) - parse_quantity(
                    counter["value"]
                )

    def _counters_fit(self, device: _Device) -> bool:
        if (device.driver, device.pool, device.name) in self.taken:
            return True  # a shared device already consumed them
        for use in device.raw.get("consumesCounters") or []:
            for name, counter in (use.get("counters") or {}).items():
                key = (device.driver, device.pool, str(use["counterSet"]), str(name))
                if self.counters.get(key, Decimal(0)) < parse_quantity(counter["value"]):
                    return False
        return True

    def _consumed(self, device: _Device, requests: Mapping[str, Decimal]) -> dict[str, Decimal]:
        """What a request takes of a shared device's capacity (rounded up by its policy), or
        {} for an exclusive device; raises LookupError when it does not fit."""
        if not device.shared:
            return {}
        taken: dict[str, Decimal] = {}
        for name, total in device.capacity.items():
            entry = (device.raw.get("capacity") or {}).get(name) or {}
            policy = entry.get("requestPolicy") or {}
            ask = requests.get(name)
            if ask is None:
                ask = parse_quantity(policy["default"]) if "default" in policy else total
            valid = [parse_quantity(v) for v in policy.get("validValues") or []]
            if valid:
                ask = next((v for v in valid if v >= ask), Decimal(-1))
                if ask < 0:
                    raise LookupError(name)
            used = sum(
                (parse_quantity(r.consumed.get(name, "0")) for r in self.taken.get(
                    (device.driver, device.pool, device.name), []
                )),
                Decimal(0),
            )  # fmt: skip
            if used + ask > total:
                raise LookupError(name)
            taken[name] = ask
        return taken

    def _matches(self, device: _Device, expressions: Sequence[str]) -> bool:
        for expression in expressions:
            try:
                if not evaluate(compile_selector(expression), device.activation):
                    return False
            except CelError as exc:
                raise AllocationFailed(
                    f"a selector failed on device {device.name}: {exc}"
                ) from None
        return True

    def _selectors(self, request: Mapping[str, Any]) -> list[str]:
        name = str(request.get("deviceClassName", ""))
        device_class = self.classes.get(name)
        if device_class is None:
            raise AllocationFailed(f"device class {name!r} is not known")
        found = [
            str(s["cel"]["expression"])
            for s in (device_class.get("spec") or {}).get("selectors") or []
            if "cel" in s
        ]
        found += [str(s["cel"]["expression"]) for s in request.get("selectors") or [] if "cel" in s]
        return found

    def _fill(self, claim: str, name: str, request: Mapping[str, Any]) -> list[Result] | None:
        """Devices for one request (nothing taken yet), None when it does not fit."""
        if request.get("adminAccess"):
            raise AllocationFailed(f"request {name}: adminAccess is not modelled")
        selectors = self._selectors(request)
        mode = request.get("allocationMode", "ExactCount")
        count = int(request.get("count", 1))
        asks = {
            str(k): parse_quantity(v)
            for k, v in ((request.get("capacity") or {}).get("requests") or {}).items()
        }
        chosen: list[Result] = []
        for device in self.devices:
            if mode != "All" and len(chosen) == count:
                break
            key = (device.driver, device.pool, device.name)
            if key in self.taken and not device.shared:
                continue
            if any((r.driver, r.pool, r.device) == key for r in chosen):
                continue
            if not self._matches(device, selectors) or not self._counters_fit(device):
                continue
            try:
                consumed = self._consumed(device, asks)
            except LookupError:
                continue
            if (
                asks
                and not device.shared
                and any(device.capacity.get(k, Decimal(0)) < v for k, v in asks.items())
            ):
                continue
            shown = {k: format(v.normalize(), "f") for k, v in consumed.items()}
            chosen.append(Result(claim, name, device.driver, device.pool, device.name, shown))
        if mode == "All":
            return chosen or None
        return chosen if len(chosen) == count else None

    def allocate_claim(self, claim: str, spec: Mapping[str, Any]) -> list[Result]:
        """Allocate one claim's requests in order (each taken before the next is filled)."""
        devices = spec.get("devices") or {}
        if devices.get("constraints"):
            raise AllocationFailed(f"claim {claim}: constraints are not modelled")
        results: list[Result] = []
        for request in devices.get("requests") or []:
            name = str(request.get("name", ""))
            options: list[tuple[str, Mapping[str, Any]]]
            if "firstAvailable" in request:
                options = [
                    (f"{name}/{sub.get('name', '')}", sub) for sub in request["firstAvailable"]
                ]
            else:
                options = [(name, request.get("exactly") or {})]
            for option_name, option in options:
                fill = self._fill(claim, option_name, option)
                if fill is not None:
                    for result in fill:
                        self._take(result)
                    results.extend(fill)
                    break
            else:
                raise AllocationFailed(f"claim {claim}: no published device fits request {name!r}")
        return results
