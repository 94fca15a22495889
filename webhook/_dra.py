"""DRA claims into device units: what each `spec.resourceClaims` entry asks of the pod VM.

For each claim (a ResourceClaim, or the ResourceClaimTemplate a claim will be made from) every
request is matched against the catalog's virtual devices (`_devices.py`) with the DeviceClass
selectors and the request's own, both CEL: the class is honoured (a class admitting only whole
GPUs is never served by a MIG device). A request does not narrow to one answer here: every way
the catalog can serve it stays an alternative, and the webhook picks the combination whose pod VM
is cheapest (`_choose.py`). Rules, as applied to a VM yet to be chosen:

- `exactly` (or the v1beta1 flat form): `count` devices (default 1). Matching whole GPUs are one
  alternative (their models, and their product names and memory when the match leaves out other
  forms of those models); each matching MIG profile is another.
- `allocationMode: All` means every matching device of the node; a peer pod's node is its own VM,
  so it means every GPU of the VM: the GPU count of the user's allowed `machine_type` when one
  is set, else of the largest catalog type carrying a matching model. MIG devices with All are
  denied (no layout exists before boot).
- `firstAvailable`: the first subrequest the catalog can serve wins (as the scheduler would).
- `capacity.requests.memory` (KEP-5075 consumable capacity): a share of one device. Every
  matching MIG profile at least that large, every matching shareable GPU whose `requestPolicy`
  admits the request (rounded up to its next valid value: that is the share taken), and every
  matching whole GPU at least that large are alternatives.
- `constraints[].matchAttribute`: on `parentUUID` the named MIG requests must fit one GPU
  together (checked with the placement packer, per combination); on a model attribute
  (`productName`, `architecture`, `brand`, `cudaComputeCapability`, `type`) it holds by
  construction, since a VM carries one GPU model; on any other attribute (e.g. `uuid`) the claim
  is denied.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from providers.core.contract import DeviceUnit
from providers.core.errors import InvalidRequest
from providers.core.mig import pack, profiles_for
from providers.core.quantity import to_mib
from providers.core.skus import product_key
from webhook._devices import (
    DRIVER,
    NO_LIMITS,
    POST_BOOT_ATTRIBUTES,
    DeviceSpace,
    Match,
    SelectorLimits,
    VirtualDevice,
)
from webhook._resolver import Resolver

# the contract's limit on a unit id (DeviceUnit.id's max_length)
UNIT_ID_MAX: int = next(
    int(getattr(m, "max_length", 0))
    for m in DeviceUnit.model_fields["id"].metadata
    if getattr(m, "max_length", None)
)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_MODEL_ATTRIBUTES = ("productName", "architecture", "brand", "cudaComputeCapability", "type")


class ClaimDenied(InvalidRequest):
    """A claim that cannot be translated; the message names the claim and request."""


@dataclass(frozen=True)
class ClaimUnit:
    """One way to serve one request of one pod claim: a device unit and its VM constraints."""

    claim: str
    request: str
    unit: DeviceUnit
    models: frozenset[str] | None = None  # acceptable GPU models (None: any)
    memory_mib: int = 0  # minimum memory per GPU (a capacity share, or a narrowed form)
    fractional: bool = False
    products: frozenset[str] | None = None  # acceptable product keys (None: any form)
    # firstAvailable: which subrequest this unit serves (0: the first, or no firstAvailable);
    # an earlier one wins whenever the pod can run on any type it matches
    tier: int = 0
    subrequest: str = ""


@dataclass(frozen=True)
class ClaimRequest:
    """One request of one claim and every way the catalog can serve it, preferred first."""

    claim: str
    request: str
    alternatives: tuple[ClaimUnit, ...]


@dataclass(frozen=True)
class _Constraint:
    claim: str
    attribute: str
    requests: tuple[str, ...]
    where: str


@dataclass
class Translation:
    requests: list[ClaimRequest] = field(default_factory=list)
    constraints: list[_Constraint] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def combinations(self) -> int:
        total = 1
        for request in self.requests:
            total *= len(request.alternatives)
        return total

    def assignments(self) -> Iterator[tuple[ClaimUnit, ...]]:
        """Every choice of one alternative per request, preferred alternatives first."""
        return itertools.product(*(r.alternatives for r in self.requests))

    def resolve(self, chosen: Sequence[ClaimUnit], space: DeviceSpace) -> list[ClaimUnit]:
        """The chosen units with the claims' constraints applied (ClaimDenied if violated)."""
        units = list(chosen)
        for constraint in self.constraints:
            index = [
                i
                for i, u in enumerate(units)
                if u.claim == constraint.claim and u.request in constraint.requests
            ]
            group = [units[i] for i in index]
            if any(u.unit.kind != "mig" for u in group):
                raise ClaimDenied(
                    f"{constraint.where}: matchAttribute {_attribute(constraint.attribute)} "
                    "needs MIG devices (whole GPUs have no parent)"
                )
            profiles: dict[str, int] = {}
            for u in group:
                profiles[u.unit.profile] = profiles.get(u.unit.profile, 0) + u.unit.count
            candidates = frozenset.intersection(*(u.models or space.models for u in group))
            fitting = frozenset(m for m in candidates if pack(m, profiles, 1) is not None)
            if not fitting:
                wanted = ", ".join(f"{p} x{n}" for p, n in sorted(profiles.items()))
                raise ClaimDenied(
                    f"{constraint.where}: MIG devices {wanted} do not fit on one GPU of any "
                    "catalog model"
                )
            for i in index:
                units[i] = replace(units[i], models=fitting & (units[i].models or fitting))
        return units

    @property
    def units(self) -> list[ClaimUnit]:
        """The first valid combination (preferred alternatives), for callers without prices."""
        return self.first_valid(None)

    def first_valid(self, space: DeviceSpace | None) -> list[ClaimUnit]:
        error: ClaimDenied | None = None
        for chosen in itertools.islice(self.assignments(), 256):
            try:
                return self.resolve(chosen, space) if space is not None else list(chosen)
            except ClaimDenied as exc:
                error = error or exc
        assert error is not None
        raise error


