"""The whole decision for a pod manifest, without a cluster: what `peerpods plan` prints.

The steps are the ones a real pod goes through, in order, calling the same code:

1. admission: the webhook's `mutate_pod`, with claims, claim templates and DeviceClasses read
   from the same manifest (`MemoryResolver`) and DRA selectors evaluated against the catalog;
2. CreateVM: the mutated pod's annotations read back with `parse_vm_annotations`, exactly as the
   adaptor reads them, and turned into a selection request (so the plan proves the contract
   round-trips);
3. StartVM's plan: the same `Placement` object `serve` plans with (selection under the allow
   list, zones, candidate cap and GPU quota), with every type ranked or rejected and why;
4. devices: the device plan for the first candidate (`plan_devices`): MIG layout and the CDI
   devices each container gets, from the per-container plan the webhook wrote.

A step that fails ends the plan there with a `Failure` naming the step; the report up to it is
kept. A manifest that is not one (not YAML, no pod, objects of the wrong shape) raises
InvalidRequest instead: there is nothing to plan.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from adaptor.devices import CdiNaming, DevicePlan, MigDevice, plan_devices
from adaptor.planning.placement import Placement, Plan
from providers.core.catalog import Catalog
from providers.core.contract import (
    DEFAULT_VCPUS,
    DEVICES,
    GPU_QUOTA_RESOURCE,
    MIG_QUOTA_RESOURCE,
    SANDBOX_NAME,
    SANDBOX_NAMESPACE,
    SEAL,
    ContainerPlan,
    VMIntent,
    parse_vm_annotations,
)
from providers.core.errors import InvalidRequest, NoMatch, PeerpodsError
from providers.core.selection import Selection
from providers.core.snapshots import DEFAULT_REGIONS, load_catalog, parse_cloud

if TYPE_CHECKING:
    from webhook import CapacityPolicy

__all__ = [
    "ContainerDevices",
    "Failure",
    "PlanReport",
    "Stage",
    "find_pod",
    "load_documents",
    "plan_manifest",
]

Stage = Literal["admission", "selection", "devices"]
Document = dict[str, Any]

# Workload kinds whose pod template is planned when the file holds no bare Pod.
_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


@dataclass(frozen=True)
class Failure:
    """Why the plan stops: the step, an HTTP-like code (as the webhook answers) and a message."""

    stage: Stage
    code: int
    message: str


@dataclass(frozen=True)
class ContainerDevices:
    """The CDI devices one container gets in the pod VM."""

    name: str
    init: bool
    cdi: tuple[str, ...]


@dataclass(frozen=True)
class PlanReport:
    """Everything `peerpods plan` shows; `failure` is None when the pod would run."""

    pod_name: str
    namespace: str
    catalog: Catalog
    peer_pod: bool = True
    failure: Failure | None = None
    warnings: tuple[str, ...] = ()
    patch: tuple[dict[str, Any], ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    intent: VMIntent | None = None
    container_plan: ContainerPlan | None = None
    selection: Selection | None = None
    plan: Plan | None = None
    devices: DevicePlan | None = None
    containers: tuple[ContainerDevices, ...] = ()
    notes: tuple[str, ...] = ()  # why the webhook rewrote the pod as it did

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def chosen(self) -> str | None:
        """The instance type StartVM would try first (None when the plan stopped before)."""
        return self.plan.candidates[0].instance_type if self.plan and self.plan.candidates else None

    @property
    def mig_layout(self) -> tuple[MigDevice, ...]:
        return self.devices.mig if self.devices is not None else ()


# `plan` is a preview, run offline: its seal is under a fixed key so the same pod plans to the same
# output everywhere. The real webhook seals under a key derived from its TLS key, so a preview
# seal is never recognised by it.
PREVIEW_SEAL_KEY = b"peerpods plan preview"


def load_documents(text: str, source: str = "manifest") -> list[Document]:
    """Every object of a (multi-document) YAML text; InvalidRequest for anything else."""
    import yaml

    try:
        raw = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise InvalidRequest(f"{source}: not valid YAML{where}: {problem}") from None
    documents: list[Document] = []
    for index, doc in enumerate(raw):
        items = doc.get("items") if isinstance(doc, dict) and doc.get("kind") == "List" else [doc]
        if not isinstance(items, list):
            raise InvalidRequest(f"{source}: document {index + 1}: List.items is not a list")
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("kind"), str):
                raise InvalidRequest(
                    f"{source}: document {index + 1} is not a Kubernetes object (no kind)"
                )
            documents.append(item)
    if not documents:
        raise InvalidRequest(f"{source}: no Kubernetes objects in it")
    return documents


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, dict) else ""


def _template_pod(obj: Document) -> Document | None:
    path = _TEMPLATE_PATHS.get(str(obj.get("kind")))
    if path is None:
        return None
    node: Any = obj
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        raise InvalidRequest(f"{obj['kind']} {_name(obj)}: no pod template at {'.'.join(path)}")
    pod = copy.deepcopy(node)
    meta = pod.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise InvalidRequest(f"{obj['kind']} {_name(obj)}: pod template metadata is not a map")
    meta.setdefault("name", _name(obj))
    outer = obj.get("metadata")
    if isinstance(outer, dict) and outer.get("namespace"):
        meta.setdefault("namespace", outer["namespace"])
    return {"apiVersion": "v1", "kind": "Pod", **pod}


def find_pod(documents: Sequence[Document], name: str = "") -> Document:
    """The one pod to plan: a Pod, else a workload's pod template; `name` picks among several."""
    pods = [d for d in documents if d.get("kind") == "Pod"]
    if not pods:
        pods = [p for p in (_template_pod(d) for d in documents) if p is not None]
    if name:
        pods = [p for p in pods if _name(p) == name]
        if not pods:
            raise InvalidRequest(f"no pod named {name!r} in the manifest")
    if not pods:
        kinds = ", ".join(sorted({str(d.get("kind")) for d in documents}))
        raise InvalidRequest(f"no Pod (or workload with a pod template) in the manifest: {kinds}")
    if len(pods) > 1:
        names = ", ".join(_name(p) or "(unnamed)" for p in pods)
        raise InvalidRequest(f"{len(pods)} pods in the manifest ({names}): pick one with --pod")
    pod = pods[0]
    if not isinstance(pod.get("spec"), dict):
        raise InvalidRequest(f"pod {_name(pod) or '(unnamed)'}: spec is missing or not a map")
    if not isinstance(pod.get("metadata", {}), dict):
        raise InvalidRequest(f"pod {_name(pod) or '(unnamed)'}: metadata is not a map")
    return pod


