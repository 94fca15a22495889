"""A pod in, the pod the adaptor can act on out: the admission decision with no HTTP in it.

`mutate_pod` reads what the pod asks for (resources, extended resources, DRA claims), writes the
annotation contract (`providers.core.contract`), removes what a worker node cannot offer, marks the
first container with `kata.peerpods.io/vm: 1` and returns the JSON Patch between the two.

The contract keys are always derived from the pod's resources and claims, never taken from what
a user wrote: the webhook seals what it writes (`providers.core.contract.seal`, a MAC under a
key only
the webhook holds), and only a pod carrying a valid seal over its contract keys is recognised as
one it already mutated (a reinvocation): a fixed point whose contract is kept (after the same
validation the adaptor applies) and whose patch is empty. Any other pod, even one carrying the
VM resource and contract keys, has its contract keys replaced by what its resources ask for. The
contract is written with the codec the adaptor reads it with (`providers.core.contract.Contract`),
so a value the adaptor would refuse is a denial here.

A denial is raised as a PeerpodsError: InvalidRequest for a pod that can never be admitted as
written, NoMatch for a valid request no catalog type can serve
(only when `impossible` is "deny"), LookupFailed when the Kubernetes API could not be read.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Literal

from providers.core.capacity import CapacityType
from providers.core.catalog import Catalog
from providers.core.contract import (
    CDI_PREFIX,
    DEFAULT_GPU_MODEL,
    GPU_QUOTA_RESOURCE,
    MACHINE_TYPE,
    MIG_QUOTA_RESOURCE,
    OWNED_KEYS,
    SEAL,
    VM_RESOURCE,
    ContainerPlan,
    Contract,
    DeviceUnit,
    GpuIntent,
    decode_capacity_type,
    encode_gpu_model,
    request_for,
    seal,
    seal_requests,
    sealed,
)
from providers.core.errors import InvalidRequest, NoMatch
from providers.core.request import InstanceRequest
from webhook._asks import request_digest
from webhook._capacity import CapacityPolicy
from webhook._catalog_view import CatalogView
from webhook._choose import choose
from webhook._devices import NO_LIMITS, SelectorLimits
from webhook._dra import ClaimUnit, translate
from webhook._extended import container_units, is_device_resource
from webhook._patch import Op, diff
from webhook._resolver import MemoryResolver, Resolver
from webhook._resources import container_lists, effective, is_sidecar, pod_resources
from webhook._scheduled import restore_scheduled, without_scheduled
from webhook._sealkeys import SealKeys
from webhook._settings import POLICY, WebhookPolicy

__all__ = [
    "MutationResult",
    "PodIntent",
    "Settings",
    "is_sealed",
    "mutate_pod",
    "quota_units",
    "refuse_hugepages",
    "strip_node_resources",
]

Pod = dict[str, Any]
_STRIPPED = ("cpu", "memory")


@dataclass(frozen=True)
class Settings:
    """Admission policy, built from the declared settings (`Settings.of`, webhook._settings),
    whose defaults are its own."""

    # Pods whose spec.runtimeClassName is one of these are peer pods; others pass untouched.
    runtime_classes: frozenset[str] = POLICY.runtime_classes
    # Instance types a user may pin with the machine_type annotation (empty: none).
    allowed_machine_types: frozenset[str] = frozenset(POLICY.allowed_machine_types)
    # A GPU request no catalog type can serve: "deny" the pod, or "warn" and admit it.
    impossible: Literal["deny", "warn"] = POLICY.impossible
    # The capacity type (Spot or on-demand) of a pod, by its annotation and its namespace.
    capacity: CapacityPolicy = field(default_factory=CapacityPolicy)
    # The key of the seal over the contract keys (every replica must share it: `peerpods
    # webhook` reads it from its own Secret, webhook._sealkeys). Unset: a random key of this
    # Settings object alone, so only what admits through the same object recognises its seals.
    seal_key: bytes = field(default_factory=lambda: os.urandom(32), repr=False)
    # Other keys whose seals are still recognised (a rotation's previous or next key).
    accepted_seal_keys: tuple[bytes, ...] = field(default=(), repr=False)
    # The DRA-driver mode: nvidia.com/gpu and claims stay for the scheduler (webhook._scheduled).
    dra_driver: bool = POLICY.dra_driver

    @classmethod
    def of(cls, policy: WebhookPolicy, keys: SealKeys | None = None) -> Settings:
        """The policy as the settings declare it, sealing under `keys` (None: a key of its
        own)."""
        sealing: dict[str, Any] = {}
        if keys is not None:
            sealing = {"seal_key": keys.current, "accepted_seal_keys": keys.accepted}
        return cls(
            runtime_classes=policy.runtime_classes,
            allowed_machine_types=frozenset(policy.allowed_machine_types),
            impossible=policy.impossible,
            capacity=CapacityPolicy.of(policy),
            dra_driver=policy.dra_driver,
            **sealing,
        )


def is_sealed(settings: Settings, namespace: str, annotations: Mapping[str, str]) -> bool:
    """Whether the pod carries a seal this webhook made, under any key it accepts."""
    keys = (settings.seal_key, *settings.accepted_seal_keys)
    return any(sealed(key, namespace, annotations) for key in keys)


@dataclass(frozen=True)
class PodIntent:
    """What the pod VM must offer, as the contract annotations carry it."""

    vcpus: int = 0
    memory_mib: int = 0
    gpu: GpuIntent = field(default_factory=GpuIntent)
    machine_type: str = ""
    # Spot or on-demand, from the pod's annotation and the namespace policy (webhook._capacity).
    capacity_type: CapacityType = CapacityType.ON_DEMAND

    def request(self) -> InstanceRequest:
        """The selection request, mapped exactly as the adaptor maps it at StartVM."""
        return request_for(
            self.vcpus, self.memory_mib, self.gpu, self.machine_type, self.capacity_type
        )


@dataclass(frozen=True)
class MutationResult:
    """The decision for one pod: the patch, the pod after it, and what it means."""

    patch: list[Op]
    pod: Pod
    warnings: list[str] = field(default_factory=list)
    intent: PodIntent | None = None  # None: not a peer pod, left untouched
    plan: ContainerPlan | None = None

    @property
    def changed(self) -> bool:
        return bool(self.patch)


def _annotations(pod: Pod) -> dict[str, str]:
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        raise InvalidRequest("pod has no metadata")
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
    ):
        raise InvalidRequest("metadata.annotations must map strings to strings")
    return dict(annotations)


def _has_translatable(resources: Any) -> bool:
    if not isinstance(resources, dict):
        return False
    if resources.get("claims"):
        return True
    for section in ("limits", "requests"):
        values = resources.get(section) or {}
        if isinstance(values, dict) and any(
            k in _STRIPPED or is_device_resource(str(k)) for k in values
        ):
            return True
    return False


def _looks_mutated(
    pod: Pod, annotations: Mapping[str, str], settings: Settings, namespace: str
) -> bool:
    """Whether the webhook already mutated this pod: contract keys sealed for what this pod
    asks for (a seal copied from another pod asking for anything else does not match), and
    nothing left to translate."""
    if not is_sealed(settings, namespace, annotations):
        return False
    if seal_requests(annotations) != request_digest(pod):
        return False
    init, app = container_lists(pod)
    spec = pod["spec"]
    if not app or spec.get("resourceClaims") or _has_translatable(spec.get("resources")):
        return False
    first = (app[0].get("resources") or {}).get("limits") or {}
    if not isinstance(first, dict) or VM_RESOURCE not in first:
        return False
    return not any(_has_translatable(c.get("resources")) for c in [*init, *app])


# Written by the webhook only: a user's own value is removed like a device resource.
_OWN = (VM_RESOURCE, GPU_QUOTA_RESOURCE, MIG_QUOTA_RESOURCE)


def quota_units(gpu: GpuIntent) -> dict[str, str]:
    """The countable resources a peer pod keeps for namespace quotas (none when zero)."""
    units = {GPU_QUOTA_RESOURCE: gpu.gpus, MIG_QUOTA_RESOURCE: sum(gpu.mig.values())}
    return {name: str(count) for name, count in units.items() if count}


def _strip_resources(
    container: dict[str, Any], vm: bool, quota: Mapping[str, str] | None = None
) -> None:
    resources = container.get("resources")
    resources = dict(resources) if isinstance(resources, dict) else {}
    resources.pop("claims", None)
    for section in ("limits", "requests"):
        values = dict(resources.get(section) or {})
        for key in list(values):
            if key in _STRIPPED or key in _OWN or is_device_resource(str(key)):
                del values[key]
        if vm:
            values[VM_RESOURCE] = "1"
            values.update(quota or {})
        if values:
            resources[section] = values
        else:
            resources.pop(section, None)
    if resources:
        container["resources"] = resources
    else:
        container.pop("resources", None)


def strip_node_resources(spec: dict[str, Any], quota: Mapping[str, str] | None = None) -> None:
    """Remove from a pod spec what the pod VM provides instead of the node (cpu, memory,
    devices, DRA claims) and mark its first container with the VM resource. The same input
    always gives the same spec: an UPDATE restoring what was removed is stripped to the live pod
    (`webhook._reapply`), which is all the API server lets an update keep. `quota`: the
    countable resources the first container keeps for namespace quotas (`quota_units`)."""
    spec.pop("resourceClaims", None)
    if isinstance(spec.get("resources"), dict):
        level = {k: v for k, v in spec["resources"].items() if k not in ("limits", "requests")}
        for section in ("limits", "requests"):
            values = {
                k: v
                for k, v in (spec["resources"].get(section) or {}).items()
                if k not in _STRIPPED
            }
            if values:
                level[section] = values
        if level:
            spec["resources"] = level
        else:
            spec.pop("resources")
    for container in spec.get("initContainers") or []:
        if isinstance(container, dict):
            _strip_resources(container, vm=False)
    for index, container in enumerate(spec.get("containers") or []):
        if isinstance(container, dict):
            _strip_resources(container, vm=index == 0, quota=quota if index == 0 else None)


def refuse_hugepages(pod: Pod) -> None:
    """Huge pages cannot be asked of a peer pod. The API server accepts hugepages only beside
    cpu or memory (ValidateResourceRequirements: "HugePages require cpu or memory"), which the
    webhook removes, and the node's huge pages are not the pod VM's anyway."""
    spec = pod["spec"]
    places = [(spec.get("resources"), "spec.resources")]
    for field_name in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(field_name) or []):
            if isinstance(container, dict):
                places.append((container.get("resources"), f"spec.{field_name}[{index}].resources"))
    for resources, where in places:
        if not isinstance(resources, dict):
            continue
        for section in ("limits", "requests"):
            values = resources.get(section)
            found = sorted(
                str(k)
                for k in (values if isinstance(values, dict) else {})
                if str(k).startswith("hugepages-")
            )
            if found:
                raise InvalidRequest(
                    f"{where}.{section}: {found[0]}: a peer pod cannot ask for huge pages (its "
                    "containers run in a cloud VM, not on the node's memory; the webhook removes "
                    "cpu and memory, which the API server requires beside hugepages)"
                )


def _claim_refs(
    container: Mapping[str, Any], where: str, by_claim: dict[str, list[ClaimUnit]]
) -> list[str]:
    refs = (container.get("resources") or {}).get("claims") or []
    if not isinstance(refs, list):
        raise InvalidRequest(f"{where}.resources.claims is not a list")
    ids: list[str] = []
    for ref in refs:
        name = str((ref or {}).get("name", "")) if isinstance(ref, dict) else ""
        if name not in by_claim:
            raise InvalidRequest(f"{where} uses claim {name!r}, not in spec.resourceClaims")
        request = str(ref.get("request") or "").split("/", 1)[0]
        units = [u for u in by_claim[name] if not request or u.request == request]
        if request and not units:
            raise InvalidRequest(f"{where} uses request {request!r} that claim {name} lacks")
        ids.extend(u.unit.id for u in units if u.unit.id not in ids)
    return ids


def _vm_gpu(
    init: list[dict[str, Any]],
    app: list[dict[str, Any]],
    per_container: dict[int, list[DeviceUnit]],
    claims: list[ClaimUnit],
    all_models: frozenset[str],
) -> GpuIntent:
    def total(pred: Any) -> int:
        def amount(c: Mapping[str, Any]) -> Decimal:
            return Decimal(sum(u.count for u in per_container[id(c)] if pred(u)))

        ext = effective(init, app, amount)
        return int(ext) + sum(c.unit.count for c in claims if pred(c.unit))

    profiles = {u.profile for units in per_container.values() for u in units if u.kind == "mig"}
    profiles |= {c.unit.profile for c in claims if c.unit.kind == "mig"}
    mig = {p: total(lambda u, p=p: u.kind == "mig" and u.profile == p) for p in sorted(profiles)}
    models: frozenset[str] | None = None
    for claim in claims:
        if claim.models is not None:
            models = claim.models if models is None else models & claim.models
    if models is not None and not models:
        raise InvalidRequest(
            "the pod's claims ask for different GPU models; one pod VM carries one GPU model"
        )
    if models is not None and models >= all_models:
        models = None
    products: frozenset[str] | None = None
    for claim in claims:
        if claim.products is not None:
            products = claim.products if products is None else products & claim.products
    if products is not None and not products:
        raise InvalidRequest(
            "the pod's claims ask for different GPU products; one pod VM carries one GPU form"
        )
    rdma = total(lambda u: u.kind == "rdma")
    return GpuIntent(
        gpus=total(lambda u: u.kind == "gpu"),
        models=tuple(sorted(models)) if models else (),
        products=tuple(sorted(products)) if products else (),
        memory_mib=max((c.memory_mib for c in claims), default=0),
        mig={p: n for p, n in mig.items() if n},
        fractional=any(c.fractional for c in claims),
        rdma=rdma > 0,
        rdma_devices=rdma if rdma > 1 else 0,
    )


def _translate(
    pod: Pod,
    namespace: str,
    resolver: Resolver,
    view: CatalogView | None,
    machine_type: str,
    warnings: list[str],
    capacity: CapacityType = CapacityType.ON_DEMAND,
    limits: SelectorLimits = NO_LIMITS,
) -> tuple[PodIntent, ContainerPlan]:
    init, app = container_lists(pod)
    resources = pod_resources(pod)
    named = [(c, f"spec.initContainers[{i}]") for i, c in enumerate(init)]
    named += [(c, f"spec.containers[{i}]") for i, c in enumerate(app)]
    per_container = {id(c): container_units(c, where) for c, where in named}
    claims: list[ClaimUnit] = []
    all_models: frozenset[str] = frozenset()
    if pod["spec"].get("resourceClaims"):
        if view is None:
            raise InvalidRequest("DRA claims need a catalog (--provider/--region) to match against")
        space = view.space
        all_models = space.models
        machine_gpus = None
        if machine_type:
            chosen = view.catalog.by_name().get(machine_type)
            if chosen is not None and chosen.gpu is not None:
                machine_gpus = chosen.gpu.count
        translation = translate(pod, namespace, resolver, space, machine_gpus, limits)
        known = space.models

        def request_for(units: list[ClaimUnit]) -> InstanceRequest:
            gpu = _vm_gpu(init, app, per_container, units, known)
            vm = PodIntent(resources.vcpus, resources.memory_mib, gpu, machine_type, capacity)
            return vm.request()  # DRA alternatives of a Spot pod rank by Spot prices

        claims = choose(translation, view, request_for)
        warnings.extend(translation.warnings)
    gpu = _vm_gpu(init, app, per_container, claims, all_models)
    plan = _container_plan(init, named, per_container, claims, all_models)
    intent = PodIntent(resources.vcpus, resources.memory_mib, gpu, machine_type)
    return intent, plan


def _container_plan(
    init: list[dict[str, Any]],
    named: list[tuple[dict[str, Any], str]],
    per_container: dict[int, list[DeviceUnit]],
    claims: list[ClaimUnit],
    all_models: frozenset[str],
) -> ContainerPlan:
    """Which devices each container gets: its own resources' units and the claims it names
    (a claim's models kept only where they narrow the catalog's)."""
    by_claim: dict[str, list[ClaimUnit]] = {}
    for claim in claims:
        by_claim.setdefault(claim.claim, []).append(claim)
    units: list[DeviceUnit] = [u for _, units_ in per_container.items() for u in units_]
    for claim in claims:
        constrained = claim.models is not None and claim.models != all_models
        models = tuple(sorted(claim.models)) if constrained and claim.models else ()
        units.append(claim.unit.model_copy(update={"models": models, "lifetime": "pod"}))
    containers: dict[str, tuple[str, ...]] = {}
    for container, where in named:
        ids = [u.id for u in per_container[id(container)]]
        ids += [i for i in _claim_refs(container, where, by_claim) if i not in ids]
        if ids:
            containers[str(container.get("name", ""))] = tuple(ids)
    # Init containers run before the app containers (sidecars alongside): their devices may be
    # reused, which the plan can only know from the order (providers.core.contract).
    phased = [c for c in init if str(c.get("name", "")) in containers]
    try:
        return ContainerPlan(
            units=tuple(units),
            containers=containers,
            init=tuple(str(c.get("name", "")) for c in phased),
            sidecars=tuple(str(c.get("name", "")) for c in phased if is_sidecar(c)),
        )
    except ValueError as exc:
        raise InvalidRequest(f"device plan: {exc}") from None


def _existing_intent(
    annotations: Mapping[str, str], machine_type: str
) -> tuple[PodIntent, ContainerPlan]:
    """The intent a sealed pod carries, read by the adaptor's codec."""
    contract = Contract.decode(annotations)
    intent = PodIntent(contract.vcpus, contract.memory_mib, contract.gpu, machine_type)
    return intent, contract.devices or ContainerPlan()


