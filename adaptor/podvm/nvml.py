"""The NVML calls `podvm prepare` makes, over a pynvml-like module (`nvidia-ml-py`, or a stand-in).

Only this module touches pynvml: it allocates the ctypes arguments the wrappers expect (they set
no argtypes, so each argument is passed as NVML's C type expects), reads the structs back into
plain dataclasses, and turns
`NVMLError` into `NvmlError` carrying the NVML return code. pynvml is imported on first use
(`load()`), so nothing else in peerpods needs it installed.

Two numbering systems meet here (docs/podvm.md): a GPU-instance profile *enum* is what
`nvmlDeviceGetGpuInstanceProfileInfo` takes; the `id` it returns is what every other GI call
takes. Profiles are keyed by their name ("3g.40gb"), the one thing the adaptor's plan and the
driver share.
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from providers.core.errors import PeerpodsError

# nvmlReturn_t values used by name (nvml.h)
NOT_SUPPORTED = 3
INVALID_ARGUMENT = 2
NOT_FOUND = 6
RESET_REQUIRED = 16
IN_USE = 19
FUNCTION_NOT_FOUND = 13
INSUFFICIENT_RESOURCES = 23
MIG_DISABLE = 0
MIG_ENABLE = 1
_ERROR_NAMES = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    6: "Not Found",
    9: "Driver Not Loaded",
    13: "Function Not Found",
    16: "GPU requires restart",
    19: "In use by another client",
    23: "Insufficient resources",
    999: "Unknown Error",
}


class NvmlError(PeerpodsError):
    """An NVML call failed; `code` is its nvmlReturn_t."""

    def __init__(self, call: str, code: int, text: str = "") -> None:
        self.call = call
        self.code = code
        self.text = text or _ERROR_NAMES.get(code, f"error {code}")
        super().__init__(f"{call}: {self.text} (NVML {code})")


class NvmlMissing(PeerpodsError):
    """The NVML bindings are not installed."""


def load() -> Any:
    """The pynvml module; NvmlMissing with the install hint when absent."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise NvmlMissing(
            "the NVML bindings are not installed: pip install 'peerpods[podvm]'"
        ) from None


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    minor: int
    name: str
    handle: Any


@dataclass(frozen=True)
class GiProfile:
    name: str  # "3g.40gb", "1g.10gb+me" (NVML's name without its "MIG " prefix)
    enum: int
    id: int
    slices: int  # compute slices (sliceCount)
    memory_mib: int
    instances: int


@dataclass(frozen=True)
class GpuInstance:
    id: int
    profile_id: int
    start: int
    size: int
    handle: Any


@dataclass(frozen=True)
class ComputeInstance:
    id: int
    profile_id: int
    handle: Any