def _attribute(attribute: str) -> str:
    """An attribute for a message: a name the driver publishes, else no text from the claim."""
    short = attribute.rsplit("/", 1)[-1]
    known = (*_MODEL_ATTRIBUTES, *POST_BOOT_ATTRIBUTES)
    return f"{DRIVER}/{short}" if short in known else "(an attribute no driver publishes)"


def _checked_name(value: Any, what: str) -> str:
    text = str(value or "")
    if not _NAME.fullmatch(text):
        # the value is not quoted: it may come from an object the review's sender cannot read
        raise ClaimDenied(f"{what}: not a valid object name")
    return text


def _claim_spec(entry: Mapping[str, Any], namespace: str, resolver: Resolver) -> dict[str, Any]:
    name = str(entry.get("name", ""))
    if entry.get("resourceClaimName"):
        claim_name = _checked_name(entry["resourceClaimName"], f"claim {name}")
        spec = resolver.claim(namespace, claim_name).get("spec")
    elif entry.get("resourceClaimTemplateName"):
        template = _checked_name(entry["resourceClaimTemplateName"], f"claim {name}")
        outer = resolver.claim_template(namespace, template).get("spec") or {}
        spec = outer.get("spec") if isinstance(outer, dict) else None
    else:
        raise ClaimDenied(f"claim {name}: names neither resourceClaimName nor a template")
    if not isinstance(spec, dict):
        raise ClaimDenied(f"claim {name}: the claim has no spec")
    return spec


def _selectors(items: Any, where: str) -> list[tuple[str, str]]:
    """(where the selector stands, its expression) for each selector: messages name a selector
    by its place, never by its text."""
    out: list[tuple[str, str]] = []
    for index, item in enumerate(items or [], 1):
        expression = (
            (item or {}).get("cel", {}).get("expression") if isinstance(item, dict) else None
        )
        if not isinstance(expression, str) or not expression.strip():
            raise ClaimDenied(f"{where}: a selector without a CEL expression")
        out.append((f"selector {index} of {where}", expression))
    return out


def _unit(kind: str, count: int, profile: str = "") -> DeviceUnit:
    return DeviceUnit(id="x", kind="mig" if kind == "mig" else "gpu", count=count, profile=profile)


def _forms(
    space: DeviceSpace, chosen: Sequence[VirtualDevice]
) -> tuple[frozenset[str], frozenset[str] | None, int]:
    """Models, product keys (None: every form of them) and a memory floor for matched GPUs.

    A selector may accept some forms of a model and not others (the PCIe A100 80GB, not the SXM4
    one; a type reporting less memory): the narrowing is kept as product keys and as the least
    memory among accepted forms when a rejected form of the same product has less.
    """
    models = frozenset(d.model for d in chosen)
    accepted = {(d.model, d.product) for d in chosen}
    every = {(m, p) for m, p in space.products if m in models}
    products = frozenset(product_key(p) for _, p in accepted) if accepted != every else None
    floor = min(d.memory_mib for d in chosen)
    ids = {d.id for d in chosen}
    smaller = any(
        d.kind == "gpu"
        and (d.model, d.product) in accepted
        and d.id not in ids
        and d.memory_mib < floor
        for d in space.devices
    )
    return models, products, floor if smaller else 0


