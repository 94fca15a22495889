"""The CreateContainer rewrite: give one container exactly its planned CDI devices.

The request is decoded with the partial agent schema (fields it does not declare survive as
unknown fields) and re-encoded only when something changes. Every `cdi.k8s.io/*` annotation the
request carries is removed: a pod must not obtain devices by writing annotations; so is every
other GPU access (`NVIDIA_VISIBLE_DEVICES` set to `void`, `/dev/nvidia*` devices and their cgroup
rules: `sanitize.py`), from every container, whatever its plan. Then:

- `annotations` mode: `cdi.k8s.io/peerpods_<container>` lists the container's qualified names and
  kata-agent resolves them against the pod VM's CDI specs;
- `edits` mode (agents without CDI): the adaptor applies the devices' edits from its own
  configured specs into the OCI spec; device nodes must be fully specified there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from google.protobuf.message import DecodeError

from adaptor.cdi import ANNOTATION_PREFIX, CdiError, Registry, apply_to_proto
from adaptor.devices.dra import devices_from_env
from adaptor.devices.plan import DevicePlan
from adaptor.devices.sanitize import strip_gpu_access
from adaptor.ttrpc.gen import agent_pb2
from providers.core.contract import (
    CONTAINER_NAME,
    CONTAINER_TYPE,
    DEVICES,
    ContainerPlan,
    cdi_annotation_key,
)
from providers.core.errors import InvalidRequest

CdiMode = Literal["annotations", "edits"]
CDI_MODES: tuple[CdiMode, ...] = ("annotations", "edits")


class RewriteError(InvalidRequest):
    """A CreateContainer request the adaptor refuses (answered with INVALID_ARGUMENT)."""


def decode_request(payload: bytes) -> Any:
    request = agent_pb2.CreateContainerRequest()
    try:
        request.ParseFromString(payload)
    except DecodeError as exc:
        raise RewriteError(f"cannot decode CreateContainerRequest: {exc}") from None
    return request


def effective_plan(plan: DevicePlan | None, annotations: Any) -> DevicePlan | None:
    """The stored plan, assigned per container by the request's device-plan annotation when the
    stored plan has no assignment yet."""
    if plan is None or plan.containers is not None or plan.empty:
        return plan
    raw = annotations.get(DEVICES)
    if not raw:
        return plan
    return plan.with_container_plan(ContainerPlan.decode(raw))


@dataclass(frozen=True)
class Rewritten:
    """A rewritten request, with whom it was for and what it was given."""

    payload: bytes
    container: str  # "" for the sandbox (pause) container
    devices: tuple[str, ...]


def rewrite_create_container(
    payload: bytes,
    plan: DevicePlan | None,
    *,
    mode: CdiMode = "annotations",
    registry: Registry | None = None,
) -> bytes:
    """The rewritten CreateContainerRequest payload (the same bytes when nothing changes)."""
    return rewrite_for_container(payload, plan, mode=mode, registry=registry).payload


def rewrite_for_container(
    payload: bytes,
    plan: DevicePlan | None,
    *,
    mode: CdiMode = "annotations",
    registry: Registry | None = None,
) -> Rewritten:
    """`rewrite_create_container`, also saying which container it was and its devices."""
    if mode not in CDI_MODES:
        raise RewriteError(f"unknown CDI mode {mode!r}")
    if mode == "edits" and registry is None:
        raise RewriteError("edits mode needs a CDI spec registry")
    request = decode_request(payload)
    stripped = strip_gpu_access(request.OCI)
    annotations = request.OCI.Annotations
    foreign = [k for k in annotations if k.startswith(ANNOTATION_PREFIX)]
    devices: list[str] = []
    container = ""
    if annotations.get(CONTAINER_TYPE) != "sandbox":
        container = annotations.get(CONTAINER_NAME, "")
        plan = effective_plan(plan, annotations)
        if plan is not None and not plan.empty:
            name = annotations.get(CONTAINER_NAME, "")
            if not name:
                raise RewriteError(f"CreateContainer for a GPU pod without {CONTAINER_NAME}")
            devices = plan.for_container(name)
            devices += [
                d for d in devices_from_env(plan, request.OCI.Process.Env) if d not in devices
            ]
    if not devices and not foreign and not stripped:
        return Rewritten(payload, container, ())
    for key in foreign:
        del annotations[key]
    if devices and mode == "annotations":
        annotations[cdi_annotation_key(annotations[CONTAINER_NAME])] = ",".join(devices)
    elif devices:
        assert registry is not None
        try:
            apply_to_proto(request.OCI, registry.edits_for(devices))
        except CdiError as exc:
            raise RewriteError(f"CDI edits for {annotations[CONTAINER_NAME]}: {exc}") from None
    return Rewritten(bytes(request.SerializeToString()), container, tuple(devices))
