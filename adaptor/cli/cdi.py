"""`peerpods cdi`: the CDI library as a tool.

peerpods cdi validate FILE...                                   exit 0 when every spec loads
peerpods cdi list --spec-dir DIR [--spec-dir DIR ...]          devices, one per line
peerpods cdi apply --spec-dir DIR --oci CONFIG.json DEVICE...   the edited OCI spec (JSON)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    """Add this subcommand's actions and flags (no heavy imports)."""
    sub = parser.add_subparsers(dest="cdi_command", metavar="ACTION", required=True)
    validate = sub.add_parser("validate", help="load spec files strictly; report every error")
    validate.add_argument("files", nargs="+", metavar="FILE")
    listing = sub.add_parser("list", help="devices of spec dirs (later dirs win)")
    _spec_dirs(listing)
    listing.add_argument("--output", choices=["names", "json"], default="names")
    apply = sub.add_parser("apply", help="apply devices to an OCI config.json, print the result")
    _spec_dirs(apply)
    apply.add_argument(
        "--oci",
        required=True,
        metavar="CONFIG.json",
        help="OCI runtime spec to edit ('-' reads stdin)",
    )
    apply.add_argument(
        "--no-stat",
        action="store_true",
        help="refuse device nodes without type/major/minor instead of reading "
        "them from this machine's /dev (what edits mode does)",
    )
    apply.add_argument("devices", nargs="+", metavar="DEVICE", help="vendor/class=name")


def _spec_dirs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--spec-dir",
        action="append",
        required=True,
        metavar="DIR",
        help="a CDI spec dir; repeat, lowest priority first",
    )


def run(args: argparse.Namespace) -> int:
    from adaptor.cdi import CdiError, Registry, host_stat, load_spec, spec_to_dict

    if args.cdi_command == "validate":
        failed = 0
        for path in args.files:
            try:
                spec = load_spec(path)
            except CdiError as exc:
                failed += 1
                print(f"invalid: {exc}", file=sys.stderr)
            else:
                print(
                    f"ok: {path}: {spec.kind} cdiVersion {spec.version}, "
                    f"{len(spec.devices)} devices"
                )
        return 1 if failed else 0
    missing = [d for d in args.spec_dir if not Path(d).is_dir()]
    if missing:
        raise CdiError(f"{missing[0]}: no such spec directory")
    registry = Registry(args.spec_dir)
    for path, errors in registry.errors.items():
        for error in errors:
            print(
                f"warning: {path}: {error}" if path not in error else f"warning: {error}",
                file=sys.stderr,
            )
    if args.cdi_command == "list":
        if args.output == "json":
            doc = {}
            for name, hit in registry.devices.items():
                devices = spec_to_dict(hit.spec)["devices"]
                entry = next(d for d in devices if d["name"] == hit.device.name)
                doc[name] = {"spec": hit.spec.path, "priority": hit.spec.priority, **entry}
            print(json.dumps(doc, indent=2))
        else:
            for name in registry.list_devices():
                print(name)
        return 0
    try:
        text = sys.stdin.read() if args.oci == "-" else Path(args.oci).read_text("utf-8")
        oci = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CdiError(f"{args.oci}: not JSON: {exc}") from None
    if not isinstance(oci, dict):
        raise CdiError(f"{args.oci}: an OCI spec is a JSON object")
    registry.inject(oci, args.devices, None if args.no_stat else host_stat)
    print(json.dumps(oci, indent=2))
    return 0
