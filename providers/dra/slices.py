"""The pools of driver `gpu.peerpods.io`: what the cloud can give peer pods, as ResourceSlices.

A pure function of the region's catalog, the operator's `--gpu-limit`s and the account quotas
read from the cloud (`build_pool`); the publisher writes its result.

Model (docs/dra.md says the same for operators):

- One pool per cloud region, restricted to peer-pod nodes (`nodeSelector` on the RuntimeClass's
  node label, never `allNodes`: an allocation from such a pool would let the pod land on a node
  whose kubelet has no plugin of this driver).
- Devices: per GPU form the region sells on demand (model, product name and memory, from the
  types of the image's CPU architecture), as many devices as its limit allows: `--gpu-limit`,
  else the account's GPU quota for the model, else `DEFAULT_DEVICES`. They carry the NVIDIA
  DRA driver's attribute names (`type`, `productName`, `brand`, `architecture`,
  `cudaComputeCapability`, capacity `memory` in bytes) and the project's own (`cloud`,
  `region`, `model`, `rdma`, `maxPerVM`, `shared`). Device order is preference (the allocator
  is first fit): forms by the lowest price of one of their GPUs, cheapest first.
- Shared counters, in a slice of their own: set `gpus` holds one counter per model (its limit),
  which every device of that model consumes 1 of, whole or shared; set `account` one counter per
  on-demand account quota that counts those devices (AWS vCPUs per instance class, Azure vCPUs
  per family, GCP GPUs per model). A device consumes per quota the most vCPUs one of its GPUs
  brings along on any type of its form (vCPUs / GPUs of the type): exact for pods whose GPUs
  fill their VM, optimistic by the idle GPUs' share for a pod that takes part of a larger VM
  (one H100 on an 8-GPU type). The counter is the quota's limit, not limit minus usage: the
  allocated devices already consume their share, and the cloud's usage counts those same VMs;
  usage outside this cluster's peer pods is therefore not seen (optimistic by that much; the
  adaptor's own account-quota check at StartVM stays the floor).
- Fractional GPUs (AWS g6f/gr6f, Azure NV*ads_A10_v5): a second device per GPU of the model,
  `allowMultipleAllocations` with capacity `memory` whose `requestPolicy.validValues` are the
  shares sold (and the whole, where a whole GPU of that form is sold too). Each share is its own
  VM in the cloud; the shared device stands for one GPU's worth of them, so the `gpus` counter
  counts it once however many shares are taken: errs pessimistic by the unused part of a
  partly shared device.
- MIG stays on the annotation path: a pod VM owns whole GPUs, and DRA cannot say "these
  partitions go to one claim only", so any MIG device would let two pods be promised parts of one
  GPU that neither VM can share.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from providers.core.account_quota import AccountLimit, AccountQuota
from providers.core.catalog import Arch, Catalog, InstanceType
from providers.core.errors import InvalidRequest
from providers.core.gpus import COMPUTE_CAPABILITY, GPU_MODELS, models_matching
from providers.core.skus import product_key, product_name

__all__ = [
    "API_VERSION",
    "DEFAULT_DEVICES",
    "DRIVER",
    "MAX_DEVICES_PER_SLICE",
    "NODE_LABEL",
    "Pool",
    "PublishedDevice",
    "build_pool",
    "parse_gpu_limits",
    "pool_name",
]

DRIVER = "gpu.peerpods.io"
API_VERSION = "resource.k8s.io/v1"
NODE_LABEL = ("node.kubernetes.io/peerpods", "true")  # the RuntimeClass's nodeSelector
MAX_DEVICES_PER_SLICE = 64  # the API server's limit when devices consume counters
MAX_COUNTERS_PER_SET = 32
DEFAULT_DEVICES = 8  # per GPU model when neither a limit nor an account quota bounds it
GPU_COUNTERS = "gpus"
ACCOUNT_COUNTERS = "account"
_MIB = 1 << 20
_LABEL = re.compile(r"[^a-z0-9]+")


def _dns_label(text: str, limit: int = 63) -> str:
    """A DNS label made of `text`: lower case, other runs as '-', trimmed to `limit`."""
    label = _LABEL.sub("-", text.lower()).strip("-")[:limit].strip("-")
    return label or "x"


def pool_name(catalog: Catalog) -> str:
    """The pool of one cloud region, e.g. `aws-us-east-1`."""
    return _dns_label(f"{catalog.cloud}-{catalog.region}")


def parse_gpu_limits(items: Iterable[str]) -> dict[str, int]:
    """`MODEL=N` items (any alias: h100, "NVIDIA H100 80GB HBM3") -> canonical model -> N.

    A family name (h100, a100) limits each of its models to N."""
    limits: dict[str, int] = {}
    for item in items:
        name, sep, count = item.partition("=")
        if not sep or not name.strip():
            raise InvalidRequest(f"--gpu-limit {item!r}: want MODEL=COUNT, e.g. h100=2")
        if not count.strip().isdigit():
            raise InvalidRequest(f"--gpu-limit {item!r}: COUNT must be a whole number")
        try:
            models = models_matching(name.strip())
        except InvalidRequest as exc:
            raise InvalidRequest(f"--gpu-limit {item!r}: {exc}") from None
        if not models:
            raise InvalidRequest(f"--gpu-limit {item!r}: unknown GPU model {name.strip()!r}")
        for model in models:
            limits[model] = int(count)
    return limits


@dataclass(frozen=True)
class _Form:
    """One GPU form a region sells: what its devices look like and what they cost."""

    model: str
    product: str
    memory_mib: int
    price_per_gpu: float | None
    rdma: bool
    max_per_vm: int
    vcpus_per_gpu: int
    types: tuple[InstanceType, ...]
    shares_mib: tuple[int, ...] = ()  # memory of the shares sold (fractional types)
    whole: bool = True  # a whole GPU of this form is sold


@dataclass(frozen=True)
class PublishedDevice:
    """One device of the pool, as `peerpods plan --dra-driver` and the adaptor read it back."""

    name: str
    model: str
    product: str
    memory_mib: int
    shared: bool = False
    valid_mib: tuple[int, ...] = ()


@dataclass(frozen=True)
class Pool:
    """A region's pool: its devices and counters, and the ResourceSlices that publish them."""

    name: str
    cloud: str
    region: str
    devices: tuple[PublishedDevice, ...]
    counters: Mapping[str, Mapping[str, int]]
    notes: tuple[str, ...] = ()
    _device_objects: tuple[dict[str, Any], ...] = field(default=(), repr=False)

    def slices(self, generation: int) -> list[dict[str, Any]]:
        """The ResourceSlice objects of this pool at `generation`: the counters' slice first,
        then the devices in order, at most `MAX_DEVICES_PER_SLICE` per slice."""
        chunks = [
            list(self._device_objects[i : i + MAX_DEVICES_PER_SLICE])
            for i in range(0, len(self._device_objects), MAX_DEVICES_PER_SLICE)
        ]
        count = len(chunks) + (1 if self.counters else 0)
        pool = {"name": self.name, "generation": generation, "resourceSliceCount": count}
        out: list[dict[str, Any]] = []
        key, value = NODE_LABEL
        selector = {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": key, "operator": "In", "values": [value]}
        ]}]}  # fmt: skip
        if self.counters:
            sets = [
                {
                    "name": name,
                    "counters": {c: {"value": str(v)} for c, v in sorted(values.items())},
                }
                for name, values in sorted(self.counters.items())
            ]
            # the API server wants a node selection on every slice, the counters' too
            spec = {"nodeSelector": selector, "sharedCounters": sets}
            out.append(self._slice("counters", pool, spec))
        for index, chunk in enumerate(chunks):
            spec = {"nodeSelector": selector, "devices": chunk}
            out.append(self._slice(f"devices-{index:03d}", pool, spec))
        return out

    def _slice(self, suffix: str, pool: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "name": f"{DRIVER}-{self.name}-{suffix}",
                "labels": {
                    "app.kubernetes.io/managed-by": "peerpods",
                    "peerpods.io/pool": self.name,
                },
            },
            "spec": {"driver": DRIVER, "pool": dict(pool), **spec},
        }


