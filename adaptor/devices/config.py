"""What the CDI flags of `peerpods serve` configure, validated at start."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from adaptor.cdi import Registry
from adaptor.devices.naming import CdiNaming, naming_from_flags
from adaptor.devices.rewrite import CdiMode
from providers.core.errors import InvalidRequest

DEFAULT_EDITS_SPEC_DIR = "/etc/peerpods/cdi"


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
