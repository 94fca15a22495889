"""`podvm prepare`: the planned devices created and bound to their CDI names, once, at boot.

    layout (apf.json key, or legacy devices.json)
      -> MIG mode per GPU (on for MIG devices, off for whole GPUs; a change pending a reset on a
         passthrough GPU reboots the VM once, never twice for the same layout)
      -> per GPU: GPU instances at their planned placements, one full compute instance each
      -> NVML re-initialised, every MIG device read back (UUID, GI id, CI id)
      -> CDI specs for the devices that exist, the status file, a console line per device

A device that cannot be created fails alone: the others are still prepared, the spec leaves it
out, and the run exits non-zero naming it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptor.podvm import mig as migops
from adaptor.podvm.host import Host
from adaptor.podvm.layout import (
    Layout,
    LayoutDocument,
    LayoutError,
    load_json,
    parse_document,
    read_layouts,
)
from adaptor.podvm.nvml import Gpu, Nvml, NvmlError
from adaptor.podvm.spec import build_specs, clashes, write_specs
from adaptor.podvm.status import DeviceRecord, status_json, write_atomic, write_status

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_REBOOT = 3


@dataclass(frozen=True)
class Options:
    """Where `prepare` reads and writes; built from the `peerpods podvm prepare` settings, whose
    declarations (`adaptor.cli.settings.PodvmPrepareSettings`) hold a CAA pod VM's paths."""

    apf_path: Path
    legacy_path: Path
    cdi_dir: Path
    status_path: Path
    state_dir: Path
    root: Path
    reboot_command: tuple[str, ...]
    reboot: bool = True
    other_cdi_dirs: tuple[Path, ...] = (Path("/etc/cdi"),)


@dataclass
class Result:
    """What one run did; `exit_code` is what the command returns."""

    records: list[DeviceRecord] = field(default_factory=list)
    specs: list[str] = field(default_factory=list)
    source: str = ""
    rebooting: bool = False
    changed: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[DeviceRecord]:
        return [r for r in self.records if r.state != "ready"]

    @property
    def exit_code(self) -> int:
        if self.rebooting:
            return EXIT_REBOOT
        return EXIT_FAILED if self.failed else EXIT_OK

    def summary(self) -> str:
        """One line: what a failed boot says on the console and in the unit's status."""
        if self.rebooting:
            return "rebooting once to apply a pending MIG mode change"
        if not self.records:
            return "no devices planned for this VM"
        failed = self.failed
        if not failed:
            return f"{len(self.records)} planned device(s) ready"
        first = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return (
            f"{len(failed)} of {len(self.records)} planned devices could not be created: "
            f"{first.name} ({first.what()}): {first.error}{more}"
        )


class RebootGuard:
    """Reboot at most once per layout: a marker in persistent state names the boot that asked.

    The layout is saved beside it, because `/run` (where user data lands) may not be written
    again after the reboot (cloud-init's write_files runs once per instance).
    """

    def __init__(self, state_dir: Path, boot_id: str) -> None:
        self.marker = state_dir / "reboot.json"
        self.saved = state_dir / "layout.json"
        self.boot_id = boot_id

    def _read(self) -> dict[str, Any]:
        try:
            data = load_json(self.marker.read_text(), str(self.marker))
        except (OSError, UnicodeDecodeError, LayoutError):
            return {}
        return data if isinstance(data, dict) else {}

    def saved_layouts(self) -> LayoutDocument | None:
        """The layout saved before a reboot, when one is pending."""
        if not self._read():
            return None
        try:
            raw = load_json(self.saved.read_text(), str(self.saved))
        except (OSError, UnicodeDecodeError, LayoutError):
            return None
        return parse_document(raw, str(self.saved))

    def may_reboot(self, digest: str) -> bool:
        marker = self._read()
        return not (marker.get("layout") == digest and marker.get("boot_id") != self.boot_id)

    def arm(self, digest: str, document: LayoutDocument) -> None:
        write_atomic(self.saved, json.dumps(document.to_dict(), sort_keys=True))
        write_atomic(self.marker, json.dumps({"layout": digest, "boot_id": self.boot_id}))

    def clear(self) -> None:
        for path in (self.marker, self.saved):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # a read-only or missing state dir holds no guard
                log.debug("%s: %s", path, exc)


def digest_of(document: LayoutDocument) -> str:
    return hashlib.sha256(json.dumps(document.to_dict(), sort_keys=True).encode()).hexdigest()


