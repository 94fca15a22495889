"""MIG mode and MIG devices on one GPU, brought to the planned layout through NVML.

Idempotent: a GPU instance already at a planned (profile, start slot) is kept with its compute
instance; anything else on the GPU conflicts and is destroyed only when no process holds it
(otherwise the planned devices it overlaps fail, saying which processes hold it). Each planned GPU
instance is created *at its placement* and gets one compute instance spanning it. Ids are read
back, never computed: GI ids come from per-size pools in no fixed order (docs/podvm.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from adaptor.podvm.layout import MigSpec
from adaptor.podvm.nvml import (
    IN_USE,
    MIG_ENABLE,
    RESET_REQUIRED,
    GiProfile,
    Gpu,
    GpuInstance,
    Nvml,
    NvmlError,
)
from adaptor.podvm.status import DeviceRecord

log = logging.getLogger(__name__)


class Mode(Enum):
    """Where a GPU's MIG mode stands against what the layout needs."""

    READY = "ready"
    CHANGED = "changed"  # switched now; NVML must be re-initialised before further calls
    NEEDS_RESET = "needs reset"  # pending until the GPU resets: on passthrough, a reboot
    FAILED = "failed"


@dataclass
class ModeResult:
    mode: Mode
    reason: str = ""


def ensure_mode(nvml: Nvml, gpu: Gpu, enable: bool) -> ModeResult:
    """Bring the GPU's MIG mode to `enable` (a whole GPU needs it off, MIG devices on)."""
    want = 1 if enable else 0
    word = "enabled" if enable else "disabled"
    try:
        current, pending = nvml.mig_mode(gpu)
        if current == want:
            if pending != want:  # someone asked for the other mode at the next reset: undo
                try:
                    nvml.set_mig_mode(gpu, enable)
                except NvmlError as exc:
                    log.warning(
                        "GPU %d: cannot cancel a pending MIG mode change: %s", gpu.index, exc
                    )
            return ModeResult(Mode.READY)
        if not enable:
            reason = release_all(nvml, gpu)
            if reason:
                return ModeResult(Mode.FAILED, f"cannot disable MIG mode: {reason}")
        status = nvml.set_mig_mode(gpu, enable) if pending != want else RESET_REQUIRED
    except NvmlError as exc:
        return ModeResult(Mode.FAILED, f"cannot set MIG mode {word}: {exc}")
    if status == RESET_REQUIRED:
        return ModeResult(Mode.NEEDS_RESET, f"MIG mode {word} is pending until the GPU resets")
    if status == IN_USE:
        return ModeResult(Mode.FAILED, f"cannot set MIG mode {word}: the GPU is in use")
    if status != 0:
        return ModeResult(Mode.FAILED, f"cannot set MIG mode {word}: activation status {status}")
    return ModeResult(Mode.CHANGED)


def mode_now(nvml: Nvml, gpu: Gpu, enable: bool) -> ModeResult:
    """After a re-init: did the change take effect, or is it pending a reset?"""
    try:
        current, _ = nvml.mig_mode(gpu)
    except NvmlError as exc:
        return ModeResult(Mode.FAILED, str(exc))
    if current == (MIG_ENABLE if enable else 0):
        return ModeResult(Mode.READY)
    word = "enabled" if enable else "disabled"
    return ModeResult(Mode.NEEDS_RESET, f"MIG mode {word} is pending until the GPU resets")


def release_all(nvml: Nvml, gpu: Gpu) -> str:
    """Destroy every GI/CI on the GPU when no process holds any; the reason when one does."""
    profiles = nvml.gi_profiles(gpu)
    instances = nvml.gpu_instances(gpu, profiles)
    holders = _holders(nvml, gpu)
    held = sorted({pid for gi in instances for pid in holders.get(gi.id, [])})
    if held:
        return f"processes {', '.join(map(str, held))} use its MIG devices"
    for gi in instances:
        _destroy(nvml, gi)
    return ""


def _holders(nvml: Nvml, gpu: Gpu) -> dict[int, list[int]]:
    """GI id -> PIDs running on its MIG devices."""
    out: dict[int, list[int]] = {}
    for device in nvml.mig_devices(gpu):
        pids = nvml.processes(device.handle)
        if pids:
            out.setdefault(device.gi, []).extend(pids)
    return out


def _destroy(nvml: Nvml, gi: GpuInstance) -> None:
    for ci in nvml.compute_instances(gi):
        nvml.destroy_ci(ci)
    nvml.destroy_gi(gi)


@dataclass
class Planned:
    spec: MigSpec
    record: DeviceRecord
    profile: GiProfile | None = None
    size: int = 0
    gi: GpuInstance | None = None
    slots: range = field(default_factory=lambda: range(0))