def _mig_alternatives(devices: Sequence[VirtualDevice], count: int) -> list[ClaimUnit]:
    """One alternative per matching MIG profile name, smallest first."""
    by_profile: dict[str, list[VirtualDevice]] = {}
    for d in devices:
        by_profile.setdefault(d.profile, []).append(d)

    def size(name: str) -> tuple[int, int, str]:
        d = by_profile[name][0]
        return d.memory_mib, profiles_for(d.model)[name].compute_slices, name

    out: list[ClaimUnit] = []
    for profile in sorted(by_profile, key=size):
        group = by_profile[profile]
        models = frozenset(d.model for d in group)
        out.append(ClaimUnit("", "", _unit("mig", count, profile), models))
    return out


class _Translator:
    def __init__(
        self,
        space: DeviceSpace,
        resolver: Resolver,
        machine_gpus: int | None,
        limits: SelectorLimits,
    ) -> None:
        self.space = space
        self.resolver = resolver
        self.machine_gpus = machine_gpus
        self.limits = limits
        self.warnings: list[str] = []

    def option(self, opt: Mapping[str, Any], where: str) -> list[ClaimUnit] | str:
        """Every unit one (sub)request could be, or why the catalog cannot serve it."""
        class_name = _checked_name(opt.get("deviceClassName"), f"{where}: deviceClassName")
        device_class = self.resolver.device_class(class_name)
        class_spec = device_class.get("spec") or {}
        selectors = _selectors(class_spec.get("selectors"), f"DeviceClass {class_name}")
        selectors += _selectors(opt.get("selectors"), where)
        match, error = self.space.match(selectors, self.limits)
        if not match.devices:
            detail = f" ({error})" if error else ""
            return f"no catalog device matches DeviceClass {class_name} and the selectors{detail}"
        mode = opt.get("allocationMode") or "ExactCount"
        count = opt.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1 or count > 64:
            raise ClaimDenied(f"{where}: count must be a whole number 1..64")
        capacity = (opt.get("capacity") or {}).get("requests") or {}
        if capacity:
            return self.share(match, capacity, where, count)
        if mode == "All":
            return [self.all_devices(match, where)]
        if mode != "ExactCount":
            raise ClaimDenied(f"{where}: allocationMode must be ExactCount or All")
        out: list[ClaimUnit] = []
        reason = "no matching device"
        if match.gpus:
            models, products, floor = _forms(self.space, match.gpus)
            most = max(self.space.max_count.get(m, 0) for m in models)
            if count > most:
                reason = f"{count} GPUs of {'|'.join(sorted(models))}: the largest type has {most}"
            else:
                unit = _unit("gpu", count)
                out.append(ClaimUnit("", "", unit, models, floor, products=products))
        out += _mig_alternatives(match.mig, count)
        return out or reason

    def share(
        self, match: Match, capacity: Mapping[str, Any], where: str, count: int
    ) -> list[ClaimUnit] | str:
        unknown = sorted(set(capacity) - {"memory"})
        if unknown:
            raise ClaimDenied(f"{where}: capacity requests other than memory are not supported")
        if count != 1:
            raise ClaimDenied(f"{where}: a capacity request takes a share of one device (count 1)")
        try:
            need = to_mib(capacity["memory"])
        except InvalidRequest:
            raise ClaimDenied(
                f"{where}: capacity.requests.memory is not a valid quantity"
            ) from None
        # a MIG device is allocated whole: its memory must cover the request
        out = _mig_alternatives([d for d in match.mig if d.memory_mib >= need], 1)
        for device in match.gpus:
            if device.policy is None:
                continue
            consumed = device.policy.consumed(need)
            if consumed is None or consumed > device.memory_mib:
                continue
            models, products, _ = _forms(self.space, [device])
            unit = _unit("gpu", 1)
            out.append(ClaimUnit("", "", unit, models, consumed, True, products))
        whole = [d for d in match.gpus if d.policy is None and d.memory_mib >= need]
        if whole:
            models, products, _ = _forms(self.space, whole)
            out.append(ClaimUnit("", "", _unit("gpu", 1), models, need, products=products))
        if not out:
            return f"no MIG device, GPU share or GPU the class admits has {need} MiB"
        return out

    def all_devices(self, match: Match, where: str) -> ClaimUnit:
        whole = [d for d in match.gpus if d.policy is None]
        if not whole:
            raise ClaimDenied(
                f"{where}: allocationMode All on MIG devices is not supported "
                "(the MIG layout of a VM is unknown before it boots)"
            )
        models, products, floor = _forms(self.space, whole)
        if self.machine_gpus:
            count = self.machine_gpus
        else:
            count = max(self.space.max_count.get(m, 0) for m in models)
            largest = [m for m in models if self.space.max_count.get(m, 0) == count]
            models = frozenset(largest)
        self.warnings.append(f"{where}: allocationMode All means every GPU of the pod VM: {count}")
        return ClaimUnit("", "", _unit("gpu", count), models, floor, products=products)

    def request(self, req: Mapping[str, Any], where: str) -> tuple[str, list[ClaimUnit]]:
        name = _checked_name(req.get("name"), f"{where}: request name")
        here = f"{where} request {name}"
        if "firstAvailable" in req:
            # Every subrequest the catalog's devices match, in order: whether the pod can run
            # on a type they match (its architecture, how it buys, confidential or not) is
            # selection's to say, and the first that can be served wins (_choose.py).
            reasons: list[str] = []
            served: list[ClaimUnit] = []
            tier = 0
            for sub in req.get("firstAvailable") or []:
                sub_name = _checked_name(sub.get("name"), f"{here}: subrequest name")
                result = self.option(sub, f"{here}/{sub_name}")
                if isinstance(result, str):
                    reasons.append(f"{sub_name}: {result}")
                    continue
                served += [replace(u, tier=tier, subrequest=sub_name) for u in result]
                tier += 1
            if served:
                return name, served
            raise ClaimDenied(
                f"{here}: no subrequest can be served ({'; '.join(reasons) or 'none listed'})"
            )
        exactly = req.get("exactly") if "exactly" in req else req
        if not isinstance(exactly, dict):
            raise ClaimDenied(f"{here}: malformed request")
        result = self.option(exactly, here)
        if isinstance(result, str):
            raise ClaimDenied(f"{here}: {result}")
        return name, result

    def constraints(
        self,
        claim: str,
        spec: Mapping[str, Any],
        units: dict[str, list[ClaimUnit]],
        where: str,
    ) -> list[_Constraint]:
        out: list[_Constraint] = []
        for constraint in spec.get("constraints") or []:
            attribute = str((constraint or {}).get("matchAttribute") or "")
            names = list((constraint or {}).get("requests") or units)
            short = attribute.rsplit("/", 1)[-1]
            missing = [n for n in names if n.split("/", 1)[0] not in units]
            if missing:
                raise ClaimDenied(f"{where}: a constraint names a request the claim lacks")
            if short in _MODEL_ATTRIBUTES:
                continue  # one GPU model per VM: holds by construction
            if short != "parentUUID":
                raise ClaimDenied(
                    f"{where}: matchAttribute {_attribute(attribute)} cannot be checked before the "
                    "pod VM boots"
                )
            keys = tuple(dict.fromkeys(n.split("/", 1)[0] for n in names))
            for key in keys:  # only MIG devices have a parent
                mig = [u for u in units[key] if u.unit.kind == "mig"]
                if not mig:
                    raise ClaimDenied(
                        f"{where}: matchAttribute {_attribute(attribute)} needs MIG devices "
                        "(whole GPUs have no parent)"
                    )
                units[key] = mig
            out.append(_Constraint(claim, attribute, keys, where))
        return out


