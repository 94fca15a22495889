"""The annotation contract between the webhook (writer) and the adaptor (reader).

Kata forwards exactly these pod annotations to CreateVM (docs/annotations.md), so the VM-level
intent lives in
Kata's own keys:

    io.katacontainers.config.hypervisor.default_vcpus      vCPUs (integer)
    io.katacontainers.config.hypervisor.default_memory     memory in MiB (integer)
    io.katacontainers.config.hypervisor.default_gpus       whole GPUs (integer, "0" when none)
    io.katacontainers.config.hypervisor.default_gpu_model  GPU intent, see below
    io.katacontainers.config.hypervisor.machine_type       an explicit instance type (optional)

`default_gpu_model`, version 1, is `v1:` followed by `;`-separated fields, each optional:

    m=h100|a100-80gb        acceptable GPU models (canonical ids or any alias), alternatives
    p=nvidia-a100-80gb-pcie acceptable GPU forms (`providers.core.skus.product_key` of the product
                            name the GPU reports), alternatives; absent: any form of the models
    mem=40960               minimum memory per GPU, MiB
    mig=1g.10gb:2,3g.40gb:1 MIG profiles with device counts
    frac                    a fraction of a GPU may serve one GPU
    rdma                    RDMA (EFA / InfiniBand) required
    rdma=4                  ... with at least that many RDMA devices (EFA interfaces)
    cap=spot                the capacity type: spot | spot-or-on-demand (absent: on-demand)
    cc                      confidential computing: only confidential VM sizes (Azure NCC H100
                            v5), which are never chosen otherwise

e.g. `v1:m=h100|h200;mig=1g.10gb:2`. The capacity type rides in this value because Kata passes
CreateVM only its fixed set of keys (docs/annotations.md, What the adaptor accepts at CreateVM): a
key of our own would never arrive.
A value without the `v1:` prefix is read as CAA does: a comma-separated list of model names.
Unknown fields are an error, so a newer webhook cannot be silently misread by an older adaptor.

The per-container device plan is JSON under `io.katacontainers.peerpods.devices` (a bare key
matching containerd's `io.katacontainers.*` pod_annotations glob, so it reaches every container's
CreateContainer as an OCI annotation):

    {"v": 1,
     "units": [{"id": "gpu-main", "kind": "gpu", "count": 2},
               {"id": "mig-0", "kind": "mig", "profile": "1g.10gb", "count": 1},
               {"id": "rdma-main", "kind": "rdma", "count": 1}],
     "containers": {"main": ["gpu-main", "rdma-main"], "side": ["mig-0"]}}

A unit listed under two containers is shared by them (two containers referencing one DRA claim);
otherwise no device is shared.

Containers do not all run at once (Kubernetes): init containers run one after another before the
app containers start, and restartable init containers (sidecars) keep running from their turn on.
So the plan may also carry, only when some init container uses devices,

     "init": ["fetch", "mesh", "warm"],   init containers that use devices, in spec order
     "sidecars": ["mesh"],                 the restartable ones among them

and units held for the pod's whole life (DRA claims: allocated to the pod, not to a container)
say `"lifetime": "pod"`. Each container then runs over an interval of steps (init container i at
step i, a sidecar from its step to the end, app containers at the last step); a unit lives over
the steps of the containers using it (every step for a pod-lifetime or unused unit), and two units
whose intervals do not meet may get the same devices: a model-download init container's GPU is
the app container's GPU afterwards. Without `init` every container counts as running at once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from providers.core.capacity import CapacityType
from providers.core.errors import AnnotationError
from providers.core.request import InstanceRequest
from providers.core.settings import csv

KATA_HYPERVISOR_PREFIX = "io.katacontainers.config.hypervisor."
DEFAULT_VCPUS = KATA_HYPERVISOR_PREFIX + "default_vcpus"
DEFAULT_MEMORY = KATA_HYPERVISOR_PREFIX + "default_memory"
DEFAULT_GPUS = KATA_HYPERVISOR_PREFIX + "default_gpus"
DEFAULT_GPU_MODEL = KATA_HYPERVISOR_PREFIX + "default_gpu_model"
MACHINE_TYPE = KATA_HYPERVISOR_PREFIX + "machine_type"
IMAGE = KATA_HYPERVISOR_PREFIX + "image"
CC_INIT_DATA = KATA_HYPERVISOR_PREFIX + "cc_init_data"
SANDBOX_NAME = "io.kubernetes.cri.sandbox-name"
SANDBOX_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
SANDBOX_ID = "io.kubernetes.cri.sandbox-id"
CONTAINER_NAME = "io.kubernetes.cri.container-name"
CONTAINER_TYPE = "io.kubernetes.cri.container-type"

DEVICES = "io.katacontainers.peerpods.devices"
# The webhook's seal over the contract keys it wrote (providers.core.contract.seal).
SEAL = "peerpods.io/contract-seal"
_DIGEST = re.compile(r"[0-9a-f]{64}")
VM_RESOURCE = "kata.peerpods.io/vm"
# What a peer pod asked for, kept countable for namespace ResourceQuotas once the webhook removed
# nvidia.com/gpu and the MIG resources (quotas are checked after mutation): whole GPUs and MIG
# devices, on the first container, which every peer-pods node advertises in plenty.
GPU_QUOTA_RESOURCE = "kata.peerpods.io/gpu"
MIG_QUOTA_RESOURCE = "kata.peerpods.io/mig"
CDI_PREFIX = "cdi.k8s.io/"
CDI_OWN_PREFIX = CDI_PREFIX + "peerpods_"

# Keys only the webhook may write; a user-written value is removed.
OWNED_KEYS = (DEFAULT_VCPUS, DEFAULT_MEMORY, DEFAULT_GPUS, DEFAULT_GPU_MODEL, DEVICES)

GPU_MODEL_VERSION = "v1"
_PROFILE = re.compile(r"^[0-9]+g\.[0-9]+gb(\+me)?$")
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# ASCII digits only (str.isdigit() also takes "²"), at most 12 of them before any range check.
_UINT = re.compile(r"[0-9]{1,12}")
# runtime-rs formats default_vcpus as a Rust f32 ("1", "1.5"); Go as an integer.
_VCPUS = re.compile(r"[0-9]{1,12}(\.[0-9]{1,12})?")

# The limits both directions share: the webhook refuses to write what the adaptor would refuse.
MAX_VCPUS = 8192
MAX_MEMORY_MIB = 64 * 1024 * 1024  # 64 TiB
MAX_GPUS = 1024
MAX_GPU_MEMORY_MIB = 1024 * 1024  # 1 TiB per GPU
MAX_DEVICES = 1024  # MIG devices of one profile, RDMA devices
LIMITS = {
    DEFAULT_VCPUS: MAX_VCPUS,
    DEFAULT_MEMORY: MAX_MEMORY_MIB,
    DEFAULT_GPUS: MAX_GPUS,
}


class GpuIntent(BaseModel):
    """The GPU part of the VM-level intent, as `default_gpus` + `default_gpu_model` carry it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpus: int = Field(0, ge=0)
    models: tuple[str, ...] = ()
    products: tuple[str, ...] = ()
    memory_mib: int = Field(0, ge=0)
    mig: dict[str, int] = Field(default_factory=dict)
    fractional: bool = False
    rdma: bool = False
    rdma_devices: int = Field(0, ge=0, description="RDMA devices needed; 0 or 1: one")
    confidential: bool = Field(False, description="the pod asks for confidential computing")

    @property
    def empty(self) -> bool:
        return not (
            self.gpus
            or self.models
            or self.products
            or self.memory_mib
            or self.mig
            or self.fractional
            or self.rdma
            or self.confidential
        )