def _forms(catalog: Catalog, arch: Arch) -> list[_Form]:
    """The GPU forms of the catalog's on-demand, non-confidential types of `arch`."""
    grouped: dict[tuple[str, str, int], list[InstanceType]] = {}
    shares: dict[tuple[str, str], set[int]] = {}
    share_types: dict[tuple[str, str], list[InstanceType]] = {}
    for itype in catalog.types:
        gpu = itype.gpu
        if gpu is None or itype.arch != arch or not itype.on_demand or itype.confidential:
            continue
        known = GPU_MODELS.get(gpu.model)
        if known is None or known.vendor != "NVIDIA":
            continue  # AMD, Habana, unknown: no device a claim for NVIDIA's vocabulary fits
        product = product_name(catalog.cloud, itype.name, gpu.model)
        if gpu.fraction < 1:
            shares.setdefault((gpu.model, product), set()).add(gpu.memory_mib)
            share_types.setdefault((gpu.model, product), []).append(itype)
            continue
        mib = gpu.memory_mib or known.memory_mib
        grouped.setdefault((gpu.model, product, mib), []).append(itype)
    forms = [_form(model, product, mib, types) for (model, product, mib), types in grouped.items()]
    for (model, product), sizes in shares.items():
        wholes = [f for f in forms if (f.model, f.product) == (model, product)]
        if wholes:
            whole = wholes[0]
            index = forms.index(whole)
            forms[index] = _with_shares(whole, sizes)
        else:
            full = GPU_MODELS[model].memory_mib
            form = _form(model, product, full, share_types[(model, product)])
            forms.append(_with_shares(form, sizes, whole=False))
    return sorted(forms, key=_preference)