def choose_layout(document: LayoutDocument, gpus: Sequence[Gpu]) -> Layout | None:
    """The layout for this VM's GPUs: the one whose model is the GPUs' model, else the only one."""
    from providers.core.errors import InvalidRequest
    from providers.core.gpus import resolve_gpu

    layouts = [layout for layout in document.layouts if not layout.empty]
    if not layouts:
        return None
    models: set[str] = set()
    for gpu in gpus:
        try:
            models.add(resolve_gpu(gpu.name).id)
        except InvalidRequest:
            continue
    for layout in layouts:
        if layout.model in models:
            return layout
    if len(layouts) > 1 and models:
        log.warning(
            "no layout for GPU model(s) %s; using the one for %s",
            ",".join(sorted(models)),
            layouts[0].model,
        )
    return layouts[0]


def records_for(layout: Layout) -> list[tuple[DeviceRecord, Any]]:
    """(record, the layout entry it comes from) for every device of the layout."""
    out: list[tuple[DeviceRecord, Any]] = []
    for gpu in layout.gpus:
        if gpu.name:
            out.append((DeviceRecord(name=gpu.name, kind="gpu", gpu=gpu.index), gpu))
        for m in gpu.mig:
            out.append(
                (
                    DeviceRecord(
                        name=m.name, kind="mig", gpu=gpu.index, profile=m.profile, start=m.start
                    ),
                    m,
                )
            )
    for i, name in enumerate(layout.rdma):
        out.append((DeviceRecord(name=name, kind="rdma", rdma_index=i), None))
    return out


def prepare(options: Options, lib: Any, out: Callable[[str], None] = print) -> Result:
    """Bring the VM's devices to the layout it was sent and write their CDI specs."""
    host = Host(options.root)
    guard = RebootGuard(options.state_dir, host.boot_id())
    document, source = read_layouts(options.apf_path, options.legacy_path)
    if not document.layouts:
        saved = guard.saved_layouts()
        if saved is not None:
            document, source = saved, str(guard.saved)
    result = Result(source=source)
    if not document.layouts:
        result.specs = write_specs({}, options.cdi_dir)
        _finish(options, result, out)
        return result

    nvml = Nvml(lib)
    needs_gpus = any(layout.gpus for layout in document.layouts)
    try:
        if needs_gpus:
            nvml.init()
    except NvmlError as exc:
        layout = document.layouts[0]
        result.records = [record for record, _ in records_for(layout)]
        for record in result.records:
            if record.kind != "rdma":
                record.fail(f"NVML is not available: {exc}")
            else:
                record.state = "ready"
        result.specs = write_specs(build_specs(result.records, {}, host, ""), options.cdi_dir)
        _finish(options, result, out)
        return result
    try:
        _prepare_gpus(options, nvml, host, guard, document, result, needs_gpus)
    except NvmlError as exc:  # a call outside any one device's steps: every device fails
        if not result.records:
            result.records = [record for record, _ in records_for(document.layouts[0])]
        for record in result.records:  # no spec was written
            record.state, record.error = "failed", record.error or f"NVML: {exc}"
    finally:
        if needs_gpus:
            try:
                nvml.shutdown()
            except NvmlError as exc:
                log.warning("%s", exc)
    _finish(options, result, out)
    return result


# Each GPU's planned devices, as (record, layout entry) pairs.
ByGpu = dict[int, list[tuple[DeviceRecord, Any]]]


def _prepare_gpus(
    options: Options,
    nvml: Nvml,
    host: Host,
    guard: RebootGuard,
    document: LayoutDocument,
    result: Result,
    needs_gpus: bool,
) -> None:
    """MIG modes, then MIG devices, then everything read back into CDI specs."""
    gpus = nvml.gpus() if needs_gpus else []
    layout = choose_layout(document, gpus)
    if layout is None:  # only empty layouts: nothing planned
        result.specs = write_specs({}, options.cdi_dir)
        return
    entries = records_for(layout)
    result.records = [record for record, _ in entries]
    by_gpu: ByGpu = {}
    for record, entry in entries:
        if record.kind == "rdma":
            record.state = "ready"
        elif record.gpu is not None:
            by_gpu.setdefault(record.gpu, []).append((record, entry))
    gpus, modes = _ensure_modes(nvml, gpus, layout, by_gpu, result)
    if _settle_pending_modes(options, guard, document, modes, by_gpu, result):
        return  # rebooting once, to finish a mode change
    for spec in layout.gpus:  # MIG devices, GPU by GPU
        if not spec.mig or spec.index not in modes:
            continue
        if modes[spec.index].mode is not migops.Mode.READY:
            continue
        planned = [(entry, record) for record, entry in by_gpu[spec.index] if not record.error]
        if planned:
            result.changed |= migops.reconcile(nvml, gpus[spec.index], planned)
    gpus = _read_back(nvml, layout, by_gpu)
    version = nvml.driver_version()
    specs = build_specs(result.records, {g.index: g for g in gpus}, host, version)
    result.specs = write_specs(specs, options.cdi_dir)
    result.warnings += clashes(list(specs), [options.cdi_dir, *options.other_cdi_dirs])