def _containers(pod: Mapping[str, Any]) -> list[tuple[str, bool]]:
    spec = pod.get("spec") or {}
    out: list[tuple[str, bool]] = []
    for key, init in (("initContainers", True), ("containers", False)):
        items = spec.get(key) or []
        if isinstance(items, list):
            out += [(str(c.get("name", "")), init) for c in items if isinstance(c, dict)]
    return out


def _run_to_end(step: Coroutine[Any, Any, Plan]) -> Plan:
    """Run StartVM's (async) planning step from this synchronous preview; inside a running loop
    (the CLI called from async code) on a loop of its own in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(step)
    with ThreadPoolExecutor(1, thread_name_prefix="plan") as pool:
        return pool.submit(asyncio.run, step).result()


def _admission_code(exc: PeerpodsError) -> int:
    """The HTTP code the webhook answers this denial with (its own table)."""
    from webhook import ANSWER_OF_FAULT

    return ANSWER_OF_FAULT[exc.fault][0]


def plan_manifest(
    documents: Iterable[Document],
    provider: str = "aws",
    region: str = "",
    *,
    catalog: Catalog | None = None,
    catalog_dir: Path | None = None,
    pod_name: str = "",
    allowed_machine_types: Iterable[str] = (),
    naming: CdiNaming | None = None,
    capacity: CapacityPolicy | None = None,
    placement: Placement | None = None,
) -> PlanReport:
    """Plan the manifest's pod on a cloud's catalog (bundled snapshot unless `catalog` is given).

    `placement` is StartVM's own (`adaptor.planning.placement.Placement`: allow list, zones,
    candidate cap, GPU quota, and its catalog); without one, the catalog with
    `allowed_machine_types`. Raises InvalidRequest/CatalogError when there is nothing to plan (no
    pod, unknown region); a pod the webhook denies, no instance type, or devices that do not fit
    the VM are a report with `failure` set.
    """
    documents = list(documents)
    if catalog is None and placement is not None:
        catalog = placement.catalog
    if catalog is None:
        cloud = parse_cloud(provider)
        catalog = load_catalog(cloud, region or DEFAULT_REGIONS[cloud], catalog_dir=catalog_dir)
    if placement is None:
        placement = Placement(catalog=catalog, allowed=tuple(allowed_machine_types))
    placement = replace(placement, catalog=catalog, naming=naming or placement.naming)
    pod = find_pod(documents, pod_name)
    report, mutated = _admit(pod, documents, catalog, allowed_machine_types, capacity)
    if mutated is None or report.failure is not None:
        return report
    report = _read_contract(report)
    if report.failure is not None or report.intent is None:
        return report
    report = _plan_start(report, placement)
    if report.failure is not None:
        return report
    return _plan_devices(report, placement, mutated)


def _admit(
    pod: Document,
    documents: Sequence[Document],
    catalog: Catalog,
    allowed_machine_types: Iterable[str],
    capacity: CapacityPolicy | None,
) -> tuple[PlanReport, Document | None]:
    """Admission: the webhook's own mutation of the pod (None: denied, or not a peer pod)."""
    from webhook import MemoryResolver, Settings, mutate_pod

    meta = pod.get("metadata") or {}
    name = _name(pod) or str(meta.get("generateName") or "")
    namespace = str(meta.get("namespace") or "default")
    base = PlanReport(pod_name=name, namespace=namespace, catalog=catalog)
    settings = Settings(
        allowed_machine_types=frozenset(allowed_machine_types), seal_key=PREVIEW_SEAL_KEY
    )
    if capacity is not None:
        settings = replace(settings, capacity=capacity)
    try:
        result = mutate_pod(
            pod,
            resolver=MemoryResolver(documents),
            catalog=catalog,
            settings=settings,
            namespace=namespace,
        )
    except PeerpodsError as exc:
        return replace(base, failure=Failure("admission", _admission_code(exc), str(exc))), None
    annotations = dict((result.pod.get("metadata") or {}).get("annotations") or {})
    report = replace(
        base, warnings=tuple(result.warnings), patch=tuple(result.patch), annotations=annotations
    )
    if result.intent is None:
        return replace(report, peer_pod=False), None
    return replace(report, notes=rewrite_notes(pod, report.patch, annotations)), result.pod


