"""The device layout the adaptor sends a pod VM: what to create and the CDI name of each device.

The adaptor decides every name it will inject into CreateContainer and sends them with the layout,
so the pod VM binds those exact names to the devices it actually created; it needs no naming rule
of its own (an enumeration-order rule is what got MIG names wrong: docs/podvm.md).

Where it travels: as the `peerpods-devices` key of `/run/peerpod/apf.json`, which CAA's pod VM
images provision (their forwarder ignores keys it does not know). Images provisioned by cloud-init
may also carry the older `/run/peerpod/devices.json` (version 1: MIG profiles and start slots, no
names); the names it implies are the ones the adaptor injected then (`nvidia.com/gpu=<gpu>:<rank
by start slot>`), so such images keep working.

A sandbox's candidates may hold different GPU models, so the document lists one layout per model
and the pod VM uses the one whose MIG profiles its GPUs offer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from adaptor.cdi import CdiError, parse_qualified_name
from providers.core.errors import InvalidRequest

APF_PATH = "/run/peerpod/apf.json"
APF_KEY = "peerpods-devices"
LEGACY_PATH = "/run/peerpod/devices.json"
# v1 named nothing; these are the names the adaptor injected for it (CdiNaming's old defaults)
LEGACY_GPU_NAME = "nvidia.com/gpu={index}"
LEGACY_MIG_NAME = "nvidia.com/gpu={gpu}:{mig}"


class LayoutError(InvalidRequest):
    """A device layout that cannot be read (names the file and the problem)."""


def _check_name(name: str) -> str:
    try:
        parse_qualified_name(name)
    except CdiError as exc:
        raise ValueError(f"{name!r} is not a qualified CDI name: {exc}") from None
    return name


class MigSpec(BaseModel):
    """One MIG device: its profile, first memory slot, and the CDI name it will be injected as."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: str = Field(min_length=1)
    start: int = Field(ge=0, le=7)
    name: str

    @model_validator(mode="after")
    def _valid(self) -> MigSpec:
        _check_name(self.name)
        return self


class GpuLayout(BaseModel):
    """One GPU of the VM by NVML index: a whole GPU (`name`) or carrying MIG devices (`mig`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0, le=63)
    name: str = ""
    mig: tuple[MigSpec, ...] = ()

    @model_validator(mode="after")
    def _valid(self) -> GpuLayout:
        if bool(self.name) == bool(self.mig):
            raise ValueError(f"GPU {self.index}: needs either a whole-GPU name or MIG devices")
        if self.name:
            _check_name(self.name)
        starts = [m.start for m in self.mig]
        if len(set(starts)) != len(starts):
            raise ValueError(f"GPU {self.index}: two MIG devices start at the same slot")
        return self


class Layout(BaseModel):
    """Every device of the VM for one GPU model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = ""
    gpus: tuple[GpuLayout, ...] = ()
    rdma: tuple[str, ...] = Field((), description="RDMA device names, index order")

    @model_validator(mode="after")
    def _valid(self) -> Layout:
        indices = [g.index for g in self.gpus]
        if len(set(indices)) != len(indices):
            raise ValueError("a GPU index is listed twice")
        for name in self.rdma:
            _check_name(name)
        names = self.names()
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"device name {dup!r} is used twice")
        return self

    def names(self) -> list[str]:
        """Every CDI name this layout binds."""
        out: list[str] = []
        for gpu in self.gpus:
            out += [gpu.name] if gpu.name else [m.name for m in gpu.mig]
        return out + list(self.rdma)

    def mig_profiles(self) -> set[str]:
        return {m.profile for g in self.gpus for m in g.mig}

    @property
    def empty(self) -> bool:
        return not self.gpus and not self.rdma

    @classmethod
    def from_plan(cls, plan: Any) -> Layout:
        """From an adaptor.devices.DevicePlan: its whole GPUs, MIG devices and RDMA devices
        with the very names CreateContainer will carry."""
        gpus = [GpuLayout(index=i, name=name) for i, name in enumerate(plan.gpus)]
        by_gpu: dict[int, list[MigSpec]] = {}
        for m in plan.mig:
            by_gpu.setdefault(m.gpu, []).append(
                MigSpec(profile=m.profile, start=m.start, name=m.name)
            )
        for index in sorted(by_gpu):
            mig = tuple(sorted(by_gpu[index], key=lambda s: s.start))
            gpus.append(GpuLayout(index=index, mig=mig))
        return cls(model=str(plan.model), gpus=tuple(gpus), rdma=tuple(plan.rdma))