def encode_gpu_model(intent: GpuIntent, capacity: CapacityType = CapacityType.ON_DEMAND) -> str:
    """`default_gpu_model` for an intent and a capacity type ("" when there is nothing beyond
    the GPU count and on-demand capacity)."""
    fields: list[str] = []
    if intent.models:
        fields.append("m=" + "|".join(intent.models))
    if intent.products:
        fields.append("p=" + "|".join(intent.products))
    if intent.memory_mib:
        fields.append(f"mem={intent.memory_mib}")
    if intent.mig:
        fields.append("mig=" + ",".join(f"{p}:{n}" for p, n in sorted(intent.mig.items())))
    if intent.fractional:
        fields.append("frac")
    if intent.rdma:
        fields.append(f"rdma={intent.rdma_devices}" if intent.rdma_devices > 1 else "rdma")
    if capacity is not CapacityType.ON_DEMAND:
        fields.append(f"cap={capacity}")
    if intent.confidential:
        fields.append("cc")
    return f"{GPU_MODEL_VERSION}:" + ";".join(fields) if fields else ""


def _bounded(key: str, value: int, limit: int, what: str = "value") -> int:
    if value > limit:
        raise AnnotationError(key, f"{what} {value} is out of range (at most {limit})")
    return value


def _uint(key: str, raw: str, limit: int, what: str = "value") -> int:
    """A non-negative integer in ASCII digits, at most `limit`."""
    if not _UINT.fullmatch(raw):
        raise AnnotationError(key, f"expected a non-negative integer, got {raw[:40]!r}")
    return _bounded(key, int(raw), limit, what)


