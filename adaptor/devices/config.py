"""What the CDI settings of `peerpods serve` configure, validated at start."""

from __future__ import annotations

import os
from dataclasses import dataclass

from adaptor.cdi import Registry
from adaptor.devices.naming import CdiNaming, naming_from_flags
from adaptor.devices.rewrite import CdiMode
from adaptor.settings import CdiSettings
from providers.core.errors import InvalidRequest
from providers.core.settings import csv


@dataclass(frozen=True)
class CdiConfig:
    """What the CDI settings configure: the mode, edits-mode registry and the device naming."""

    mode: CdiMode
    naming: CdiNaming
    registry: Registry | None


def cdi_config(settings: CdiSettings) -> CdiConfig:
    """Check the CDI settings; edits mode loads its specs now so a bad spec fails at start."""
    naming = naming_from_flags(settings.cdi_gpu_name, settings.cdi_mig_name, settings.cdi_rdma_name)
    registry = None
    if settings.cdi_mode == "edits":
        dirs = list(csv(settings.cdi_spec_dir))
        if not dirs:
            raise InvalidRequest("--cdi-spec-dir: edits mode needs at least one directory")
        missing = [d for d in dirs if not os.path.isdir(d)]
        if missing:
            raise InvalidRequest(f"--cdi-spec-dir: {missing[0]}: no such directory")
        registry = Registry(dirs)
        if registry.errors:
            errors = next(iter(registry.errors.values()))
            raise InvalidRequest(f"--cdi-spec-dir: {errors[0]}")
    return CdiConfig(settings.cdi_mode, naming, registry)