def translate(
    pod: Mapping[str, Any],
    namespace: str,
    resolver: Resolver,
    space: DeviceSpace,
    machine_gpus: int | None = None,
    limits: SelectorLimits = NO_LIMITS,
) -> Translation:
    """Every pod claim's requests with their alternatives (ClaimDenied, ObjectNotFound or
    LookupFailed on failure); the selectors are evaluated under the admission's `limits`."""
    entries = (pod.get("spec") or {}).get("resourceClaims") or []
    if not isinstance(entries, list):
        raise InvalidRequest("spec.resourceClaims is not a list")
    translator = _Translator(space, resolver, machine_gpus, limits)
    out = Translation()
    for entry in entries:
        if not isinstance(entry, dict):
            raise InvalidRequest("spec.resourceClaims has an entry that is not an object")
        claim = _checked_name(entry.get("name"), "spec.resourceClaims[].name")
        where = f"claim {claim}"
        spec = _claim_spec(entry, namespace, resolver)
        requests = (spec.get("devices") or {}).get("requests") or []
        units: dict[str, list[ClaimUnit]] = {}
        for req in requests:
            if not isinstance(req, dict):
                raise ClaimDenied(f"{where}: malformed request")
            name, alternatives = translator.request(req, where)
            if name in units:
                raise ClaimDenied(f"{where}: request {name} appears twice")
            units[name] = alternatives
        out.constraints += translator.constraints(claim, spec.get("devices") or {}, units, where)
        for name, alternatives in units.items():
            uid = f"claim-{claim}-{name}"
            if len(uid) > UNIT_ID_MAX:
                # admitted, it could never start: the adaptor refuses the plan's unit id
                raise ClaimDenied(
                    f"{where} request {name}: claim and request names are too long together "
                    f"(unit id {len(uid)} characters, at most {UNIT_ID_MAX}: shorten either name)"
                )
            out.requests.append(
                ClaimRequest(
                    claim,
                    name,
                    tuple(
                        replace(
                            a, claim=claim, request=name, unit=a.unit.model_copy(update={"id": uid})
                        )
                        for a in alternatives
                    ),
                )
            )
    out.warnings.extend(translator.warnings)
    return out