def _int_annotation(annotations: Mapping[str, str], key: str) -> int:
    """An integer key; empty (runtime-rs sends every key, empty when unset) means 0."""
    raw = annotations.get(key, "").strip()
    if not raw:
        return 0
    if key == DEFAULT_VCPUS and _VCPUS.fullmatch(raw):
        # runtime-rs: an f32 such as "1.5"; a fraction of a vCPU still needs a whole one.
        whole, _, fraction = raw.partition(".")
        value = int(whole) + (1 if fraction.strip("0") else 0)
        return _bounded(key, value, LIMITS[key])
    return _uint(key, raw, LIMITS[key])


def decode_gpu_model(value: str, gpus: int = 0) -> GpuIntent:
    """Parse `default_gpu_model` (either encoding); raises AnnotationError naming the key."""
    key = DEFAULT_GPU_MODEL
    value = value.strip()
    if not value:
        return GpuIntent(gpus=gpus)
    if not value.startswith(GPU_MODEL_VERSION + ":"):
        if re.match(r"^v[0-9]+:", value):
            raise AnnotationError(key, f"unsupported encoding version in {value!r}")
        legacy = csv(value)
        for model in legacy:
            if not _MODEL.fullmatch(model):
                raise AnnotationError(key, f"invalid GPU model name {model!r}")
        return GpuIntent(gpus=gpus, models=legacy)
    models: tuple[str, ...] = ()
    products: tuple[str, ...] = ()
    memory_mib = 0
    mig: dict[str, int] = {}
    flags: set[str] = set()
    rdma_devices = 0
    body = value[len(GPU_MODEL_VERSION) + 1 :]
    for part in filter(None, (p.strip() for p in body.split(";"))):
        name, _, arg = part.partition("=")
        if name == "m" and arg:
            models = tuple(m for m in arg.split("|") if m)
            if not models or not all(_MODEL.fullmatch(m) for m in models):
                raise AnnotationError(key, f"invalid model list {arg!r}")
        elif name == "p" and arg:
            products = tuple(m for m in arg.split("|") if m)
            if not products or not all(_MODEL.fullmatch(m) for m in products):
                raise AnnotationError(key, f"invalid GPU product list {arg!r}")
        elif name == "mem" and _UINT.fullmatch(arg):
            memory_mib = _bounded(key, int(arg), MAX_GPU_MEMORY_MIB, "GPU memory")
        elif name == "mig" and arg:
            for item in arg.split(","):
                profile, _, count = item.partition(":")
                if not _PROFILE.fullmatch(profile) or not _UINT.fullmatch(count) or int(count) <= 0:
                    raise AnnotationError(key, f"invalid MIG entry {item!r} (want PROFILE:COUNT)")
                total = mig.get(profile, 0) + int(count)
                mig[profile] = _bounded(key, total, MAX_DEVICES, f"{profile} device count")
        elif name in ("frac", "rdma", "cc") and not arg:
            flags.add(name)
        elif name == "rdma" and _UINT.fullmatch(arg) and int(arg) >= 1:
            flags.add(name)
            rdma_devices = _bounded(key, int(arg), MAX_DEVICES, "RDMA device count")
        elif name == "cap" and arg in _WRITTEN_CAPACITY:
            pass  # the capacity type: decode_capacity_type
        else:
            raise AnnotationError(key, f"unknown or malformed field {part!r}")
    return GpuIntent(
        gpus=gpus,
        models=models,
        products=products,
        memory_mib=memory_mib,
        mig=mig,
        fractional="frac" in flags,
        rdma="rdma" in flags,
        rdma_devices=rdma_devices if rdma_devices > 1 else 0,
        confidential="cc" in flags,
    )