@dataclass(frozen=True)
class NvmlMigDevice:
    index: int  # the raw index nvmlDeviceGetMigDeviceHandleByIndex accepted
    uuid: str
    gi: int
    ci: int
    handle: Any


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """NVML through `lib` (pynvml or a stand-in); every method may raise NvmlError."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self.lib, name)(*args)
        except self.lib.NVMLError as exc:
            code = int(getattr(exc, "value", 999))
            raise NvmlError(name, code, _ERROR_NAMES.get(code, "")) from None

    # --- session -------------------------------------------------------------------------------

    def init(self) -> None:
        self._call("nvmlInit")

    def shutdown(self) -> None:
        self._call("nvmlShutdown")

    def reinit(self) -> None:
        """Drop every handle: after a MIG change a live session may still list the old set."""
        self.shutdown()
        self.init()

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    # --- GPUs ----------------------------------------------------------------------------------

    def gpus(self) -> list[Gpu]:
        out = []
        for index in range(int(self._call("nvmlDeviceGetCount"))):
            handle = self._call("nvmlDeviceGetHandleByIndex", index)
            out.append(
                Gpu(
                    index=index,
                    uuid=_text(self._call("nvmlDeviceGetUUID", handle)),
                    minor=int(self._call("nvmlDeviceGetMinorNumber", handle)),
                    name=_text(self._call("nvmlDeviceGetName", handle)),
                    handle=handle,
                )
            )
        return out

    def mig_mode(self, gpu: Gpu) -> tuple[int, int]:
        """(current, pending); (0, 0) on a GPU without MIG."""
        try:
            current, pending = self._call("nvmlDeviceGetMigMode", gpu.handle)
        except NvmlError as exc:
            if exc.code == NOT_SUPPORTED:
                return MIG_DISABLE, MIG_DISABLE
            raise
        return int(current), int(pending)

    def set_mig_mode(self, gpu: Gpu, enable: bool) -> int:
        """The activation status (an nvmlReturn_t: 0, or e.g. RESET_REQUIRED or IN_USE)."""
        mode = MIG_ENABLE if enable else MIG_DISABLE
        return int(self._call("nvmlDeviceSetMigMode", gpu.handle, mode))

    def processes(self, handle: Any) -> list[int]:
        """PIDs of compute and graphics processes on a GPU or MIG device handle."""
        pids: list[int] = []
        for call in (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        ):
            try:
                found = self._call(call, handle)
            except NvmlError as exc:
                if exc.code in (NOT_SUPPORTED, NOT_FOUND, FUNCTION_NOT_FOUND):
                    continue  # an older driver without the call, or no such list
                raise
            pids += [int(p.pid) for p in found if int(p.pid) not in pids]
        return pids

    # --- GPU instances -------------------------------------------------------------------------

    def gi_profiles(self, gpu: Gpu) -> dict[str, GiProfile]:
        """Every GI profile the GPU offers (MIG mode must be on), by name."""
        out: dict[str, GiProfile] = {}
        count = int(getattr(self.lib, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12))
        for enum in range(count):
            try:
                info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", gpu.handle, enum)
            except NvmlError as exc:
                if exc.code == INVALID_ARGUMENT:
                    break  # past the last profile this driver knows
                if exc.code == NOT_SUPPORTED:
                    continue
                raise
            name = _text(info.name).removeprefix("MIG ").strip()
            out.setdefault(
                name,
                GiProfile(
                    name=name,
                    enum=enum,
                    id=int(info.id),
                    slices=int(info.sliceCount),
                    memory_mib=int(info.memorySizeMB),
                    instances=int(info.instanceCount),
                ),
            )
        return out

    def placements(self, gpu: Gpu, profile: GiProfile) -> list[tuple[int, int]]:
        """(start, size) of every placement NVML allows for the profile."""
        count = ctypes.c_uint(0)
        self._call(
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            gpu.handle,
            profile.id,
            None,
            ctypes.byref(count),
        )
        if not count.value:
            return []
        array = (self.lib.c_nvmlGpuInstancePlacement_t * count.value)()
        self._call(
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            gpu.handle,
            profile.id,
            array,
            ctypes.byref(count),
        )
        return [(int(array[i].start), int(array[i].size)) for i in range(count.value)]

    def gpu_instances(self, gpu: Gpu, profiles: dict[str, GiProfile]) -> list[GpuInstance]:
        """Every GI on the GPU, of any profile."""
        out: list[GpuInstance] = []
        for profile in profiles.values():
            bound = max(len(self.placements(gpu, profile)), profile.instances, 1)
            array = (self.lib.c_nvmlGpuInstance_t * bound)()
            count = ctypes.c_uint(bound)
            self._call(
                "nvmlDeviceGetGpuInstances", gpu.handle, profile.id, array, ctypes.byref(count)
            )
            out += [self._gi(array[i]) for i in range(count.value)]
        return out

    def _gi(self, handle: Any) -> GpuInstance:
        info = self._call("nvmlGpuInstanceGetInfo", handle)
        return GpuInstance(
            id=int(info.id),
            profile_id=int(info.profileId),
            start=int(info.placement.start),
            size=int(info.placement.size),
            handle=handle,
        )

    def create_gi(self, gpu: Gpu, profile: GiProfile, start: int, size: int) -> GpuInstance:
        placement = self.lib.c_nvmlGpuInstancePlacement_t()
        placement.start = start
        placement.size = size
        handle = self._call(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            gpu.handle,
            profile.id,
            ctypes.byref(placement),
        )
        return self._gi(handle)

    def destroy_gi(self, gi: GpuInstance) -> None:
        self._call("nvmlGpuInstanceDestroy", gi.handle)

    # --- compute instances ---------------------------------------------------------------------

    def _ci_profile_infos(self, gi: GpuInstance) -> Iterator[Any]:
        """The GI's compute-instance profile infos, in enum order (unsupported ones skipped)."""
        count = int(getattr(self.lib, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 9))
        engine = int(getattr(self.lib, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0))
        for enum in range(count):
            try:
                info = self._call(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo", gi.handle, enum, engine
                )
            except NvmlError as exc:
                if exc.code == INVALID_ARGUMENT:
                    return
                if exc.code == NOT_SUPPORTED:
                    continue
                raise
            yield info

    def full_ci_profile(self, gi: GpuInstance, slices: int) -> int:
        """The id of the CI profile spanning all `slices` of the GI."""
        for info in self._ci_profile_infos(gi):
            if int(info.sliceCount) == slices:
                return int(info.id)
        raise NvmlError(
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            NOT_FOUND,
            f"no compute instance profile spans {slices} slices",
        )

    def compute_instances(self, gi: GpuInstance) -> list[ComputeInstance]:
        out: list[ComputeInstance] = []
        seen: set[int] = set()
        for info in self._ci_profile_infos(gi):
            if int(info.id) in seen:
                continue
            seen.add(int(info.id))
            bound = max(int(info.instanceCount), 1)
            array = (self.lib.c_nvmlComputeInstance_t * bound)()
            count = ctypes.c_uint(bound)
            self._call(
                "nvmlGpuInstanceGetComputeInstances",
                gi.handle,
                int(info.id),
                array,
                ctypes.byref(count),
            )
            for i in range(count.value):
                ci = self._call("nvmlComputeInstanceGetInfo", array[i])
                out.append(ComputeInstance(int(ci.id), int(ci.profileId), array[i]))
        return out

    def create_ci(self, gi: GpuInstance, profile_id: int) -> ComputeInstance:
        handle = self._call("nvmlGpuInstanceCreateComputeInstance", gi.handle, profile_id)
        info = self._call("nvmlComputeInstanceGetInfo", handle)
        return ComputeInstance(int(info.id), int(info.profileId), handle)

    def destroy_ci(self, ci: ComputeInstance) -> None:
        self._call("nvmlComputeInstanceDestroy", ci.handle)

    # --- MIG devices ---------------------------------------------------------------------------

    def mig_devices(self, gpu: Gpu) -> list[NvmlMigDevice]:
        """Every MIG device of the GPU, read back by UUID and GI/CI id (indices have holes)."""
        out: list[NvmlMigDevice] = []
        for index in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", gpu.handle))):
            try:
                handle = self._call("nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, index)
            except NvmlError as exc:
                if exc.code in (NOT_FOUND, INVALID_ARGUMENT):
                    continue
                raise
            out.append(
                NvmlMigDevice(
                    index=index,
                    uuid=_text(self._call("nvmlDeviceGetUUID", handle)),
                    gi=int(self._call("nvmlDeviceGetGpuInstanceId", handle)),
                    ci=int(self._call("nvmlDeviceGetComputeInstanceId", handle)),
                    handle=handle,
                )
            )
        return out
