#!/usr/bin/env python3
"""Read-only checks on a machine with NVIDIA GPUs (a pod VM, or any GPU host).

1. NVML's GPU instance profiles and possible placements against `providers/core/mig.py`'s tables
   (on GPUs whose MIG mode is already on: listing profiles needs it, and this script never
   changes MIG mode or creates anything);
2. the whole-GPU CDI spec `peerpods podvm prepare` would write against what
   `nvidia-ctk cdi generate` produces, when nvidia-ctk is installed (it writes into a temporary
   directory only).

Usage: scripts/podvm_check.py [--root /] [--nvml-module pynvml] [--nvidia-ctk PATH]
Exit 0 when everything agrees, 1 on a difference that matters, 2 when NVML is unusable.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adaptor.cdi import Spec

ROOT = Path(__file__).resolve().parent.parent


def check_profiles(nvml: Any, gpu: Any, out: list[str]) -> bool:
    """NVML's profiles and placements vs the table for the GPU's model; True when they agree."""
    from providers.core.errors import InvalidRequest
    from providers.core.gpus import resolve_gpu
    from providers.core.mig import profiles_for

    try:
        model = resolve_gpu(gpu.name).id
    except InvalidRequest:
        out.append(f"GPU {gpu.index} {gpu.name}: unknown model; nothing to compare")
        return True
    table = profiles_for(model)
    current, pending = nvml.mig_mode(gpu)
    if current != 1:
        note = " (enabled at the next reset)" if pending == 1 else ""
        out.append(
            f"GPU {gpu.index} {gpu.name} ({model}): MIG mode off{note}; profiles are "
            "listed only with MIG on, and this script never changes it"
        )
        return True
    if not table:
        out.append(
            f"GPU {gpu.index} {gpu.name} ({model}): MIG on, but providers/core/mig.py has no "
            "profiles for it"
        )
        return False
    ok = True
    profiles = nvml.gi_profiles(gpu)
    for name, spec in table.items():
        found = profiles.get(name)
        if found is None:
            out.append(
                f"GPU {gpu.index} ({model}): {name} is in providers/core/mig.py, not in NVML"
            )
            ok = False
            continue
        placements = nvml.placements(gpu, found)
        starts = tuple(sorted(s for s, _ in placements))
        sizes = {size for _, size in placements}
        problems = []
        if starts != tuple(sorted(spec.starts)):
            problems.append(f"starts NVML {starts} vs table {spec.starts}")
        if sizes != {spec.memory_slots}:
            problems.append(f"sizes NVML {sorted(sizes)} vs table {spec.memory_slots}")
        if found.slices != spec.compute_slices:
            problems.append(f"slices NVML {found.slices} vs table {spec.compute_slices}")
        if found.instances != spec.max_per_gpu:
            problems.append(f"instances NVML {found.instances} vs table {spec.max_per_gpu}")
        verdict = "; ".join(problems) if problems else "agrees"
        out.append(f"GPU {gpu.index} ({model}): {name} id {found.id} enum {found.enum}: {verdict}")
        ok = ok and not problems
    for name in sorted(set(profiles) - set(table)):
        out.append(
            f"GPU {gpu.index} ({model}): NVML also offers {name} (not in providers/core/mig.py)"
        )
    return ok


def check_whole_gpu_spec(nvml: Any, gpus: list[Any], root: Path, ctk: str, out: list[str]) -> bool:
    """Our whole-GPU spec vs nvidia-ctk's; True when every node we bind is one nvidia-ctk binds."""
    from adaptor.podvm.host import Host
    from adaptor.podvm.spec import build_specs
    from adaptor.podvm.status import DeviceRecord

    whole = [g for g in gpus if nvml.mig_mode(g)[0] != 1]
    if not whole:
        out.append("every GPU is in MIG mode: no whole-GPU spec to compare")
        return True
    records = [
        DeviceRecord(
            name=f"peerpods.io/gpu=gpu{g.index}",
            kind="gpu",
            gpu=g.index,
            uuid=g.uuid,
            state="ready",
        )
        for g in whole
    ]
    ours = build_specs(records, {g.index: g for g in gpus}, Host(root), nvml.driver_version())
    spec = ours.get("peerpods.io/gpu")
    if spec is None:
        out.append("no whole-GPU device could be described: " + "; ".join(r.error for r in records))
        return False
    if not ctk:
        out.append("nvidia-ctk not installed: whole-GPU spec not compared")
        return True
    theirs = _ctk_spec(ctk, out)
    if theirs is None:
        return False
    ok = _compare_gpus(spec, theirs, whole, out)
    _compare_common(spec, theirs, out)
    return ok