def reconcile(nvml: Nvml, gpu: Gpu, planned: Sequence[tuple[MigSpec, DeviceRecord]]) -> bool:
    """Create the GPU's planned MIG devices (MIG mode is on); fills each record's GI/CI ids or
    its error. True when anything on the GPU changed."""
    try:
        profiles = nvml.gi_profiles(gpu)
        existing = nvml.gpu_instances(gpu, profiles)
    except NvmlError as exc:
        for _, record in planned:
            record.fail(f"cannot read the GPU's MIG configuration: {exc}")
        return False
    items = [Planned(spec, record) for spec, record in planned]
    for item in items:
        _place(nvml, gpu, profiles, item)
    wanted = {(i.profile.id, i.spec.start): i for i in items if i.profile is not None}
    keep: list[GpuInstance] = []
    for gi in existing:
        match = wanted.get((gi.profile_id, gi.start))
        if match is not None and match.gi is None:
            match.gi = gi
            keep.append(gi)
    conflicts = [gi for gi in existing if gi not in keep]
    changed = _clear_conflicts(nvml, gpu, profiles, conflicts, items) if conflicts else False
    for item in sorted(items, key=lambda i: i.spec.start):
        if item.profile is None or item.record.error:
            continue
        if item.gi is None:
            try:
                item.gi = nvml.create_gi(gpu, item.profile, item.spec.start, item.size)
                changed = True
            except NvmlError as exc:
                item.record.fail(f"cannot create GPU instance: {exc}")
                continue
        changed |= _one_full_ci(nvml, item)
    return changed


def _place(nvml: Nvml, gpu: Gpu, profiles: Mapping[str, GiProfile], item: Planned) -> None:
    """The item's GI profile and slots, checked against what NVML offers (else its error)."""
    profile = profiles.get(item.spec.profile)
    if profile is None:
        offered = ", ".join(sorted(profiles)) or "none"
        item.record.fail(
            f"profile {item.spec.profile} is not offered by {gpu.name} (offered: {offered})"
        )
        return
    try:
        allowed = nvml.placements(gpu, profile)
    except NvmlError as exc:
        item.record.fail(f"cannot list placements of {profile.name}: {exc}")
        return
    sizes = [size for start, size in allowed if start == item.spec.start]
    if not sizes:
        starts = ", ".join(str(s) for s, _ in allowed)
        item.record.fail(
            f"slot {item.spec.start} is not a placement of {profile.name} "
            f"(allowed starts: {starts})"
        )
        return
    item.profile, item.size = profile, sizes[0]
    item.slots = range(item.spec.start, item.spec.start + item.size)


def _clear_conflicts(
    nvml: Nvml,
    gpu: Gpu,
    profiles: Mapping[str, GiProfile],
    conflicts: Sequence[GpuInstance],
    items: Sequence[Planned],
) -> bool:
    """Remove GPU instances the layout does not want; one in use by a process is kept, and the
    planned devices whose slots it holds fail. True when one was removed."""
    by_id = {p.id: p for p in profiles.values()}
    holders = _holders(nvml, gpu)
    changed = False
    for gi in conflicts:
        name = by_id[gi.profile_id].name if gi.profile_id in by_id else f"id {gi.profile_id}"
        pids = holders.get(gi.id, [])
        slots = set(range(gi.start, gi.start + gi.size))
        blocked = [item for item in items if item.gi is None and set(item.slots) & slots]
        if pids:
            reason = (
                f"slots {gi.start}-{gi.start + gi.size - 1} hold GPU instance {gi.id} ({name}) "
                f"in use by processes {', '.join(map(str, sorted(set(pids))))}"
            )
            for item in blocked:
                item.record.fail(reason)
            continue
        try:
            _destroy(nvml, gi)
        except NvmlError as exc:
            for item in blocked:
                item.record.fail(f"cannot remove GPU instance {gi.id} ({name}): {exc}")
            continue
        changed = True
        log.info(
            "GPU %d: removed GPU instance %d (%s at slot %d), not in the layout",
            gpu.index, gi.id, name, gi.start,
        )  # fmt: skip
    return changed


def _one_full_ci(nvml: Nvml, item: Planned) -> bool:
    """Exactly one compute instance spanning the GI; True when one was created or removed."""
    assert item.gi is not None and item.profile is not None
    gi = item.gi
    item.record.gi = gi.id
    try:
        full = nvml.full_ci_profile(gi, item.profile.slices)
        cis = nvml.compute_instances(gi)
        if len(cis) == 1 and cis[0].profile_id == full:
            item.record.ci = cis[0].id
            return False
        for ci in cis:
            nvml.destroy_ci(ci)
        ci = nvml.create_ci(gi, full)
    except NvmlError as exc:
        item.record.fail(f"cannot create the compute instance of GPU instance {gi.id}: {exc}")
        return False
    item.record.ci = ci.id
    return True
