"""A stand-in for the `pynvml` module, behaving as the real NVML does (docs/podvm.md).

Module-level functions with pynvml's names and signatures act on the installed `Machine`
(`install()`), so the code under test gets this module where it would get pynvml (also as
`peerpods podvm prepare --nvml-module tests.podvm.fake_nvml`). What it models:

- GPU-instance profile ids that differ from the profile enums (H100's -lgip ids 19, 20, 15, 14,
  9, 5, 0 for enums 0, 7, 9, 1, 2, 3, 4), names "MIG <profile>", profile info NOT_SUPPORTED
  while MIG mode is off;
- placements from the NVIDIA tables in providers/core/mig.py; a placement not in them is
  INVALID_ARGUMENT, one overlapping a GI (or over the compute or +me budget) is
  INSUFFICIENT_RESOURCES;
- GI ids drawn from per-size pools (8 slots: 0; 4: 1-2; 2: 3-6; 1: 7-14) in a shuffled order,
  MIG device indices drawn from 0..6 in a shuffled order (so they have holes), random UUIDs;
- MIG mode pending until a reset: on a `passthrough` machine SetMigMode reports RESET_REQUIRED
  and only `reboot()` applies it (and, as a reset does, clears every GI and CI);
- handles valid for one nvmlInit session only; destroy refused (IN_USE) while processes run.

ctypes arguments are handled as pynvml passes them: `byref(...)` for counts and placements,
arrays for out-lists.
"""

from __future__ import annotations

import ctypes
import random
import re
import uuid as uuidlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from providers.core.mig import MIG_PROFILES

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0

# code -> (pynvml's subclass suffix, the text str() gives; pynvml has none for 19 and 23)
_ERRORS = {
    1: ("Uninitialized", "Uninitialized"),
    2: ("InvalidArgument", "Invalid Argument"),
    3: ("NotSupported", "Not Supported"),
    6: ("NotFound", "Not Found"),
    7: ("InsufficientSize", "Insufficient Size"),
    9: ("DriverNotLoaded", "Driver Not Loaded"),
    16: ("ResetRequired", "GPU requires restart"),
    19: ("InUse", ""),
    23: ("InsufficientResources", ""),
    999: ("Unknown", "Unknown Error"),
}


class NVMLError(Exception):
    """pynvml's error: `value` is the nvmlReturn_t; a subclass per code, named as pynvml does."""

    _classes: dict[int, type[NVMLError]] = {}

    def __new__(cls, value: int) -> NVMLError:
        target = cls._classes.get(value, cls) if cls is NVMLError else cls
        return Exception.__new__(target)

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        text = _ERRORS.get(self.value, ("", ""))[1]
        return text or f"NVML Error with code {self.value}"


for _code, (_suffix, _) in _ERRORS.items():
    _name = "NVMLError_" + _suffix
    NVMLError._classes[_code] = type(_name, (NVMLError,), {})
    globals()[_name] = NVMLError._classes[_code]


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


c_nvmlGpuInstance_t = ctypes.c_void_p
c_nvmlComputeInstance_t = ctypes.c_void_p

# providers/core/mig.py rows (1g, 1g+me, 1g double memory, 2g, 3g, 4g, 7g) -> (profile id, enum)
_ROW_IDS = ((19, 0x0), (20, 0x7), (15, 0x9), (14, 0x1), (9, 0x2), (5, 0x3), (0, 0x4))
# CI profile enum -> slices (the fake offers the first five, like a 7-slice board)
_CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}
_GI_POOLS = {8: range(0, 1), 4: range(1, 3), 2: range(3, 7), 1: range(7, 15)}
MAX_MIG_DEVICES = 7
GPU_NAMES = {
    "a100-40gb": "NVIDIA A100-SXM4-40GB",
    "a100-80gb": "NVIDIA A100-SXM4-80GB",
    "h100-80gb": "NVIDIA H100 80GB HBM3",
    "h100-nvl": "NVIDIA H100 NVL",
    "h200": "NVIDIA H200",
    "b200": "NVIDIA B200",
}