_WRITTEN_CAPACITY = frozenset({CapacityType.SPOT.value, CapacityType.SPOT_OR_ON_DEMAND.value})


def decode_capacity_type(value: str) -> CapacityType:
    """The capacity type `default_gpu_model` carries (on-demand when it names none); a malformed
    value is an AnnotationError (decode_gpu_model reads the rest)."""
    value = value.strip()
    if not value.startswith(GPU_MODEL_VERSION + ":"):
        return CapacityType.ON_DEMAND
    capacity = CapacityType.ON_DEMAND
    for part in (p.strip() for p in value[len(GPU_MODEL_VERSION) + 1 :].split(";")):
        name, _, arg = part.partition("=")
        if name == "cap":
            if arg not in _WRITTEN_CAPACITY:
                raise AnnotationError(DEFAULT_GPU_MODEL, f"unknown capacity type in {part!r}")
            capacity = CapacityType(arg)
    return capacity


class Contract(BaseModel):
    """The VM-level keys the webhook writes and the adaptor reads, as one typed value.

    `encode` and `decode` are inverses over everything `encode` accepts, with the same limits:
    a contract the webhook can write is one the adaptor accepts. `decode` also takes the forms
    Kata's runtimes send (every key present, empty when unset; runtime-rs's float vCPUs, rounded
    up to whole vCPUs).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    vcpus: int = Field(0, ge=0)
    memory_mib: int = Field(0, ge=0)
    gpu: GpuIntent = Field(default_factory=GpuIntent)
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    devices: ContainerPlan | None = None

    def encode(self) -> dict[str, str]:
        """The annotations (absent keys for zero/empty values); AnnotationError, naming the key,
        for a value the adaptor would refuse."""
        out: dict[str, str] = {}
        if self.vcpus:
            out[DEFAULT_VCPUS] = str(_bounded(DEFAULT_VCPUS, self.vcpus, MAX_VCPUS))
        if self.memory_mib:
            out[DEFAULT_MEMORY] = str(_bounded(DEFAULT_MEMORY, self.memory_mib, MAX_MEMORY_MIB))
        if self.gpu.gpus:
            out[DEFAULT_GPUS] = str(_bounded(DEFAULT_GPUS, self.gpu.gpus, MAX_GPUS))
        encoded = encode_gpu_model(self.gpu, self.capacity_type)
        if encoded:
            decode_gpu_model(encoded)  # the same checks the adaptor makes
            out[DEFAULT_GPU_MODEL] = encoded
        if self.devices is not None and self.devices.units:
            out[DEVICES] = self.devices.encode()
        return out

    @classmethod
    def decode(cls, annotations: Mapping[str, str]) -> Contract:
        """Read the contract keys; AnnotationError naming the key for any bad value."""
        gpus = _int_annotation(annotations, DEFAULT_GPUS)
        gpu_model = annotations.get(DEFAULT_GPU_MODEL, "")
        encoded = annotations.get(DEVICES, "").strip()
        return cls(
            vcpus=_int_annotation(annotations, DEFAULT_VCPUS),
            memory_mib=_int_annotation(annotations, DEFAULT_MEMORY),
            gpu=decode_gpu_model(gpu_model, gpus),
            capacity_type=decode_capacity_type(gpu_model),
            devices=ContainerPlan.decode(encoded) if encoded else None,
        )


def seal(
    key: bytes, namespace: str, contract: Mapping[str, str], requests: str | None = None
) -> str:
    """A MAC over the contract keys a pod carries in a namespace and over what the pod asks for:
    how the webhook recognises a pod it already mutated by its content (a user cannot write a
    matching seal, and a seal copied onto a pod that asks for something else does not match).

    `requests` is the digest of the pod's requests (the webhook's `request_digest`: its
    containers, their resources and claims), carried in the seal in the clear; None: the digest
    the pod's current seal carries (a re-seal under another key of a pod already sealed; a v1
    seal, which binds no requests, is re-sealed as v1).
    """
    if requests is None:
        requests = seal_requests(contract)
        if not requests:
            return _seal_v1(key, namespace, contract)
    if not _DIGEST.fullmatch(requests):
        raise ValueError("a seal's request digest is 64 lower-case hex digits")
    body = json.dumps(
        [namespace, sorted((k, v) for k, v in contract.items() if k in OWNED_KEYS), requests],
        separators=(",", ":"),
    )
    return f"v2:{requests}:" + hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def seal_requests(annotations: Mapping[str, str]) -> str:
    """The request digest the pod's seal carries ("" when it carries none: no seal, a v1 seal
    from before seals were bound to requests, or a malformed one)."""
    version, _, rest = annotations.get(SEAL, "").partition(":")
    digest, sep, _mac = rest.rpartition(":")
    return digest if version == "v2" and sep and _DIGEST.fullmatch(digest) else ""


def _seal_v1(key: bytes, namespace: str, contract: Mapping[str, str]) -> str:
    body = json.dumps(
        [namespace, sorted((k, v) for k, v in contract.items() if k in OWNED_KEYS)],
        separators=(",", ":"),
    )
    return "v1:" + hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def sealed(key: bytes, namespace: str, annotations: Mapping[str, str]) -> bool:
    """Whether the pod's contract keys carry a seal the webhook wrote for them under `key`.

    A v1 seal (over the contract keys only, from before the request binding) still counts for
    updates of the pods it was written on; whether the seal was written for this pod's requests
    is the caller's check (`seal_requests`: a v1 seal binds none)."""
    found = annotations.get(SEAL, "")
    if found.startswith("v1:"):
        return hmac.compare_digest(found, _seal_v1(key, namespace, annotations))
    requests = seal_requests(annotations)
    return bool(requests) and hmac.compare_digest(
        found, seal(key, namespace, annotations, requests)
    )