def _ctk_spec(ctk: str, out: list[str]) -> Spec | None:
    """The spec `nvidia-ctk cdi generate` writes for this machine (None, said in `out`, when it
    fails)."""
    from adaptor.cdi import load_spec

    with tempfile.TemporaryDirectory(prefix="podvm-check-") as tmp:
        target = Path(tmp) / "nvidia.json"
        run = subprocess.run(
            [
                ctk,
                "cdi",
                "generate",
                f"--output={target}",
                "--format=json",
                "--device-name-strategy=index",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if run.returncode != 0:
            out.append(f"nvidia-ctk cdi generate failed: {run.stderr.strip()[-300:]}")
            return None
        return load_spec(str(target))


def _compare_gpus(spec: Spec, theirs: Spec, whole: list[Any], out: list[str]) -> bool:
    """Each whole GPU's nodes, ours against nvidia-ctk's; True when we bind none it does not."""
    ok = True
    for g in whole:
        mine = {n.path for n in spec.device(f"gpu{g.index}").edits.device_nodes}  # type: ignore[union-attr]
        device = theirs.device(str(g.index))
        if device is None:
            out.append(f"GPU {g.index}: nvidia-ctk's spec has no device {g.index}")
            ok = False
            continue
        other = {n.path for n in device.edits.device_nodes}
        missing = sorted(mine - other)
        out.append(
            f"GPU {g.index}: nodes ours {sorted(mine)}; nvidia-ctk also binds "
            f"{sorted(other - mine) or 'nothing else'}"
        )
        if missing:
            out.append(f"GPU {g.index}: we bind {missing}, nvidia-ctk does not")
            ok = False
    return ok


def _compare_common(spec: Spec, theirs: Spec, out: list[str]) -> None:
    """What the two specs give every device: control nodes, driver mounts, hooks."""
    for what, a, b in (
        (
            "common nodes",
            {n.path for n in spec.edits.device_nodes},
            {n.path for n in theirs.edits.device_nodes},
        ),
        (
            "driver mounts",
            {m.host_path for m in spec.edits.mounts},
            {m.host_path for m in theirs.edits.mounts},
        ),
        (
            "hooks",
            {h.args[1] for h in spec.edits.hooks if len(h.args) > 1},
            {h.args[1] for h in theirs.edits.hooks if len(h.args) > 1},
        ),
    ):
        out.append(
            f"{what}: only ours {sorted(a - b) or '-'}; only nvidia-ctk's {sorted(b - a) or '-'}"
        )


def main(argv: list[str] | None = None, lib: Any = None) -> int:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/", help="where /dev and the driver files are read")
    parser.add_argument("--nvml-module", default="pynvml")
    parser.add_argument(
        "--nvidia-ctk",
        default=shutil.which("nvidia-ctk") or "",
        help="nvidia-ctk binary ('' to skip the spec comparison)",
    )
    args = parser.parse_args(argv)
    from adaptor.podvm.nvml import Nvml, NvmlError

    if lib is None:
        try:
            lib = importlib.import_module(args.nvml_module)
        except ImportError as exc:
            print(f"podvm_check: cannot import {args.nvml_module}: {exc}", file=sys.stderr)
            return 2
    nvml = Nvml(lib)
    out: list[str] = []
    try:
        nvml.init()
    except NvmlError as exc:
        print(f"podvm_check: NVML unusable: {exc}", file=sys.stderr)
        return 2
    try:
        gpus = nvml.gpus()
        out.append(f"driver {nvml.driver_version()}, {len(gpus)} GPU(s)")
        ok = all([check_profiles(nvml, g, out) for g in gpus])
        ok = check_whole_gpu_spec(nvml, gpus, Path(args.root), args.nvidia_ctk, out) and ok
    except NvmlError as exc:
        out.append(f"NVML call failed: {exc}")
        ok = False
    finally:
        nvml.shutdown()
    print("\n".join(out))
    print("OK" if ok else "DIFFERENCES FOUND")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