def _contract(intent: PodIntent, plan: ContainerPlan) -> dict[str, str]:
    """The contract keys, by the adaptor's codec (a value it would refuse is a denial)."""
    contract = Contract(
        vcpus=intent.vcpus,
        memory_mib=intent.memory_mib,
        gpu=intent.gpu,
        capacity_type=intent.capacity_type,
        devices=plan,
    )
    return contract.encode()


def _check_possible(
    intent: PodIntent, view: CatalogView | None, settings: Settings, warnings: list[str]
) -> None:
    if view is None or not (not intent.gpu.empty or intent.machine_type):
        return
    try:
        view.selector.select(intent.request()).selected  # noqa: B018 - raises NoMatch
    except NoMatch as exc:
        where = f"{view.catalog.cloud} {view.catalog.region}"
        message = f"no instance type in the {where} catalog can serve this pod: {exc}"
        if settings.impossible == "deny":
            raise NoMatch(message, exc.reasons, exc.stage) from None
        warnings.append(message)


CONFIDENTIAL_ANNOTATION = "peerpods.io/confidential"


def _asks_confidential(annotations: Mapping[str, str]) -> bool:
    """`peerpods.io/confidential: "true"`: only confidential VM sizes may serve the pod (and
    such a size never serves a pod without it); anything but true/false is refused."""
    value = annotations.get(CONFIDENTIAL_ANNOTATION, "").strip().lower()
    if value not in ("", "true", "false"):
        raise InvalidRequest(f"annotation {CONFIDENTIAL_ANNOTATION}: want true or false")
    return value == "true"