def rewrite_notes(
    pod: Document, patch: Sequence[Mapping[str, Any]], annotations: Mapping[str, str]
) -> tuple[str, ...]:
    """Why the webhook's patch does what it does to this pod, one line per kind of change."""
    from webhook import pod_resources

    removed = [str(op["path"]) for op in patch if op.get("op") == "remove"]
    added = {str(op["path"]).replace("~1", "/") for op in patch if op.get("op") == "add"}
    notes = []
    if any("/resources" in path for path in removed):
        notes.append(
            "limits and requests removed from the containers: they run in the pod VM, so their "
            "cpu and memory must not count against the worker node and no limit may reach the "
            "VM's cgroups (the pod is BestEffort on its node); the annotations size the VM, and "
            "GPUs, MIG slices and RDMA reach each container as CDI devices"
        )
    try:
        need = pod_resources(copy.deepcopy(pod))
    except PeerpodsError:
        need = None
    vcpus = annotations.get(DEFAULT_VCPUS, "")
    if need is not None and vcpus.isdigit() and need.cpu != int(vcpus):
        notes.append(
            f"CPU {need.cpu.normalize():f} (the pod's total by Kubernetes' rules, limits over "
            f"requests) rounded up to {vcpus} vCPUs: a VM has whole vCPUs"
        )
    if SEAL in annotations:
        notes.append(
            f"{SEAL}: a MAC over the contract keys, the namespace and what the pod asks for, "
            "so the adaptor takes only annotations this webhook wrote (plan seals with a "
            "preview key, a cluster with its own Secret)"
        )
    if any(path.endswith((GPU_QUOTA_RESOURCE, MIG_QUOTA_RESOURCE)) for path in added):
        notes.append(
            f"namespace GPU quotas: a requests.nvidia.com/gpu quota does not see this pod (its "
            f"nvidia.com/gpu is removed); a quota on requests.{GPU_QUOTA_RESOURCE} or "
            f"requests.{MIG_QUOTA_RESOURCE} does (docs/webhook.md); in the DRA-driver mode "
            "(docs/dra.md) the pod keeps its nvidia.com/gpu request, served through DRA, and "
            "such a quota binds it natively"
        )
    return tuple(notes)


def _read_contract(report: PlanReport) -> PlanReport:
    """CreateVM: what the adaptor reads from the annotations Kata forwards."""
    try:
        sandbox = {SANDBOX_NAME: report.pod_name or "pod", SANDBOX_NAMESPACE: report.namespace}
        intent = parse_vm_annotations({**report.annotations, **sandbox})
        encoded = report.annotations.get(DEVICES)
        container_plan = ContainerPlan.decode(encoded) if encoded else None
    except PeerpodsError as exc:
        return replace(report, failure=Failure("selection", 400, f"annotations: {exc}"))
    return replace(report, intent=intent, container_plan=container_plan)


def _plan_start(report: PlanReport, placement: Placement) -> PlanReport:
    """StartVM: the very Placement `serve` plans with (allow list, zones, candidate cap, quota)."""
    intent = report.intent
    assert intent is not None
    report = replace(report, selection=placement.explain(intent))
    sandbox = report.pod_name or "pod"
    where = f"{report.catalog.cloud} {report.catalog.region}"
    try:
        plan = _run_to_end(placement.plan(intent, sandbox))
        if not plan.candidates:
            raise NoMatch("no candidate is left")
    except NoMatch as exc:
        message = f"no instance type in the {where} catalog can serve this pod: {exc}"
        return replace(report, failure=Failure("selection", 403, message))
    finally:
        placement.release(sandbox)
    return replace(report, plan=plan)


def _plan_devices(report: PlanReport, placement: Placement, pod: Document) -> PlanReport:
    """The device plan on StartVM's first candidate, and the CDI devices of each container."""
    assert report.intent is not None and report.plan is not None
    chosen = report.plan.candidates[0]
    try:
        devices = plan_devices(
            report.container_plan, report.intent.gpu, chosen.inventory, placement.naming
        )
    except PeerpodsError as exc:
        return replace(report, failure=Failure("devices", 400, f"{chosen.instance_type}: {exc}"))
    per_container = tuple(
        ContainerDevices(cname, init, tuple(devices.for_container(cname)) if cname else ())
        for cname, init in _containers(pod)
    )
    return replace(report, devices=devices, containers=per_container)