def _form(model: str, product: str, mib: int, types: Sequence[InstanceType]) -> _Form:
    prices = [
        t.price_per_hour / (t.gpu.count * t.gpu.fraction)
        for t in types
        if t.price_per_hour is not None and t.gpu is not None
    ]
    per_gpu = [math.ceil(t.vcpus / t.gpu.count) for t in types if t.gpu is not None]
    return _Form(
        model=model,
        product=product,
        memory_mib=mib,
        price_per_gpu=min(prices) if prices else None,
        rdma=any(t.rdma for t in types),
        max_per_vm=max(t.gpu.count for t in types if t.gpu is not None),
        vcpus_per_gpu=max(per_gpu, default=0),
        types=tuple(types),
    )


def _with_shares(form: _Form, sizes: set[int], whole: bool = True) -> _Form:
    return replace(form, shares_mib=tuple(sorted(sizes)), whole=whole)


def _preference(form: _Form) -> tuple[float, str, int]:
    price = form.price_per_gpu if form.price_per_gpu is not None else math.inf
    return (price, form.product, form.memory_mib)


def _limit_of(model: str, limits: Mapping[str, int], quota: AccountQuota | None) -> tuple[int, str]:
    """How many GPUs of `model` the pool offers, and why."""
    if model in limits:
        return limits[model], "--gpu-limit"
    if quota is not None:
        gpu_limits = [
            int(q.limit)
            for q in quota.limits
            if q.kind == "gpus" and q.spot is not True and q.match == "model" and model in q.keys
        ]
        if gpu_limits:
            return min(gpu_limits), "account quota"
    return DEFAULT_DEVICES, "default"


def _account_limits(quota: AccountQuota | None, forms: Sequence[_Form]) -> list[AccountLimit]:
    """The on-demand account quotas that count some form's VMs."""
    if quota is None:
        return []
    found: list[AccountLimit] = []
    for limit in quota.limits:
        if limit.spot is True:
            continue
        if any(limit.amount(t, False) > 0 for f in forms for t in f.types):
            found.append(limit)
    return found[:MAX_COUNTERS_PER_SET]


def _quota_amount(limit: AccountLimit, form: _Form) -> int:
    """What one device of `form` consumes of an account quota (see the module doc)."""
    amounts = [limit.amount(t, False) / t.gpu.count for t in form.types if t.gpu is not None]
    if not any(amounts):
        return 0
    return math.ceil(max(amounts))