def _machine_type(annotations: Mapping[str, str], settings: Settings) -> str:
    """The instance type the pod names, if any; one the settings do not allow is refused."""
    machine_type = annotations.get(MACHINE_TYPE, "").strip()
    if machine_type and machine_type not in settings.allowed_machine_types:
        allowed = ", ".join(sorted(settings.allowed_machine_types)) or "none are allowed"
        raise InvalidRequest(
            f"annotation {MACHINE_TYPE}: instance type {machine_type!r} is not allowed "
            f"(allowed: {allowed})"
        )
    return machine_type


def _readmitted_intent(
    kept: dict[str, str], machine_type: str, capacity: CapacityType
) -> tuple[PodIntent, ContainerPlan]:
    """The intent a sealed pod carries, under the capacity type the policy gives it now;
    `kept` (its annotations) is updated where that capacity type differs from the one held."""
    intent, plan = _existing_intent(kept, machine_type)
    intent = replace(intent, capacity_type=capacity)
    if decode_capacity_type(kept.get(DEFAULT_GPU_MODEL, "")) is not capacity:
        # The capacity type is the policy's answer now, whatever the value held.
        kept.pop(DEFAULT_GPU_MODEL, None)
        encoded = encode_gpu_model(intent.gpu, capacity)
        if encoded:
            kept[DEFAULT_GPU_MODEL] = encoded
    return intent, plan