class VMIntent(BaseModel):
    """Everything CreateVM's annotations say about the VM to create."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pod_name: str
    pod_namespace: str
    vcpus: int = 0
    memory_mib: int = 0
    gpu: GpuIntent = Field(default_factory=GpuIntent)
    machine_type: str = ""
    image: str = ""
    capacity_type: CapacityType = CapacityType.ON_DEMAND

    def to_request(self, **overrides: object) -> InstanceRequest:
        """The selection request this intent implies (see `request_for`)."""
        return request_for(
            self.vcpus,
            self.memory_mib,
            self.gpu,
            self.machine_type,
            self.capacity_type,
            **overrides,
        )


def request_for(
    vcpus: int,
    memory_mib: int,
    gpu: GpuIntent,
    machine_type: str,
    capacity_type: CapacityType,
    **overrides: object,
) -> InstanceRequest:
    """The selection request a VM-level intent implies: the one mapping the webhook (at
    admission) and the adaptor (at StartVM) both use. A Spot first pass ranks by Spot price; a
    pod's GPUs are NVIDIA devices, so a non-NVIDIA model is refused (InvalidRequest)."""
    from providers.core.gpus import require_nvidia

    fields: dict[str, object] = {
        "vcpus": vcpus,
        "memory_mib": memory_mib,
        "gpus": gpu.gpus,
        "gpu_models": require_nvidia(gpu.models),
        "gpu_products": gpu.products,
        "gpu_memory_mib": gpu.memory_mib,
        "mig": dict(gpu.mig),
        "fractional": gpu.fractional,
        "rdma": gpu.rdma,
        "rdma_devices": gpu.rdma_devices,
        "instance_type": machine_type,
        "provisioning": "spot" if capacity_type.wants_spot else "on-demand",
        "confidential": gpu.confidential,
    }
    fields.update(overrides)
    return InstanceRequest.model_validate(fields)


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