def _ensure_modes(
    nvml: Nvml, gpus: list[Gpu], layout: Layout, by_gpu: ByGpu, result: Result
) -> tuple[list[Gpu], dict[int, migops.ModeResult]]:
    """MIG mode on where the layout has MIG devices, off where it wants a whole GPU; the GPUs
    are listed again after a switch (handles and minor numbers may change on reset)."""
    modes: dict[int, migops.ModeResult] = {}
    for spec in layout.gpus:
        if spec.index >= len(gpus):
            for record, _ in by_gpu[spec.index]:
                record.fail(f"the VM has {len(gpus)} GPU(s), no GPU {spec.index}")
            continue
        modes[spec.index] = migops.ensure_mode(nvml, gpus[spec.index], enable=bool(spec.mig))
    switched = [
        spec
        for spec in layout.gpus
        if spec.index in modes and modes[spec.index].mode is migops.Mode.CHANGED
    ]
    if switched:
        result.changed = True
        nvml.reinit()
        gpus = nvml.gpus()
        for spec in switched:
            modes[spec.index] = migops.mode_now(nvml, gpus[spec.index], enable=bool(spec.mig))
    return gpus, modes


def _settle_pending_modes(
    options: Options,
    guard: RebootGuard,
    document: LayoutDocument,
    modes: dict[int, migops.ModeResult],
    by_gpu: ByGpu,
    result: Result,
) -> bool:
    """Fail the devices of GPUs whose mode change needs a reset, or arm one reboot for them
    (True: rebooting); a failed mode change fails its GPU's devices."""
    pending = {i: m.reason for i, m in modes.items() if m.mode is migops.Mode.NEEDS_RESET}
    digest = digest_of(document)
    if pending:
        why = "rebooting is turned off"
        if options.reboot and guard.may_reboot(digest):
            try:
                guard.arm(digest, document)
            except OSError as exc:
                why = f"not rebooting: cannot write the reboot guard: {exc.strerror or exc}"
            else:
                result.rebooting = True
                for index, reason in sorted(pending.items()):
                    for record, _ in by_gpu[index]:
                        record.fail(f"{reason}: rebooting once")
                return True
        elif options.reboot:
            why = "still pending after a reboot; this platform cannot reset the GPU"
        for index, reason in pending.items():
            for record, _ in by_gpu[index]:
                record.fail(f"{reason}, {why}")
    else:
        guard.clear()
    for index, mode in modes.items():
        if mode.mode is migops.Mode.FAILED:
            for record, _ in by_gpu[index]:
                record.fail(mode.reason)
    return False


def _read_back(nvml: Nvml, layout: Layout, by_gpu: ByGpu) -> list[Gpu]:
    """Every planned device as a fresh NVML session sees it: UUIDs and MIG indexes filled in,
    a device NVML does not list failed."""
    nvml.reinit()
    gpus = nvml.gpus()
    for spec in layout.gpus:
        if spec.index >= len(gpus):
            continue
        gpu = gpus[spec.index]
        records = [r for r, _ in by_gpu[spec.index] if not r.error]
        if spec.name:
            for record in records:
                record.uuid, record.state = gpu.uuid, "ready"
            continue
        try:
            devices = {(d.gi, d.ci): d for d in nvml.mig_devices(gpu)}
        except NvmlError as exc:
            for record in records:
                record.fail(f"cannot list MIG devices: {exc}")
            continue
        for record in records:
            gi = record.gi if record.gi is not None else -1
            ci = record.ci if record.ci is not None else -1
            device = devices.get((gi, ci))
            if device is None:
                record.fail(f"NVML lists no MIG device for GI {record.gi} CI {record.ci}")
                continue
            record.uuid, record.mig_index, record.state = device.uuid, device.index, "ready"
    return gpus


def _finish(options: Options, result: Result, out: Callable[[str], None]) -> None:
    """Status file, console lines, and the reboot when one was decided."""
    state = "rebooting" if result.rebooting else ("failed" if result.failed else "ready")
    write_status(
        options.status_path, status_json(result.records, result.source, result.specs, state)
    )
    for record in result.records:
        out(f"podvm: {record.line()}")
    for warning in result.warnings:
        out(f"podvm: warning: {warning}")
    out(f"podvm: {result.summary()}")
    if result.rebooting:
        log.warning("rebooting to apply MIG mode: %s", " ".join(options.reboot_command))
        try:
            subprocess.run(list(options.reboot_command), check=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            out(f"podvm: the reboot command failed: {exc}")
