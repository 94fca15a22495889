"""`peerpods plan --dra-driver POD.yaml`: offline, which devices the scheduler would allocate
the pod from the pools of gpu.peerpods.io, and the VM that follows.

The pools are the manifest's ResourceSlices of the driver, else the ones `peerpods dra publish`
would publish from the catalog (with `--gpu-limit`); the DeviceClasses are the manifest's, else
config/deploy/dra's. The pod's claims are its `spec.resourceClaims` (a ResourceClaim or a
ResourceClaimTemplate of the manifest) and, for `nvidia.com/gpu`, the claim the scheduler makes
from the class whose `extendedResourceName` it is (one request per container). They are
allocated first fit (webhook._allocate, what it models and what it refuses), the webhook in the
DRA-driver mode sizes the VM's vCPUs and memory, and the allocated devices its GPUs (what the
adaptor does at CreateVM).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TextIO

from pydantic import Field

from providers.core.settings import Flag, Names, Section

__all__ = ["DraPlanSettings", "plan_dra", "run"]

Document = dict[str, Any]


class DraPlanSettings(Section):
    """`peerpods plan --dra-driver`: the pod as the DRA-driver mode serves it."""

    dra_driver: Annotated[bool, Flag("--dra-driver")] = Field(
        False,
        description="plan the pod as the DRA-driver mode serves it: the devices the scheduler "
        "would allocate from the pools of gpu.peerpods.io, then the VM (docs/dra.md)",
    )
    dra_gpu_limit: Annotated[Names, Flag("--dra-gpu-limit", metavar="MODEL=N[,...]")] = Field(
        (),
        description="with --dra-driver and no ResourceSlices in the manifest: the pools' "
        "devices per GPU model, as `peerpods dra publish --gpu-limit`",
    )


@dataclass
class DraPlan:
    """The allocation and the VM."""

    pod: str
    allocated: list[dict[str, Any]] = field(default_factory=list)
    vcpus: int = 0
    memory_mib: int = 0
    gpus: int = 0
    gpu_models: tuple[str, ...] = ()
    selected: str | None = None
    candidates: list[str] = field(default_factory=list)
    failure: str = ""


def _kind(documents: Sequence[Document], kind: str) -> list[Document]:
    return [d for d in documents if d.get("kind") == kind]


def _named(documents: Sequence[Document], kind: str, name: str) -> Document:
    from webhook import AllocationFailed

    for doc in _kind(documents, kind):
        if (doc.get("metadata") or {}).get("name") == name:
            return doc
    raise AllocationFailed(f"{kind} {name!r} is not in the manifest")


def pod_claims(
    pod: Document, documents: Sequence[Document], classes: Mapping[str, Document]
) -> list[tuple[str, Document]]:
    """(claim name, claim spec) of each claim the pod's GPUs come from, in the pod's order."""
    claims: list[tuple[str, Document]] = []
    for entry in pod["spec"].get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            doc = _named(documents, "ResourceClaim", entry["resourceClaimName"])
            claims.append((entry["name"], doc.get("spec") or {}))
        elif entry.get("resourceClaimTemplateName"):
            doc = _named(documents, "ResourceClaimTemplate", entry["resourceClaimTemplateName"])
            claims.append((entry["name"], (doc.get("spec") or {}).get("spec") or {}))
    extended = _extended_claim(pod, classes)
    if extended is not None:
        claims.append(("extended-resources", extended))
    return claims


def _extended_claim(pod: Document, classes: Mapping[str, Document]) -> Document | None:
    """The claim the scheduler makes for the pod's nvidia.com/gpu (FACTS-DRA: one request per
    container, `container-<i>-request-<j>`), None when it asks for none."""
    by_resource = {
        str(c["spec"]["extendedResourceName"]): name
        for name, c in classes.items()
        if (c.get("spec") or {}).get("extendedResourceName")
    }
    requests: list[Document] = []
    spec = pod["spec"]
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    for index, container in enumerate(containers):
        resources = container.get("resources") or {}
        merged = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for j, resource in enumerate(sorted(r for r in merged if r in by_resource)):
            requests.append(
                {
                    "name": f"container-{index}-request-{j}",
                    "exactly": {
                        "deviceClassName": by_resource[resource],
                        "count": int(str(merged[resource])),
                    },
                }
            )
    return {"devices": {"requests": requests}} if requests else None


def plan_dra(
    documents: Sequence[Document], pod: Document, catalog: Any, limits: Sequence[str]
) -> DraPlan:
    """The allocation and the VM for `pod` (see the module doc); a failure is recorded."""
    from providers.core.capacity import CapacityType
    from providers.core.contract import request_for
    from providers.core.errors import PeerpodsError
    from providers.core.selection import select
    from providers.dra import build_pool, parse_gpu_limits
    from providers.dra.allocation import device_facts, gpu_intent
    from providers.dra.classes import device_classes
    from providers.dra.slices import DRIVER
    from webhook import Allocator, Settings, mutate_pod

    name = str((pod.get("metadata") or {}).get("name", ""))
    report = DraPlan(pod=name)
    slices = [s for s in _kind(documents, "ResourceSlice") if s["spec"].get("driver") == DRIVER]
    if not slices:
        slices = build_pool(catalog, parse_gpu_limits(limits)).slices(1)
    classes = {d["metadata"]["name"]: d for d in _kind(documents, "DeviceClass")}
    classes = classes or device_classes()
    try:
        mutated = mutate_pod(pod, settings=Settings(dra_driver=True))
        intent = mutated.intent
        report.vcpus = intent.vcpus if intent else 0
        report.memory_mib = intent.memory_mib if intent else 0
        allocator = Allocator(slices, classes)
        devices = []
        for claim_name, spec in pod_claims(pod, documents, classes):
            for result in allocator.allocate_claim(claim_name, spec):
                facts = device_facts(
                    slices, result.pool, result.device, result.request, result.consumed
                )
                if facts is None:
                    continue
                devices.append(facts)
                report.allocated.append(
                    {
                        "claim": claim_name,
                        "request": result.request,
                        "pool": result.pool,
                        "device": result.device,
                        "model": facts.model,
                        "productName": facts.product,
                        "memory_mib": facts.consumed_mib or facts.memory_mib,
                        "shared": facts.shared,
                    }
                )
        gpu = gpu_intent(devices)
        report.gpus, report.gpu_models = gpu.gpus, gpu.models
        request = request_for(report.vcpus, report.memory_mib, gpu, "", CapacityType.ON_DEMAND)
        selection = select(catalog, request)
        report.selected = selection.selected.name
        report.candidates = [c.name for c in selection.candidates]
    except PeerpodsError as exc:
        report.failure = str(exc)
    return report


def print_plan(report: DraPlan, out: TextIO, output: str) -> None:
    if output == "json":
        json.dump(report.__dict__, out, indent=2, default=list)
        out.write("\n")
        return
    out.write(f"pod {report.pod} (DRA-driver mode)\n")
    out.write("allocated devices:\n")
    for a in report.allocated or []:
        share = f", a share of {a['memory_mib']} MiB" if a["shared"] else ""
        out.write(
            f"  {a['claim']}/{a['request']}: {a['pool']}/{a['device']} "
            f"({a['productName']}, {a['model']}{share})\n"
        )
    if not report.allocated:
        out.write("  none\n")
    if report.failure:
        return
    models = ",".join(report.gpu_models) or "none"
    out.write(f"VM: {report.vcpus} vCPUs, {report.memory_mib} MiB, {report.gpus} GPUs ({models})\n")
    out.write(f"instance type: {report.selected}\n")


def run(args: argparse.Namespace, manifest: str, catalog: Any) -> int:
    """Plan, print, exit code: 0 the pod would run, 1 it would not."""
    from adaptor.cli import flags
    from adaptor.cli.pod_plan import find_pod, load_documents

    settings = flags.section(DraPlanSettings, args)
    documents = load_documents(manifest, str(Path(args.manifest)))
    pod = find_pod(documents, args.pod)
    report = plan_dra(documents, pod, catalog, settings.dra_gpu_limit)
    print_plan(report, sys.stdout, args.output)
    if report.failure:
        print(f"peerpods plan: {report.failure}", file=sys.stderr)
        return 1
    return 0