# CRI-O's sandbox name as the Go runtime may forward it: k8s_<pod>_<namespace>_<uid>_<attempt>.
_CRIO_NAME = re.compile(r"k8s_([a-z0-9][-a-z0-9.]*)_([a-z0-9][-a-z0-9]*)_[0-9a-f-]+_[0-9]+")


def sandbox_names(annotations: Mapping[str, str]) -> tuple[str, str]:
    """(pod name, namespace) from CreateVM's keys: containerd's (which runtime-rs also fills
    from CRI-O's), or CRI-O's `k8s_<pod>_<ns>_<uid>_<n>` sandbox name."""
    name = annotations.get(SANDBOX_NAME, "").strip()
    namespace = annotations.get(SANDBOX_NAMESPACE, "").strip()
    crio = _CRIO_NAME.fullmatch(name)
    if crio is not None:
        name = crio[1]
        namespace = namespace or crio[2]
    return name, namespace


def parse_vm_annotations(annotations: Mapping[str, str]) -> VMIntent:
    """Read CreateVM's annotations; every error names the annotation at fault."""
    name, namespace = sandbox_names(annotations)
    if not name or not _DNS_SUBDOMAIN.fullmatch(name):
        raise AnnotationError(SANDBOX_NAME, f"not a valid pod name: {name!r}")
    if not namespace or not _DNS_LABEL.fullmatch(namespace):
        raise AnnotationError(SANDBOX_NAMESPACE, f"not a valid namespace: {namespace!r}")
    machine_type = annotations.get(MACHINE_TYPE, "").strip()
    if machine_type and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", machine_type):
        raise AnnotationError(MACHINE_TYPE, f"not an instance type name: {machine_type[:80]!r}")
    contract = Contract.decode({k: v for k, v in annotations.items() if k != DEVICES})
    return VMIntent(
        pod_name=name,
        pod_namespace=namespace,
        vcpus=contract.vcpus,
        memory_mib=contract.memory_mib,
        gpu=contract.gpu,
        capacity_type=contract.capacity_type,
        machine_type=machine_type,
        image=annotations.get(IMAGE, "").strip(),
    )


# --- the per-container device plan ------------------------------------------------------------

UnitKind = Literal["gpu", "mig", "rdma"]