def build_pool(
    catalog: Catalog,
    limits: Mapping[str, int] | None = None,
    quota: AccountQuota | None = None,
    arch: Arch = "x86_64",
) -> Pool:
    """The pool of `catalog`'s region (see the module doc); pure."""
    limits = dict(limits or {})
    forms = _forms(catalog, arch)
    unknown = sorted(set(limits) - {f.model for f in forms})
    notes = [f"--gpu-limit {m}: no {arch} type of the catalog sells it" for m in unknown]
    notes += [f"account quota not read: {n}" for n in (quota.notes if quota else ())]
    accounts = _account_limits(quota, forms)
    names = {id(limit): _dns_label(limit.name) for limit in accounts}
    account_counters = {names[id(limit)]: int(limit.limit) for limit in accounts}
    gpu_counters: dict[str, int] = {}
    devices: list[PublishedDevice] = []
    objects: list[dict[str, Any]] = []
    for form in forms:
        count, why = _limit_of(form.model, limits, quota)
        gpu_counters[form.model] = count
        notes.append(f"{form.model} ({form.product}): {count} devices ({why})")
        consumes = [{"counterSet": GPU_COUNTERS, "counters": {form.model: {"value": "1"}}}]
        account = {
            names[id(limit)]: {"value": str(_quota_amount(limit, form))}
            for limit in accounts
            if _quota_amount(limit, form) > 0
        }
        if account:
            consumes.append({"counterSet": ACCOUNT_COUNTERS, "counters": account})
        stem = _dns_label(product_key(form.product), 40)
        for index in range(count):
            if form.whole:
                name = f"{stem}-{index}"
                devices.append(PublishedDevice(name, form.model, form.product, form.memory_mib))
                objects.append(_device(name, form, catalog, consumes))
        for index in range(count if form.shares_mib else 0):
            valid = tuple(sorted({*form.shares_mib, *([form.memory_mib] if form.whole else [])}))
            name = f"{stem}-shared-{index}"
            devices.append(
                PublishedDevice(name, form.model, form.product, form.memory_mib, True, valid)
            )
            objects.append(_device(name, form, catalog, consumes, valid))
    counters: dict[str, dict[str, int]] = {}
    if gpu_counters:
        counters[GPU_COUNTERS] = dict(list(gpu_counters.items())[:MAX_COUNTERS_PER_SET])
    if account_counters:
        counters[ACCOUNT_COUNTERS] = account_counters
    return Pool(
        name=pool_name(catalog),
        cloud=catalog.cloud,
        region=catalog.region,
        devices=tuple(devices),
        counters=counters,
        notes=tuple(notes),
        _device_objects=tuple(objects),
    )


def _device(
    name: str,
    form: _Form,
    catalog: Catalog,
    consumes: list[dict[str, Any]],
    valid_mib: tuple[int, ...] = (),
) -> dict[str, Any]:
    known = GPU_MODELS[form.model]
    attributes: dict[str, dict[str, Any]] = {
        "type": {"string": "gpu"},
        "productName": {"string": form.product},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": known.architecture},
        "cloud": {"string": catalog.cloud},
        "region": {"string": catalog.region},
        "model": {"string": form.model},
        "rdma": {"bool": form.rdma},
        "maxPerVM": {"int": form.max_per_vm},
        "shared": {"bool": bool(valid_mib)},
    }
    if form.model in COMPUTE_CAPABILITY:
        attributes["cudaComputeCapability"] = {
            "version": ".".join(str(p) for p in COMPUTE_CAPABILITY[form.model])
        }
    memory: dict[str, Any] = {"value": str(form.memory_mib * _MIB)}
    device: dict[str, Any] = {"name": name, "attributes": attributes}
    if valid_mib:
        memory["requestPolicy"] = {
            "default": str(valid_mib[-1] * _MIB),  # a request without an amount: all of it
            "validValues": [str(v * _MIB) for v in valid_mib[:10]],
        }
        device["allowMultipleAllocations"] = True
    device["capacity"] = {"memory": memory}
    device["consumesCounters"] = [dict(c) for c in consumes]
    return device
