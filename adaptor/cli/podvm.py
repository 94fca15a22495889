"""`peerpods podvm prepare`: inside the pod VM, at boot, before kata-agent serves containers
(`pull-images` and `image-mirror` are in `adaptor.cli.podvm_images`, `warm` and `cdh-config` in
`adaptor.cli.podvm_warm`).

Exit codes: 0 every planned device is ready; 1 a planned device could not be created (one line on
stderr names it; the status file has every device); 2 bad input (an unreadable layout, NVML
bindings missing); 3 the VM is rebooting once to apply a pending MIG mode change.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from adaptor.cli import flags, podvm_images, podvm_warm


def configure(parser: argparse.ArgumentParser) -> None:
    """Add this subcommand's actions and flags (no heavy imports)."""
    from adaptor.cli.settings import PodvmPrepareSettings

    sub = parser.add_subparsers(dest="podvm_command", metavar="ACTION", required=True)
    prep = sub.add_parser(
        "prepare",
        help="create the planned MIG devices and write the CDI specs for their names",
        description="Create the planned MIG devices through NVML and write the CDI specs "
        "binding each name the adaptor injects to the device created. Exit status: 0 every "
        "planned device is ready; 1 one could not be created (one line on stderr says which and "
        "why); 2 bad input; 3 rebooting once for a pending MIG mode change.",
    )
    flags.add_settings(prep, PodvmPrepareSettings)
    podvm_images.configure(sub)
    podvm_warm.configure(sub)


def run(args: argparse.Namespace) -> int:
    if args.podvm_command in ("warm", "cdh-config"):
        return podvm_warm.run(args)
    if args.podvm_command != "prepare":
        return podvm_images.run(args)
    return _prepare(args)


def _prepare(args: argparse.Namespace) -> int:
    import importlib

    from adaptor.podvm.nvml import NvmlMissing, load
    from adaptor.podvm.prepare import Options, prepare

    if args.nvml_module == "pynvml":
        lib = load()
    else:
        try:
            lib = importlib.import_module(args.nvml_module)
        except ImportError as exc:
            raise NvmlMissing(f"--nvml-module {args.nvml_module}: {exc}") from None
    options = Options(
        apf_path=Path(args.apf_json),
        legacy_path=Path(args.devices_json),
        cdi_dir=Path(args.cdi_dir),
        status_path=Path(args.status_file),
        state_dir=Path(args.state_dir),
        root=Path(args.root),
        reboot_command=tuple(shlex.split(args.reboot_command)),
        reboot=not args.no_reboot,
    )
    result = prepare(options, lib, out=lambda line: print(line, flush=True))
    if result.failed and not result.rebooting:
        print(f"peerpods podvm prepare: {result.summary()}", file=sys.stderr)
    return result.exit_code