class DeviceUnit(BaseModel):
    """One allocatable group of devices: N whole GPUs, N MIG devices of a profile, N RDMA NICs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, max_length=128)
    kind: UnitKind
    count: int = Field(1, ge=1, le=64)
    profile: str = ""
    # GPU model constraint for this unit, when a DRA claim narrowed it (canonical id).
    models: tuple[str, ...] = ()
    # "pod": held for the pod's whole life (a DRA claim), its devices never reused by another
    # unit; "container": only while a container using it runs.
    lifetime: Literal["container", "pod"] = "container"

    @model_validator(mode="after")
    def _profile_only_for_mig(self) -> DeviceUnit:
        if self.kind == "mig" and not _PROFILE.fullmatch(self.profile):
            raise ValueError(f"unit {self.id}: MIG unit needs a profile like 1g.10gb")
        if self.kind != "mig" and self.profile:
            raise ValueError(f"unit {self.id}: only MIG units carry a profile")
        return self


class ContainerPlan(BaseModel):
    """Which device units each container uses, as the webhook wrote it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = 1
    units: tuple[DeviceUnit, ...] = ()
    containers: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    # Init containers using devices, in spec order, and the restartable ones (sidecars) among
    # them; empty: every container counts as running at once.
    init: tuple[str, ...] = ()
    sidecars: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _references_resolve(self) -> ContainerPlan:
        ids = [u.id for u in self.units]
        if len(ids) != len(set(ids)):
            raise ValueError("duplicate unit ids")
        known = set(ids)
        for container, refs in self.containers.items():
            for ref in refs:
                if ref not in known:
                    raise ValueError(f"container {container} refers to unknown unit {ref}")
        if len(self.init) != len(set(self.init)):
            raise ValueError("an init container is listed twice")
        stray = [s for s in self.sidecars if s not in self.init]
        if stray:
            raise ValueError(f"sidecar {stray[0]} is not among the init containers")
        return self

    def encode(self) -> str:
        data = self.model_dump(mode="json")
        # new fields only when set, so plans without init devices read as before
        for key in ("init", "sidecars"):
            if not data[key]:
                del data[key]
        for unit in data["units"]:
            if unit["lifetime"] == "container":
                del unit["lifetime"]
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    def intervals(self) -> dict[str, tuple[int, int]]:
        """Each unit's first and last step on the pod's timeline (see the module doc)."""
        end = len(self.init)
        steps = {name: (i, end if name in self.sidecars else i) for i, name in enumerate(self.init)}
        spans: dict[str, tuple[int, int]] = {}
        for container, refs in self.containers.items():
            first, last = steps.get(container, (end, end))
            for ref in refs:
                low, high = spans.get(ref, (first, last))
                spans[ref] = (min(low, first), max(high, last))
        return {
            u.id: (0, end) if u.lifetime == "pod" or u.id not in spans else spans[u.id]
            for u in self.units
        }

    def peaks(self) -> tuple[int, dict[str, int], int]:
        """Whole GPUs, MIG devices per profile and RDMA devices in use at the busiest step."""
        spans = self.intervals()
        end = len(self.init)
        gpus = 0
        rdma = 0
        mig: dict[str, int] = {}
        for step in range(end + 1):
            live = [u for u in self.units if spans[u.id][0] <= step <= spans[u.id][1]]
            gpus = max(gpus, sum(u.count for u in live if u.kind == "gpu"))
            rdma = max(rdma, sum(u.count for u in live if u.kind == "rdma"))
            for profile in {u.profile for u in live if u.kind == "mig"}:
                n = sum(u.count for u in live if u.kind == "mig" and u.profile == profile)
                mig[profile] = max(mig.get(profile, 0), n)
        return gpus, mig, rdma

    @classmethod
    def decode(cls, value: str) -> ContainerPlan:
        try:
            return cls.model_validate_json(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise AnnotationError(DEVICES, f"{where}: {first['msg']}".strip(": ")) from None

    def gpu_intent(self) -> GpuIntent:
        """The VM-level GPU needs this plan implies (at the busiest step of the pod's life)."""
        gpus, mig, rdma = self.peaks()
        return GpuIntent(gpus=gpus, mig=mig, rdma=rdma > 0, rdma_devices=rdma if rdma > 1 else 0)


def cdi_annotation_key(container: str) -> str:
    """`cdi.k8s.io/peerpods_<container>`: our key for a container's CDI devices."""
    return CDI_OWN_PREFIX + container


Contract.model_rebuild()