def _decided_part(pod: Pod, settings: Settings) -> Pod:
    """What the webhook decides and seals: the whole pod, or in the DRA-driver mode the pod
    without what the scheduler allocates (webhook._scheduled)."""
    return without_scheduled(pod) if settings.dra_driver else pod


def _strip(pod: Pod, mutated: Pod, intent: PodIntent, settings: Settings) -> None:
    """Remove what the pod VM provides; the DRA-driver mode keeps the scheduler's part."""
    strip_node_resources(mutated["spec"], quota_units(intent.gpu))
    if settings.dra_driver:
        restore_scheduled(pod["spec"], mutated["spec"])


def mutate_pod(
    pod: Pod,
    *,
    resolver: Resolver | None = None,
    catalog: Catalog | CatalogView | None = None,
    settings: Settings | None = None,
    namespace: str = "",
    limits: SelectorLimits = NO_LIMITS,
) -> MutationResult:
    """Admit one pod: the patch to apply and the pod it makes (raises to deny; see module doc).

    `catalog`: a `CatalogView` reuses what was derived from its catalog (the admission's); a bare
    catalog gets a view of this call alone. `limits`: how the pod's DRA selectors are evaluated.
    """
    settings = settings or Settings()
    view = CatalogView(catalog) if isinstance(catalog, Catalog) else catalog
    if not isinstance(pod, dict) or not isinstance(pod.get("spec"), dict):
        raise InvalidRequest("not a pod: no spec")
    runtime_class = pod["spec"].get("runtimeClassName")
    if not isinstance(runtime_class, str) or runtime_class not in settings.runtime_classes:
        return MutationResult(patch=[], pod=pod)
    annotations = _annotations(pod)
    namespace = namespace or str((pod.get("metadata") or {}).get("namespace") or "default")
    machine_type = _machine_type(annotations, settings)
    capacity = settings.capacity.resolve(namespace, annotations)
    warnings: list[str] = []
    mutated = copy.deepcopy(pod)
    kept = {k: v for k, v in annotations.items() if not k.startswith(CDI_PREFIX)}
    subject = _decided_part(pod, settings)
    if _looks_mutated(subject, annotations, settings, namespace):
        intent, plan = _readmitted_intent(kept, machine_type, capacity)
    else:
        refuse_hugepages(pod)
        intent, plan = _translate(
            subject,
            namespace,
            resolver or MemoryResolver(),
            view,
            machine_type,
            warnings,
            capacity,
            limits,
        )
        intent = replace(intent, capacity_type=capacity)
        if _asks_confidential(annotations):
            intent = replace(intent, gpu=intent.gpu.model_copy(update={"confidential": True}))
        kept = {k: v for k, v in kept.items() if k not in OWNED_KEYS}
        kept.update(_contract(intent, plan))
        _strip(pod, mutated, intent, settings)
    _check_possible(intent, view, settings, warnings)
    kept.pop(SEAL, None)
    if any(k in OWNED_KEYS for k in kept):
        digest = request_digest(_decided_part(mutated, settings))
        kept[SEAL] = seal(settings.seal_key, namespace, kept, digest)
    if kept or "annotations" in mutated["metadata"]:
        mutated["metadata"]["annotations"] = kept
    return MutationResult(
        patch=diff(pod, mutated), pod=mutated, warnings=warnings, intent=intent, plan=plan
    )
