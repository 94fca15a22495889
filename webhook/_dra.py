"""DRA claims into device units: what each `spec.resourceClaims` entry asks of the pod VM.

For each claim (a ResourceClaim, or the ResourceClaimTemplate a claim will be made from) every
request is matched against the catalog's virtual devices (`_devices.py`) with the DeviceClass
selectors and the request's own, both CEL. Rules, as applied to a VM yet to be chosen:

- `exactly` (or the v1beta1 flat form): `count` devices (default 1) of the matching kind.
  Matching whole GPUs give a `gpu` unit whose models are the matching GPU models; matching MIG
  devices only give a `mig` unit of the smallest matching profile.
- `allocationMode: All` means every matching device of the node; a peer pod's node is its own VM,
  so it means every GPU of the VM: the GPU count of the user's allowed `machine_type` when one
  is set, else of the largest catalog type carrying a matching model. MIG devices with All are
  denied (no layout exists before boot).
- `firstAvailable`: the first subrequest the catalog can serve wins (as the scheduler would).
- `capacity.requests.memory` (consumable capacity): a share of one GPU, served by the smallest
  matching MIG profile at least that large, else a fractional GPU share at least that large,
  else one whole matching GPU.
- `constraints[].matchAttribute`: on `parentUUID` the named MIG requests must fit one GPU
  together (checked with the placement packer); on a model attribute (`productName`,
  `architecture`, `brand`, `cudaComputeCapability`, `type`) it holds by construction, since a
  VM carries one GPU model; on any other attribute (e.g. `uuid`) the claim is denied.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from providers.contract import DeviceUnit
from providers.errors import InvalidRequest
from providers.mig import pack, profiles_for
from providers.quantity import to_mib
from webhook._devices import DeviceSpace, Match, VirtualDevice
from webhook._resolver import Resolver

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_MODEL_ATTRIBUTES = ("productName", "architecture", "brand", "cudaComputeCapability", "type")


class ClaimDenied(InvalidRequest):
    """A claim that cannot be translated; the message names the claim and request."""


@dataclass(frozen=True)
class ClaimUnit:
    """One request of one pod claim, as a device unit with its VM-level constraints."""

    claim: str
    request: str
    unit: DeviceUnit
    models: frozenset[str] | None = None  # acceptable GPU models (None: any)
    memory_mib: int = 0  # minimum memory per GPU (a capacity share)
    fractional: bool = False


@dataclass
class Translation:
    units: list[ClaimUnit] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _checked_name(value: Any, what: str) -> str:
    text = str(value or "")
    if not _NAME.match(text):
        raise ClaimDenied(f"{what}: {text!r} is not a valid object name")
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


def _selectors(items: Any, where: str) -> list[str]:
    out: list[str] = []
    for item in items or []:
        expression = (
            (item or {}).get("cel", {}).get("expression") if isinstance(item, dict) else None
        )
        if not isinstance(expression, str) or not expression.strip():
            raise ClaimDenied(f"{where}: a selector without a CEL expression")
        out.append(expression)
    return out


def _smallest_profile(
    devices: tuple[VirtualDevice, ...], at_least_mib: int = 0
) -> ClaimUnit | None:
    fitting = [d for d in devices if d.memory_mib >= at_least_mib]
    if not fitting:
        return None
    best = min(
        fitting,
        key=lambda d: (d.memory_mib, profiles_for(d.model)[d.profile].compute_slices, d.profile),
    )
    models = frozenset(d.model for d in fitting if d.profile == best.profile)
    unit = DeviceUnit(id="x", kind="mig", count=1, profile=best.profile)
    return ClaimUnit("", "", unit, models)


class _Translator:
    def __init__(self, space: DeviceSpace, resolver: Resolver, machine_gpus: int | None) -> None:
        self.space = space
        self.resolver = resolver
        self.machine_gpus = machine_gpus
        self.warnings: list[str] = []

    def option(self, opt: Mapping[str, Any], where: str) -> ClaimUnit | str:
        """The unit one (sub)request asks for, or why the catalog cannot serve it."""
        class_name = _checked_name(opt.get("deviceClassName"), f"{where}: deviceClassName")
        device_class = self.resolver.device_class(class_name)
        class_spec = device_class.get("spec") or {}
        expressions = _selectors(class_spec.get("selectors"), f"DeviceClass {class_name}")
        expressions += _selectors(opt.get("selectors"), where)
        match, error = self.space.match(expressions)
        if not match.devices:
            detail = f" (selector error: {error})" if error else ""
            return f"no catalog device matches DeviceClass {class_name} and the selectors{detail}"
        mode = opt.get("allocationMode") or "ExactCount"
        count = opt.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1 or count > 64:
            raise ClaimDenied(f"{where}: count must be 1..64, got {count!r}")
        capacity = (opt.get("capacity") or {}).get("requests") or {}
        if capacity:
            return self.share(match, capacity, where, count)
        if mode == "All":
            return self.all_devices(match, where)
        if mode != "ExactCount":
            raise ClaimDenied(f"{where}: unknown allocationMode {mode!r}")
        if match.gpu_models:
            models = match.gpu_models
            most = max(self.space.max_count.get(m, 0) for m in models)
            if count > most:
                return f"{count} GPUs of {'|'.join(sorted(models))}: the largest type has {most}"
            return ClaimUnit("", "", DeviceUnit(id="x", kind="gpu", count=count), models)
        found = _smallest_profile(match.mig)
        if found is None:
            return "no matching device"
        return ClaimUnit("", "", found.unit.model_copy(update={"count": count}), found.models)

    def share(
        self, match: Match, capacity: Mapping[str, Any], where: str, count: int
    ) -> ClaimUnit | str:
        unknown = sorted(set(capacity) - {"memory"})
        if unknown:
            raise ClaimDenied(
                f"{where}: capacity request {', '.join(unknown)} is not supported (memory only)"
            )
        if count != 1:
            raise ClaimDenied(f"{where}: a capacity request takes a share of one device (count 1)")
        try:
            need = to_mib(capacity["memory"])
        except InvalidRequest as exc:
            raise ClaimDenied(f"{where}: capacity.requests.memory: {exc}") from None
        models = match.gpu_models
        mig = (
            tuple(d for d in self.space.devices if d.kind == "mig" and d.model in models)
            + match.mig
        )
        found = _smallest_profile(mig, need)
        if found is not None:
            return found
        shares = {m for m in models if self.space.share_mib.get(m, 0) >= need}
        if shares:
            unit = DeviceUnit(id="x", kind="gpu", count=1)
            return ClaimUnit("", "", unit, frozenset(shares), need, fractional=True)
        whole = frozenset(
            d.model for d in match.devices if d.kind == "gpu" and d.memory_mib >= need
        )
        if whole:
            return ClaimUnit("", "", DeviceUnit(id="x", kind="gpu", count=1), whole, need)
        return f"no MIG slice, GPU share or GPU of a matching model has {need} MiB"

    def all_devices(self, match: Match, where: str) -> ClaimUnit | str:
        if not match.gpu_models:
            raise ClaimDenied(
                f"{where}: allocationMode All on MIG devices is not supported "
                "(the MIG layout of a VM is unknown before it boots)"
            )
        models = match.gpu_models
        if self.machine_gpus:
            count = self.machine_gpus
        else:
            count = max(self.space.max_count.get(m, 0) for m in models)
            largest = [m for m in models if self.space.max_count.get(m, 0) == count]
            models = frozenset(largest)
        self.warnings.append(f"{where}: allocationMode All means every GPU of the pod VM: {count}")
        return ClaimUnit("", "", DeviceUnit(id="x", kind="gpu", count=count), models)

    def request(self, req: Mapping[str, Any], claim: str, where: str) -> tuple[str, ClaimUnit]:
        name = _checked_name(req.get("name"), f"{where}: request name")
        here = f"{where} request {name}"
        if "firstAvailable" in req:
            reasons: list[str] = []
            for sub in req.get("firstAvailable") or []:
                sub_name = _checked_name(sub.get("name"), f"{here}: subrequest name")
                result = self.option(sub, f"{here}/{sub_name}")
                if isinstance(result, ClaimUnit):
                    return name, result
                reasons.append(f"{sub_name}: {result}")
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

    def constraints(self, spec: Mapping[str, Any], units: dict[str, ClaimUnit], where: str) -> None:
        for constraint in spec.get("constraints") or []:
            attribute = str((constraint or {}).get("matchAttribute") or "")
            names = list((constraint or {}).get("requests") or units)
            short = attribute.rsplit("/", 1)[-1]
            missing = [n for n in names if n.split("/", 1)[0] not in units]
            if missing:
                raise ClaimDenied(f"{where}: constraint names unknown request {missing[0]}")
            group = [units[n.split("/", 1)[0]] for n in names]
            if short in _MODEL_ATTRIBUTES:
                continue  # one GPU model per VM: holds by construction
            if short != "parentUUID":
                raise ClaimDenied(
                    f"{where}: matchAttribute {attribute} cannot be checked before the pod VM boots"
                )
            if any(u.unit.kind != "mig" for u in group):
                raise ClaimDenied(
                    f"{where}: matchAttribute {attribute} needs MIG devices "
                    "(whole GPUs have no parent)"
                )
            profiles: dict[str, int] = {}
            for u in group:
                profiles[u.unit.profile] = profiles.get(u.unit.profile, 0) + u.unit.count
            candidates = frozenset.intersection(*(u.models or self.space.models for u in group))
            fitting = frozenset(m for m in candidates if pack(m, profiles, 1) is not None)
            if not fitting:
                wanted = ", ".join(f"{p} x{n}" for p, n in sorted(profiles.items()))
                raise ClaimDenied(
                    f"{where}: MIG devices {wanted} do not fit on one GPU of any catalog model"
                )
            for key in {n.split("/", 1)[0] for n in names}:
                units[key] = ClaimUnit(
                    units[key].claim,
                    units[key].request,
                    units[key].unit,
                    fitting & (units[key].models or fitting),
                    units[key].memory_mib,
                    units[key].fractional,
                )


def translate(
    pod: Mapping[str, Any],
    namespace: str,
    resolver: Resolver,
    space: DeviceSpace,
    machine_gpus: int | None = None,
) -> Translation:
    """Every pod claim as device units (ClaimDenied, ObjectNotFound or LookupFailed on failure)."""
    entries = (pod.get("spec") or {}).get("resourceClaims") or []
    if not isinstance(entries, list):
        raise InvalidRequest("spec.resourceClaims is not a list")
    translator = _Translator(space, resolver, machine_gpus)
    out = Translation()
    for entry in entries:
        if not isinstance(entry, dict):
            raise InvalidRequest("spec.resourceClaims has an entry that is not an object")
        claim = _checked_name(entry.get("name"), "spec.resourceClaims[].name")
        where = f"claim {claim}"
        spec = _claim_spec(entry, namespace, resolver)
        requests = (spec.get("devices") or {}).get("requests") or []
        units: dict[str, ClaimUnit] = {}
        for req in requests:
            if not isinstance(req, dict):
                raise ClaimDenied(f"{where}: malformed request")
            name, unit = translator.request(req, claim, where)
            if name in units:
                raise ClaimDenied(f"{where}: request {name} appears twice")
            units[name] = unit
        translator.constraints(spec.get("devices") or {}, units, where)
        for name, unit in units.items():
            uid = f"claim-{claim}-{name}"
            out.units.append(
                ClaimUnit(
                    claim,
                    name,
                    unit.unit.model_copy(update={"id": uid}),
                    unit.models,
                    unit.memory_mib,
                    unit.fractional,
                )
            )
    out.warnings.extend(translator.warnings)
    return out