@dataclass(frozen=True)
class Profile:
    name: str
    id: int
    enum: int
    slices: int
    memory_slots: int
    memory_mib: int
    instances: int
    starts: tuple[int, ...]
    media: bool


def profiles_of(model: str) -> list[Profile]:
    out = []
    for spec, (pid, enum) in zip(MIG_PROFILES[model], _ROW_IDS, strict=True):
        gb = int(re.search(r"\.(\d+)gb", spec.name).group(1))  # type: ignore[union-attr]
        out.append(
            Profile(
                spec.name,
                pid,
                enum,
                spec.compute_slices,
                spec.memory_slots,
                gb * 1024,
                spec.max_per_gpu,
                spec.starts,
                spec.media_extensions,
            )
        )
    return out


@dataclass(eq=False)
class FakeCI:
    id: int
    profile_id: int
    slices: int
    mig_index: int
    uuid: str
    processes: list[int] = field(default_factory=list)


@dataclass(eq=False)
class FakeGI:
    id: int
    profile: Profile
    start: int
    cis: dict[int, FakeCI] = field(default_factory=dict)

    @property
    def slots(self) -> range:
        return range(self.start, self.start + self.profile.memory_slots)


@dataclass(eq=False)
class FakeGpu:
    index: int
    minor: int
    model: str
    uuid: str
    mig_current: int = 0
    mig_pending: int = 0
    gis: dict[int, FakeGI] = field(default_factory=dict)
    processes: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return GPU_NAMES[self.model]

    def profiles(self) -> list[Profile]:
        return profiles_of(self.model)


class Machine:
    """The GPUs of one VM, their MIG state, and the NVML session."""

    def __init__(
        self,
        model: str,
        count: int,
        *,
        seed: int = 0,
        passthrough: bool = False,
        mig_enabled: bool = False,
    ) -> None:
        self.rng = random.Random(seed)
        minors = list(range(count))
        self.rng.shuffle(minors)  # /dev/nvidia<minor> is not the NVML index
        self.gpus = [
            FakeGpu(i, minors[i], model, self._uuid("GPU"), int(mig_enabled), int(mig_enabled))
            for i in range(count)
        ]
        self.passthrough = passthrough
        self.driver_version = "550.54.15"
        self.session = False
        self.resets = 0
        self.calls: list[str] = []
        self.refuse: dict[tuple[int, int], int] = {}  # (gpu, start) -> NVML error on create
        self._handles: dict[int, object] = {}
        self._ids: dict[int, int] = {}
        self._next = 0x1000

    def _uuid(self, prefix: str) -> str:
        return f"{prefix}-{uuidlib.UUID(int=self.rng.getrandbits(128), version=4)}"

    # handles: one integer per object per session; stale ones are INVALID_ARGUMENT
    def handle(self, obj: object) -> int:
        key = id(obj)
        if key not in self._ids:
            self._next += 8
            self._ids[key] = self._next
            self._handles[self._next] = obj
        return self._ids[key]

    def resolve(self, handle: Any, kind: type) -> Any:
        if not self.session:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        value = handle.value if isinstance(handle, ctypes.c_void_p) else handle
        obj = self._handles.get(value) if isinstance(value, int) else None
        if obj is None or not isinstance(obj, kind):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return obj

    def drop_handles(self) -> None:
        self._handles.clear()
        self._ids.clear()

    def reboot(self) -> None:
        """A VM reboot: the GPUs reset, pending MIG modes apply, GIs and CIs are gone."""
        self.resets += 1
        self.session = False
        self.drop_handles()
        for gpu in self.gpus:
            gpu.mig_current = gpu.mig_pending
            gpu.gis.clear()
            gpu.processes.clear()

    def gpu_of_ci(self, ci: FakeCI) -> tuple[FakeGpu, FakeGI]:
        for gpu in self.gpus:
            for gi in gpu.gis.values():
                if ci in gi.cis.values():
                    return gpu, gi
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def truth(self) -> list[dict[str, Any]]:
        """Every MIG device as the hardware has it."""
        return [
            {
                "gpu": g.index,
                "minor": g.minor,
                "profile": gi.profile.name,
                "start": gi.start,
                "gi": gi.id,
                "ci": ci.id,
                "uuid": ci.uuid,
                "mig_index": ci.mig_index,
            }
            for g in self.gpus
            for gi in g.gis.values()
            for ci in gi.cis.values()
        ]