class LayoutDocument(BaseModel):
    """The `peerpods-devices` value: one layout per GPU model the VM may have."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[2] = 2
    layouts: tuple[Layout, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_plans(cls, plans: Iterable[Any]) -> LayoutDocument:
        return cls(layouts=tuple(Layout.from_plan(p) for p in plans))


def parse_document(raw: object, where: str) -> LayoutDocument:
    """A `peerpods-devices` value (v2) or a legacy devices.json document (v1)."""
    if isinstance(raw, Mapping) and raw.get("v") == 1:
        return LayoutDocument(layouts=(legacy_layout(raw, where),))
    try:
        return LayoutDocument.model_validate(raw)
    except ValidationError as exc:
        raise LayoutError(f"{where}: {_first_error(exc)}") from None


def legacy_layout(raw: Mapping[str, Any], where: str) -> Layout:
    """A v1 devices.json: per GPU its MIG slots (an empty list: a whole GPU), no names."""
    groups = raw.get("mig")
    if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
        raise LayoutError(f"{where}: 'mig' must be a list of lists")
    gpus: list[GpuLayout] = []
    try:
        for index, group in enumerate(groups):
            if not group:
                gpus.append(GpuLayout(index=index, name=LEGACY_GPU_NAME.format(index=index)))
                continue
            slots = sorted(group, key=lambda s: int(s["start"]))
            mig = tuple(
                MigSpec(
                    profile=str(s["profile"]),
                    start=int(s["start"]),
                    name=LEGACY_MIG_NAME.format(gpu=index, mig=rank),
                )
                for rank, s in enumerate(slots)
            )
            gpus.append(GpuLayout(index=index, mig=mig))
        return Layout(model=str(raw.get("gpu_model", "")), gpus=tuple(gpus))
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        detail = _first_error(exc) if isinstance(exc, ValidationError) else f"bad slot: {exc}"
        raise LayoutError(f"{where}: {detail}") from None


def _first_error(exc: ValidationError | Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        return f"{loc}: {msg}" if loc else msg
    return str(exc)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json(text: str, where: str) -> Any:
    """Strict JSON: NaN and Infinity (which Python's json accepts) are refused, and nesting too
    deep for the parser is a LayoutError, not a RecursionError."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise LayoutError(f"{where}: not JSON: nested too deeply") from None
    except ValueError as exc:
        raise LayoutError(f"{where}: not JSON: {exc}") from None


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LayoutError(f"{path}: not UTF-8 text") from None
    return load_json(text, str(path))


def read_layouts(apf_path: Path, legacy_path: Path) -> tuple[LayoutDocument, str]:
    """The layouts this VM was sent and where they came from; an empty document when none.

    apf.json's key wins; without it the legacy devices.json (and its per-model siblings
    devices.<model>.json) is read. A file that exists but cannot be read is a LayoutError.
    """
    if apf_path.is_file():
        apf = _read_json(apf_path)
        if not isinstance(apf, dict):
            raise LayoutError(f"{apf_path}: not a JSON object")
        if apf.get(APF_KEY) is not None:
            return parse_document(apf[APF_KEY], f"{apf_path}: {APF_KEY}"), str(apf_path)
    legacy = [legacy_path] if legacy_path.is_file() else []
    stem, suffix = legacy_path.stem, legacy_path.suffix
    legacy += (
        sorted(legacy_path.parent.glob(f"{stem}.*{suffix}")) if legacy_path.parent.is_dir() else []
    )
    layouts: list[Layout] = []
    for path in legacy:
        layouts += parse_document(_read_json(path), str(path)).layouts
    source = ",".join(str(p) for p in legacy)
    return LayoutDocument(layouts=tuple(layouts)), source
