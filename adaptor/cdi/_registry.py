"""A registry of CDI devices loaded from spec directories, and injection into OCI specs.

Directories are given lowest priority first (the conventional order is `/etc/cdi`, then
`/var/run/cdi`, which wins). Only `*.json` and `*.yaml` files directly in a directory are read. A
file that fails to load is skipped and its error kept. A device defined at a higher priority
replaces the lower one; the same qualified name defined twice at one priority is ambiguous, so it
is dropped (as the reference implementation does, even when another priority also defines it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from adaptor.cdi._apply import JsonTarget, StatFn, apply_to, combine, host_stat
from adaptor.cdi._errors import ResolveError, SpecError
from adaptor.cdi._names import parse_qualified_name
from adaptor.cdi._spec import ContainerEdits, Device, Spec, load_spec

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")


@dataclass(frozen=True)
class Resolved:
    """A device found in the registry, with the spec that defines it."""

    qualified_name: str
    spec: Spec
    device: Device


class Registry:
    """Devices from a set of spec dirs; `refresh()` re-reads them (no watching)."""

    def __init__(self, spec_dirs: Sequence[str] = DEFAULT_SPEC_DIRS) -> None:
        self.spec_dirs = tuple(os.path.normpath(d) for d in spec_dirs)
        self.specs: list[Spec] = []
        self.devices: dict[str, Resolved] = {}
        self.errors: dict[str, list[str]] = {}
        self.refresh()

    def refresh(self) -> None:
        specs: list[Spec] = []
        self.errors = {}
        for priority, directory in enumerate(self.spec_dirs):
            try:
                names = sorted(os.listdir(directory))
            except FileNotFoundError:
                continue
            except OSError as exc:
                self.errors.setdefault(directory, []).append(str(exc.strerror or exc))
                continue
            for name in names:
                path = os.path.join(directory, name)
                if not name.endswith((".json", ".yaml")) or os.path.isdir(path):
                    continue
                try:
                    specs.append(load_spec(path, priority))
                except SpecError as exc:
                    self.errors.setdefault(path, []).append(str(exc))
        self._index(specs)

    def _index(self, specs: list[Spec]) -> None:
        devices: dict[str, Resolved] = {}
        conflicts: set[str] = set()
        for spec in specs:
            for device in spec.devices:
                name = f"{spec.kind}={device.name}"
                old = devices.get(name)
                if old is not None:
                    if spec.priority < old.spec.priority:
                        continue
                    if spec.priority == old.spec.priority:
                        message = f"conflicting device {name!r} ({spec.path}, {old.spec.path})"
                        for path in (spec.path, old.spec.path):
                            self.errors.setdefault(path, []).append(message)
                        conflicts.add(name)
                        continue
                devices[name] = Resolved(name, spec, device)
        for name in conflicts:
            devices.pop(name, None)
        self.specs = specs
        self.devices = dict(sorted(devices.items()))

    def list_devices(self) -> list[str]:
        return list(self.devices)

    def resolve(self, names: Iterable[str]) -> list[Resolved]:
        """Look every name up; raises ResolveError naming all that are missing."""
        found: list[Resolved] = []
        missing: list[str] = []
        for name in names:
            parse_qualified_name(name)
            hit = self.devices.get(name)
            if hit is None:
                missing.append(name)
            else:
                found.append(hit)
        if missing:
            raise ResolveError(missing)
        return found

    def edits_for(self, names: Iterable[str]) -> ContainerEdits:
        """Spec-level edits once per spec, then each device's, in request order."""
        parts: list[ContainerEdits] = []
        seen: set[int] = set()
        for hit in self.resolve(names):
            if id(hit.spec) not in seen:
                seen.add(id(hit.spec))
                parts.append(hit.spec.edits)
            parts.append(hit.device.edits)
        return combine(parts)

    def inject(
        self, oci: dict[str, Any], names: Iterable[str], stat: StatFn | None = host_stat
    ) -> dict[str, Any]:
        """Apply the named devices to OCI runtime-spec JSON in place (and return it)."""
        apply_to(JsonTarget(oci), self.edits_for(names), stat)
        return oci