_machine: Machine | None = None


def install(machine: Machine | None) -> None:
    global _machine
    _machine = machine


def _m() -> Machine:
    if _machine is None:
        raise NVMLError(9)  # driver not loaded
    return _machine


def _out(ref: Any) -> Any:
    return getattr(ref, "_obj", ref)


# --- session and devices -------------------------------------------------------------------------


def nvmlInit() -> None:
    _m().session = True


def nvmlShutdown() -> None:
    m = _m()
    m.session = False
    m.drop_handles()


def nvmlSystemGetDriverVersion() -> str:
    return _m().driver_version


def nvmlDeviceGetCount() -> int:
    m = _m()
    if not m.session:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return len(m.gpus)


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    m = _m()
    if not m.session:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    if not 0 <= index < len(m.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return m.handle(m.gpus[index])


def nvmlDeviceGetUUID(handle: Any) -> str:
    m = _m()
    obj = m.resolve(handle, object)
    if isinstance(obj, FakeGpu | FakeCI):
        return obj.uuid
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlDeviceGetMinorNumber(handle: Any) -> int:
    return int(_m().resolve(handle, FakeGpu).minor)


def nvmlDeviceGetName(handle: Any) -> str:
    return str(_m().resolve(handle, FakeGpu).name)


def nvmlDeviceGetMigMode(handle: Any) -> list[int]:
    gpu = _m().resolve(handle, FakeGpu)
    return [gpu.mig_current, gpu.mig_pending]


def nvmlDeviceSetMigMode(handle: Any, mode: int) -> int:
    m = _m()
    gpu = m.resolve(handle, FakeGpu)
    m.calls.append(f"SetMigMode({gpu.index},{mode})")
    if mode not in (0, 1):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if gpu.gis:
        raise NVMLError(NVML_ERROR_IN_USE)
    gpu.mig_pending = mode
    if gpu.mig_current == mode:
        return NVML_SUCCESS
    if gpu.processes:
        return NVML_ERROR_IN_USE
    if m.passthrough:
        return NVML_ERROR_RESET_REQUIRED
    gpu.mig_current = mode  # bare metal: the driver resets the GPU now
    return NVML_SUCCESS


def _processes(pids: list[int]) -> list[SimpleNamespace]:
    return [SimpleNamespace(pid=p, usedGpuMemory=0) for p in pids]


def nvmlDeviceGetComputeRunningProcesses(handle: Any) -> list[SimpleNamespace]:
    m = _m()
    obj = m.resolve(handle, object)
    if isinstance(obj, FakeCI):
        return _processes(obj.processes)
    if isinstance(obj, FakeGpu):
        pids = list(obj.processes)
        pids += [p for gi in obj.gis.values() for ci in gi.cis.values() for p in ci.processes]
        return _processes(pids)
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlDeviceGetGraphicsRunningProcesses(handle: Any) -> list[SimpleNamespace]:
    _m().resolve(handle, object)
    return []


# --- GPU instances -------------------------------------------------------------------------------


def _mig_gpu(handle: Any) -> FakeGpu:
    gpu: FakeGpu = _m().resolve(handle, FakeGpu)
    if gpu.mig_current != NVML_DEVICE_MIG_ENABLE:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu


def _profile(gpu: FakeGpu, profile_id: int) -> Profile:
    for p in gpu.profiles():
        if p.id == profile_id:
            return p
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlDeviceGetGpuInstanceProfileInfo(handle: Any, profile: int, version: int = 2) -> Any:
    gpu = _mig_gpu(handle)
    if not 0 <= profile < NVML_GPU_INSTANCE_PROFILE_COUNT:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    for p in gpu.profiles():
        if p.enum == profile:
            return SimpleNamespace(
                version=0x02000098,
                id=p.id,
                isP2pSupported=0,
                sliceCount=p.slices,
                instanceCount=p.instances,
                multiprocessorCount=16 * p.slices,
                copyEngineCount=p.slices,
                decoderCount=0,
                encoderCount=0,
                jpegCount=0,
                ofaCount=0,
                memorySizeMB=p.memory_mib,
                name=f"MIG {p.name}".encode(),
            )
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def nvmlDeviceGetGpuInstancePossiblePlacements(
    handle: Any,
    profileId: int,
    placementsRef: Any,
    countRef: Any,
) -> int:
    gpu = _m().resolve(handle, FakeGpu)
    p = _profile(gpu, profileId)
    count = _out(countRef)
    if placementsRef is not None:
        if len(placementsRef) < len(p.starts):
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, start in enumerate(p.starts):
            placementsRef[i].start = start
            placementsRef[i].size = p.memory_slots
    count.value = len(p.starts)
    return NVML_SUCCESS


def nvmlDeviceCreateGpuInstanceWithPlacement(handle: Any, profileId: int, placement: Any) -> int:
    m = _m()
    gpu = _mig_gpu(handle)
    p = _profile(gpu, profileId)
    place = _out(placement)
    start, size = int(place.start), int(place.size)
    m.calls.append(f"CreateGI({gpu.index},{p.name},{start})")
    if start not in p.starts or size != p.memory_slots:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if (gpu.index, start) in m.refuse:
        raise NVMLError(m.refuse[(gpu.index, start)])
    slots = set(range(start, start + size))
    used = [gi for gi in gpu.gis.values() if slots & set(gi.slots)]
    compute = sum(gi.profile.slices for gi in gpu.gis.values()) + p.slices
    media = sum(gi.profile.media for gi in gpu.gis.values()) + p.media
    if used or compute > 7 or media > 1:
        raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
    free = [i for i in _GI_POOLS[p.memory_slots] if i not in gpu.gis]
    if not free:
        raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
    gi = FakeGI(m.rng.choice(free), p, start)
    gpu.gis[gi.id] = gi
    return m.handle(gi)


def nvmlDeviceGetGpuInstances(
    handle: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
) -> int:
    m = _m()
    gpu = _mig_gpu(handle)
    _profile(gpu, profileId)
    count = _out(countRef)
    found = [gi for gi in gpu.gis.values() if gi.profile.id == profileId]
    if len(found) > len(gpuInstancesRef):
        raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
    for i, gi in enumerate(found):
        gpuInstancesRef[i] = m.handle(gi)
    count.value = len(found)
    return NVML_SUCCESS


def _gi(handle: Any) -> tuple[FakeGpu, FakeGI]:
    m = _m()
    gi: FakeGI = m.resolve(handle, FakeGI)
    gpu = next(g for g in m.gpus if gi in g.gis.values())
    return gpu, gi


def nvmlGpuInstanceGetInfo(gpuInstance: Any) -> Any:
    m = _m()
    gpu, gi = _gi(gpuInstance)
    return SimpleNamespace(
        device=m.handle(gpu),
        id=gi.id,
        profileId=gi.profile.id,
        placement=SimpleNamespace(start=gi.start, size=gi.profile.memory_slots),
    )


def nvmlGpuInstanceDestroy(gpuInstance: Any) -> int:
    m = _m()
    gpu, gi = _gi(gpuInstance)
    m.calls.append(f"DestroyGI({gpu.index},{gi.id})")
    if gi.cis:
        raise NVMLError(NVML_ERROR_IN_USE)
    del gpu.gis[gi.id]
    return NVML_SUCCESS


# --- compute instances ---------------------------------------------------------------------------


def nvmlGpuInstanceGetComputeInstanceProfileInfo(
    device: Any,
    profile: int,
    engProfile: int,
    version: int = 2,
) -> Any:
    _, gi = _gi(device)
    if not 0 <= profile < NVML_COMPUTE_INSTANCE_PROFILE_COUNT or engProfile != 0:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    slices = _CI_SLICES.get(profile)
    if slices is None or slices > gi.profile.slices:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return SimpleNamespace(
        version=0x02000088,
        id=profile,
        sliceCount=slices,
        instanceCount=gi.profile.slices // slices,
        multiprocessorCount=16 * slices,
        sharedCopyEngineCount=0,
        sharedDecoderCount=0,
        sharedEncoderCount=0,
        sharedJpegCount=0,
        sharedOfaCount=0,
        name=f"MIG {slices}c".encode(),
    )


def nvmlGpuInstanceCreateComputeInstance(gpuInstance: Any, profileId: int) -> int:
    m = _m()
    gpu, gi = _gi(gpuInstance)
    m.calls.append(f"CreateCI({gpu.index},{gi.id})")
    slices = _CI_SLICES.get(profileId)
    if slices is None or slices > gi.profile.slices:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if sum(c.slices for c in gi.cis.values()) + slices > gi.profile.slices:
        raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
    taken = {c.mig_index for g in gpu.gis.values() for c in g.cis.values()}
    free = [i for i in range(MAX_MIG_DEVICES) if i not in taken]
    ci_id = next(i for i in range(8) if i not in gi.cis)
    ci = FakeCI(ci_id, profileId, slices, m.rng.choice(free), m._uuid("MIG"))
    gi.cis[ci.id] = ci
    return m.handle(ci)


def nvmlGpuInstanceGetComputeInstances(
    gpuInstance: Any,
    profileId: int,
    computeInstancesRef: Any,
    countRef: Any,
) -> int:
    m = _m()
    _, gi = _gi(gpuInstance)
    count = _out(countRef)
    found = [c for c in gi.cis.values() if c.profile_id == profileId]
    if len(found) > len(computeInstancesRef):
        raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
    for i, ci in enumerate(found):
        computeInstancesRef[i] = m.handle(ci)
    count.value = len(found)
    return NVML_SUCCESS


def nvmlComputeInstanceGetInfo(computeInstance: Any) -> Any:
    m = _m()
    ci: FakeCI = m.resolve(computeInstance, FakeCI)
    gpu, gi = m.gpu_of_ci(ci)
    return SimpleNamespace(
        device=m.handle(gpu),
        gpuInstance=m.handle(gi),
        id=ci.id,
        profileId=ci.profile_id,
        placement=SimpleNamespace(start=0, size=ci.slices),
    )


def nvmlComputeInstanceDestroy(computeInstance: Any) -> int:
    m = _m()
    ci: FakeCI = m.resolve(computeInstance, FakeCI)
    gpu, gi = m.gpu_of_ci(ci)
    m.calls.append(f"DestroyCI({gpu.index},{gi.id},{ci.id})")
    if ci.processes:
        raise NVMLError(NVML_ERROR_IN_USE)
    del gi.cis[ci.id]
    return NVML_SUCCESS


# --- MIG devices ---------------------------------------------------------------------------------


def nvmlDeviceGetMaxMigDeviceCount(handle: Any) -> int:
    gpu = _m().resolve(handle, FakeGpu)
    return MAX_MIG_DEVICES if gpu.mig_current else 0


def nvmlDeviceGetMigDeviceHandleByIndex(handle: Any, index: int) -> int:
    m = _m()
    gpu = m.resolve(handle, FakeGpu)
    for gi in gpu.gis.values():
        for ci in gi.cis.values():
            if ci.mig_index == index:
                return m.handle(ci)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetGpuInstanceId(handle: Any) -> int:
    m = _m()
    ci = m.resolve(handle, FakeCI)
    return m.gpu_of_ci(ci)[1].id


def nvmlDeviceGetComputeInstanceId(handle: Any) -> int:
    return int(_m().resolve(handle, FakeCI).id)
