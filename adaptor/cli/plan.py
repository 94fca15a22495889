"""`peerpods plan POD.yaml`: the whole decision for a pod manifest, without a cluster.

Prints the webhook's mutation, the ranked instance types, the MIG layout, each container's CDI
devices and the annotations (`adaptor.cli.pod_plan` makes the report; this module only prints it).
Exit codes: 0 the pod would run, 1 it would not (denied, no instance type, devices that do not
fit: one line on stderr says why), 2 bad input (not YAML, no pod, bad flags).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from adaptor.cli import flags
from adaptor.cli.table import aligned

if TYPE_CHECKING:
    from adaptor.cli.pod_plan import PlanReport
    from providers.core.contract import VMIntent

_MAX_MANIFEST_BYTES = 4 << 20


def configure(parser: argparse.ArgumentParser) -> None:
    """Add this subcommand's flags (from `PlanSettings` and the adaptor's `CdiNames`)."""
    from adaptor.cli.settings import PlanSettings
    from adaptor.settings import CdiNames

    parser.add_argument("manifest", metavar="POD.yaml", help="pod manifest ('-' for stdin)")
    from adaptor.cli.dra_plan import DraPlanSettings

    flags.add_settings(parser, PlanSettings, CdiNames, DraPlanSettings)


def _read(path: str) -> str:
    from providers.core.errors import InvalidRequest

    if path == "-":
        data = sys.stdin.buffer.read(_MAX_MANIFEST_BYTES + 1)
    else:
        file = Path(path)
        if file.is_dir():
            raise InvalidRequest(f"{path}: is a directory, not a manifest")
        try:
            with file.open("rb") as stream:
                data = stream.read(_MAX_MANIFEST_BYTES + 1)
        except OSError as exc:  # missing or unreadable: a bad argument, exit code 2
            raise InvalidRequest(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > _MAX_MANIFEST_BYTES:
        raise InvalidRequest(f"{path}: larger than {_MAX_MANIFEST_BYTES >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(f"{path}: not UTF-8 text") from None


def warm_vm(report: PlanReport, pools: Sequence[str]) -> tuple[str, str] | None:
    """Whether StartVM would adopt a warm VM from one of `pools` (serve's --warm-pool):
    ("yes", the pool) or ("no", why); None without pools or a plan."""
    from adaptor.settings import parse_pool
    from adaptor.warmpool import Pool, match

    if not pools or report.plan is None:
        return None
    parsed = [Pool(name, size, zone) for name, size, zone in map(parse_pool, pools)]
    found = match([p for p in parsed if p.size > 0], report.plan.vm_spec(), "")
    return ("yes", found.pool.key) if found.pool is not None else ("no", found.reason)


def report_json(report: PlanReport, pools: Sequence[str] = ()) -> dict[str, Any]:
    """The report as JSON (the shape `--output json` prints)."""
    from adaptor.cli.select import selection_json

    warm = warm_vm(report, pools)

    catalog = report.catalog
    intent = report.intent
    devices = report.devices
    failure = report.failure
    return {
        "pod": {"name": report.pod_name, "namespace": report.namespace},
        "provider": catalog.cloud,
        "region": catalog.region,
        "source": catalog.source,
        "peer_pod": report.peer_pod,
        "ok": report.ok,
        "failure": None
        if failure is None
        else {"stage": failure.stage, "code": failure.code, "message": failure.message},
        "warnings": list(report.warnings),
        "notes": list(report.notes),
        "annotations": report.annotations,
        "patch": list(report.patch),
        "intent": None
        if intent is None
        else {
            "vcpus": intent.vcpus,
            "memory_mib": intent.memory_mib,
            "machine_type": intent.machine_type,
            "gpu": intent.gpu.model_dump(mode="json"),
            "capacity_type": intent.capacity_type.value,
        },
        "container_plan": None
        if report.container_plan is None
        else report.container_plan.model_dump(mode="json"),
        "selected": _selected(report),
        "price": _price_used(report),
        "selection": None
        if report.selection is None or report.selection.count == 0
        else selection_json(catalog, report.selection),
        "mig_layout": [m.model_dump(mode="json") for m in report.mig_layout],
        "devices": None
        if devices is None
        else {
            "model": devices.model,
            "gpus": list(devices.gpus),
            "mig": [m.name for m in devices.mig],
            "rdma": list(devices.rdma),
        },
        "containers": [
            {"name": c.name, "init": c.init, "cdi": list(c.cdi)} for c in report.containers
        ],
        "warm_vm": None
        if warm is None
        else {"adopted": warm[0] == "yes", "pool" if warm[0] == "yes" else "reason": warm[1]},
    }


def _selected(report: PlanReport) -> str | None:
    return report.chosen


def _price_used(report: PlanReport) -> dict[str, Any] | None:
    """The price the selected type was ranked by: which market's, and whether it is a ceiling
    or an estimate (no list price known)."""
    selection = report.selection
    chosen = report.chosen
    if selection is None or chosen is None:
        return None
    best = next(c for c in selection.iter_candidates() if c.name == chosen)
    return {
        "market": "spot" if selection.request.provisioning == "spot" else "on-demand",
        "per_hour": best.price_per_hour,
        "estimated": best.price_estimated,
    }


def _rows(rows: Sequence[tuple[str, ...]], out: TextIO, indent: str = "  ") -> None:
    for line in aligned(rows, indent):
        print(line, file=out)


def print_report(report: PlanReport, limit: int, out: TextIO, pools: Sequence[str] = ()) -> None:
    """The report as a human reads it: one section per step."""
    catalog = report.catalog
    source = f", {catalog.source}" if catalog.source else ""
    print(f"pod {report.namespace}/{report.pod_name}  ({catalog.cloud} {catalog.region}{source})",
          file=out)  # fmt: skip
    if not report.peer_pod:
        print("not a peer pod (runtimeClassName is not kata-remote): admitted untouched", file=out)
        return
    for warning in report.warnings:
        print(f"warning: {warning}", file=out)
    if report.failure is not None and report.failure.stage == "admission":
        return
    _print_admission(report, out)
    if report.intent is not None:
        print("\nrequest (as CreateVM reads it): " + _describe_request(report.intent), file=out)
    _print_instance_types(report, limit, out)
    if report.plan is not None:
        for name, reason in report.plan.ranked_away:
            print(f"tried last: {name}: {reason}", file=out)
    warm = warm_vm(report, pools)
    if warm is not None:
        said = f"yes (pool {warm[1]})" if warm[0] == "yes" else f"no: {warm[1]}"
        print(f"warm VM: {said}", file=out)
    _print_devices(report, out)


def _print_admission(report: PlanReport, out: TextIO) -> None:
    """The webhook's patch and the annotations it leaves on the pod."""
    print("\nadmission (webhook mutation):", file=out)
    changes = [(op["op"], op["path"]) for op in report.patch]
    for op, path in changes or [("none", "(already mutated)")]:
        print(f"  {op:<7} {path}", file=out)
    if report.notes:
        print("\nwhy:", file=out)
        for note in report.notes:
            print(f"  - {note}", file=out)
    print("\nannotations:", file=out)
    for key, value in sorted(report.annotations.items()):
        print(f"  {key}: {value}", file=out)


def _describe_request(intent: VMIntent) -> str:
    """The request CreateVM reads, in one line: only the parts the pod asks for."""
    gpu = intent.gpu
    parts = [f"{intent.vcpus} vCPUs", f"{intent.memory_mib} MiB"]
    if gpu.gpus:
        parts.append(f"{gpu.gpus} GPU(s)")
    if gpu.models:
        parts.append("model " + "|".join(gpu.models))
    if gpu.products:
        parts.append("form " + "|".join(gpu.products))
    if gpu.memory_mib:
        parts.append(f">= {gpu.memory_mib} MiB per GPU")
    if gpu.mig:
        parts.append("MIG " + ", ".join(f"{n} x {p}" for p, n in sorted(gpu.mig.items())))
    if gpu.fractional:
        parts.append("a fraction of a GPU may serve")
    if gpu.rdma:
        parts.append("RDMA")
    parts.append(f"capacity {intent.capacity_type}")
    return ", ".join(parts)


def _print_instance_types(report: PlanReport, limit: int, out: TextIO) -> None:
    """The ranked table, then which market's price chose the first and what follows it."""
    from adaptor.cli.select import print_table

    selection = report.selection
    if selection is None or not selection.count:
        return
    print("\ninstance types:", file=out)
    print_table(report.catalog, selection, limit, out)
    price = _price_used(report)
    intent = report.intent
    if price is None or intent is None or price["per_hour"] is None:
        return
    mark = "~" if price["estimated"] else ""
    then = (
        ", then the same types on-demand after Spot capacity errors everywhere"
        if intent.capacity_type.value == "spot-or-on-demand"
        else ""
    )
    print(
        f"capacity: {intent.capacity_type}; ranked by {price['market']} price, "
        f"{report.chosen} at {mark}${price['per_hour']:.4g}/h{then}",
        file=out,
    )


def _print_devices(report: PlanReport, out: TextIO) -> None:
    """The MIG layout (when there is one) and each container's CDI devices."""
    devices = report.devices
    if devices is None:
        return
    if devices.mig:
        print("\nMIG layout:", file=out)
        rows: list[tuple[str, ...]] = [("GPU", "START", "PROFILE", "CDI")]
        rows += [(str(m.gpu), str(m.start), m.profile, m.name) for m in devices.mig]
        _rows(rows, out)
    print("\nCDI devices per container:", file=out)
    rows = [("CONTAINER", "DEVICES")]
    for c in report.containers:
        label = f"{c.name} (init)" if c.init else c.name
        rows.append((label, ", ".join(c.cdi) or "-"))
    _rows(rows, out)


def _dra(args: argparse.Namespace) -> int:
    """The DRA-driver mode's plan (adaptor.cli.dra_plan)."""
    from adaptor.cli import dra_plan
    from providers.core.snapshots import DEFAULT_REGIONS, load_catalog

    region = args.region.strip() or DEFAULT_REGIONS[args.provider]
    directory = Path(args.catalog_dir) if args.catalog_dir else None
    catalog = load_catalog(args.provider, region, catalog_dir=directory)
    return dra_plan.run(args, _read(args.manifest), catalog)


def run(args: argparse.Namespace) -> int:
    from adaptor.cli.pod_plan import load_documents, plan_manifest
    from adaptor.devices import naming_from_flags
    from providers.core.errors import InvalidRequest

    if args.limit < 1:
        raise InvalidRequest(f"--limit must be at least 1, got {args.limit}")
    naming = naming_from_flags(args.cdi_gpu_name, args.cdi_mig_name, args.cdi_rdma_name)
    if args.dra_driver:
        return _dra(args)
    source = "stdin" if args.manifest == "-" else args.manifest
    documents = load_documents(_read(args.manifest), source)
    allowed = list(args.allowed_machine_types)
    from providers.core.capacity import CapacityType
    from webhook import CapacityPolicy, parse_namespace_policy

    capacity = CapacityPolicy(
        CapacityType(args.default_capacity_type),
        parse_namespace_policy(args.namespace_capacity_types),
    )
    report = plan_manifest(
        documents,
        args.provider,
        args.region.strip(),
        catalog_dir=Path(args.catalog_dir) if args.catalog_dir else None,
        pod_name=args.pod.strip(),
        allowed_machine_types=allowed,
        naming=naming,
        capacity=capacity,
    )
    if args.output == "json":
        json.dump(report_json(report, args.warm_pool), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_report(report, args.limit, sys.stdout, args.warm_pool)
    sys.stdout.flush()
    failure = report.failure
    if failure is None:
        return 0
    verb = {"admission": "denied", "selection": "no instance type", "devices": "devices"}
    print(f"peerpods plan: {verb[failure.stage]} ({failure.code}): {failure.message}",
          file=sys.stderr)  # fmt: skip
    return 1
