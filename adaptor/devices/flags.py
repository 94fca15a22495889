"""The CDI flags of `peerpods serve` (with env twins) and what they configure."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from adaptor.cdi import Registry
from adaptor.cli import flags
from adaptor.devices.naming import CdiNaming, naming_from_flags
from adaptor.devices.rewrite import CdiMode
from providers.errors import InvalidRequest

DEFAULT_EDITS_SPEC_DIR = "/etc/peerpods/cdi"


def add_cdi_flags(parser: argparse.ArgumentParser) -> None:
    """Add --cdi-mode, --cdi-spec-dir and the CDI name templates to a parser."""
    default = CdiNaming()
    flags.add(
        parser,
        "--cdi-mode",
        choices=["annotations", "edits"],
        default="annotations",
        help="annotations: kata-agent resolves cdi.k8s.io/* against the pod VM's CDI specs; "
        "edits: the adaptor applies the --cdi-spec-dir specs into the OCI spec itself",
    )
    flags.add(
        parser,
        "--cdi-spec-dir",
        default=DEFAULT_EDITS_SPEC_DIR,
        help="CDI spec dirs for edits mode, comma-separated, lowest priority first",
    )
    flags.add(
        parser,
        "--cdi-gpu-name",
        default=default.gpu,
        help="CDI name template of a whole GPU ({index}: its index in the VM)",
    )
    flags.add(
        parser,
        "--cdi-mig-name",
        default=default.mig,
        help="CDI name template of a MIG device ({gpu}, {mig}: GPU and MIG index)",
    )
    flags.add(
        parser,
        "--cdi-rdma-name",
        default=default.rdma,
        help="CDI name template of an RDMA device ({index}: its index)",
    )


@dataclass(frozen=True)
class CdiConfig:
    """What the CDI flags configure: the mode, edits-mode registry and the device naming."""

    mode: CdiMode
    naming: CdiNaming
    registry: Registry | None


def cdi_config_from_args(args: argparse.Namespace) -> CdiConfig:
    """Validate the CDI flags; edits mode loads its specs now so a bad spec fails at start."""
    mode = args.cdi_mode
    if mode not in ("annotations", "edits"):
        raise InvalidRequest(f"--cdi-mode: unknown mode {mode!r}")
    naming = naming_from_flags(args.cdi_gpu_name, args.cdi_mig_name, args.cdi_rdma_name)
    registry = None
    if mode == "edits":
        dirs = [d.strip() for d in str(args.cdi_spec_dir).split(",") if d.strip()]
        if not dirs:
            raise InvalidRequest("--cdi-spec-dir: edits mode needs at least one directory")
        registry = Registry(dirs)
        if registry.errors:
            errors = next(iter(registry.errors.values()))
            raise InvalidRequest(f"--cdi-spec-dir: {errors[0]}")
    return CdiConfig(mode, naming, registry)
