"""`peerpods select`: which instance type a request gets, and why.

Offline on the bundled snapshot unless `--live`. A bad flag value or an impossible request is one
line on stderr and a non-zero exit (2), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from adaptor.cli import flags
from adaptor.cli.table import aligned
from providers.core.settings import csv

if TYPE_CHECKING:
    from providers.core.catalog import Catalog
    from providers.core.request import InstanceRequest
    from providers.core.selection import Candidate, Selection


def configure(parser: argparse.ArgumentParser) -> None:
    """Add this subcommand's flags (from `SelectSettings`)."""
    from adaptor.cli.settings import SelectSettings

    flags.add_settings(parser, SelectSettings)


def _mig(text: str) -> dict[str, int]:
    import re

    from providers.core.errors import InvalidRequest

    profiles: dict[str, int] = {}
    for item in csv(text):
        profile, sep, count = item.partition("=")
        profile = profile.strip()
        count = count.strip()
        if not re.fullmatch(r"[0-9]+g\.[0-9]+gb(\+me)?", profile):
            raise InvalidRequest(f"--mig: {item!r} is not PROFILE=COUNT (e.g. 1g.10gb=2)")
        if sep and not count.isdigit():
            raise InvalidRequest(f"--mig: count in {item!r} must be a positive integer")
        number = int(count) if sep else 1
        if number <= 0:
            raise InvalidRequest(f"--mig: count in {item!r} must be a positive integer")
        profiles[profile] = profiles.get(profile, 0) + number
    return profiles


def _with_unit(flag: str, text: str) -> str:
    """A memory quantity with its unit: `40` would be 40 bytes, never what was meant."""
    from providers.core.errors import InvalidRequest

    value = str(text).strip()
    if value and value.replace(".", "", 1).isdigit():
        raise InvalidRequest(
            f"{flag} {value} has no unit: write {value}Gi or {value}Mi (a bare number is bytes)"
        )
    return value


def build_request(args: argparse.Namespace) -> InstanceRequest:
    """The request the flags describe; InvalidRequest for any bad value."""
    from pydantic import ValidationError

    from providers.core.errors import InvalidRequest
    from providers.core.gpus import models_matching
    from providers.core.quantity import to_cpus, to_mib
    from providers.core.request import InstanceRequest

    models = csv(args.gpu_model)
    for model in models:
        models_matching(model)  # unknown names fail here, before any catalog is read
    if args.gpus < 0:
        raise InvalidRequest(f"--gpus must not be negative, got {args.gpus}")
    if args.vcpus and not str(args.vcpus).strip().isdigit():
        raise InvalidRequest(f"--vcpus must be a whole number, got {args.vcpus!r}")
    try:
        return InstanceRequest(
            vcpus=to_cpus(args.vcpus) if args.vcpus else 0,
            memory_mib=to_mib(_with_unit("--memory", args.memory)) if args.memory else 0,
            gpus=args.gpus,
            gpu_models=models,
            gpu_memory_mib=(
                to_mib(_with_unit("--gpu-memory", args.gpu_memory)) if args.gpu_memory else 0
            ),
            mig=_mig(args.mig),
            fractional=args.fractional,
            arch=args.arch,
            rdma=args.rdma,
            allow=csv(args.allow),
            deny=csv(args.deny),
            instance_type=args.instance_type.strip(),
            zone=args.zone.strip(),
            provisioning="spot" if args.spot else "on-demand",
            reservation=args.reservation.strip(),
            confidential=args.confidential,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidRequest(f"{where}: {first['msg']}") from None


def _catalog(args: argparse.Namespace) -> Catalog:
    from providers.core.snapshots import DEFAULT_REGIONS, load_catalog

    region = args.region.strip() or DEFAULT_REGIONS[args.provider]
    catalog_dir = Path(args.catalog_dir) if args.catalog_dir else None
    if not args.live:
        return load_catalog(args.provider, region, catalog_dir=catalog_dir)
    bar: Any = None
    try:
        from tqdm import tqdm

        bar = tqdm(desc=f"{args.provider} {region}", unit=" items", file=sys.stderr, leave=False)
    except ImportError:
        bar = None

    def progress(stage: str, advance: int) -> None:
        if bar is not None:
            bar.set_description(stage)
            bar.update(advance)

    try:
        return load_catalog(args.provider, region, live=True, progress=progress)
    finally:
        if bar is not None:
            bar.close()


def _price(value: float | None, estimated: bool = False) -> str:
    """A price cell; `~` marks an estimate (no price source covers the type)."""
    if value is None:
        return "-"
    return f"~{value:.4f}" if estimated else f"{value:.4f}"


def _gpus(c: Candidate) -> str:
    if not c.gpu_model:
        return "-"
    if c.fraction < 1:
        return f"{c.fraction:.3g} x {c.gpu_model}"
    attach = "+" if c.attach_gpus else ""
    return f"{attach}{c.gpus} x {c.gpu_model}"


def candidate_json(c: Candidate) -> dict[str, Any]:
    t = c.instance_type
    layout = None
    if c.mig_layout is not None:
        layout = [
            {"profile": p.profile, "gpu": p.gpu, "start": p.start} for p in c.mig_layout.placements
        ]
    return {
        "name": c.name,
        "price_per_hour": c.price_per_hour,
        "price_estimated": c.price_estimated,
        "spot_price_per_hour": t.spot_price_per_hour,
        "vcpus": t.vcpus,
        "memory_mib": t.memory_mib,
        "arch": t.arch,
        "gpu_model": c.gpu_model,
        "gpus": c.gpus,
        "gpus_used": c.gpus_used,
        "gpu_memory_mib": c.gpu_memory_mib,
        "fraction": c.fraction,
        "attach_gpus": c.attach_gpus,
        "rdma": t.rdma,
        "zones": list(t.zones),
        "mig_layout": layout,
        "reasons": list(c.reasons),
    }


def selection_json(catalog: Catalog, selection: Selection) -> dict[str, Any]:
    return {
        "selected": selection.selected.name,
        "provider": catalog.cloud,
        "region": catalog.region,
        "source": catalog.source,
        "request": selection.request.model_dump(mode="json", exclude_defaults=True),
        "candidates": [candidate_json(c) for c in selection.candidates],
        "rejections": [{"name": r.name, "reason": r.reason} for r in selection.rejections],
        "not_chosen": [{"name": r.name, "reason": r.reason} for r in selection.not_sold()],
    }


_NOT_CHOSEN = 5  # types that fit but are not sold the way the pod buys, named in the table


def print_table(catalog: Catalog, selection: Selection, limit: int, out: TextIO) -> None:
    candidates = selection.candidates
    source = f", {catalog.source}" if catalog.source else ""
    print(f"selected: {candidates[0].name}  ({catalog.cloud} {catalog.region}{source})", file=out)
    spot = selection.request.provisioning == "spot"
    rows = [("#", "TYPE", "SPOT USD/H" if spot else "USD/H", "GPUS", "VCPUS", "MEMORY", "WHY")]
    for i, c in enumerate(candidates[: max(limit, 1)], 1):
        t = c.instance_type
        memory = f"{t.memory_mib / 1024:g}Gi"
        why = "; ".join(c.reasons)
        price = _price(c.price_per_hour, c.price_estimated)
        rows.append((str(i), c.name, price, _gpus(c), str(t.vcpus), memory, why))
    for line in aligned(rows):
        print(line, file=out)
    if any(c.price_estimated for c in candidates[: max(limit, 1)]):
        note = "~: an estimate from the type's GPUs, vCPUs and memory (no list price known)"
        if spot:
            note = "~: no Spot price known: on-demand (what Spot costs at most), or an estimate"
        print(note, file=out)
    hidden = len(candidates) - max(limit, 1)
    if hidden > 0:
        print(f"... {hidden} more candidates (--limit, or --output json)", file=out)
    rejected = selection.rejections
    if rejected:
        from collections import Counter

        from providers.core.selection import STAGE_NAMES

        kinds = Counter(STAGE_NAMES[r.stage] for r in rejected)
        parts = ", ".join(f"{n} on {kind}" for kind, n in kinds.most_common(5))
        print(f"{len(rejected)} rejected: {parts}", file=out)
        not_sold = selection.not_sold()
        for r in not_sold[:_NOT_CHOSEN]:
            print(f"not chosen: {r.name}: {r.reason}", file=out)
        if len(not_sold) > _NOT_CHOSEN:
            print(f"... {len(not_sold) - _NOT_CHOSEN} more not sold this way (--output json)",
                  file=out)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from providers.core.selection import select

    request = build_request(args)
    catalog = _catalog(args)
    selection = select(catalog, request)
    selection.selected  # noqa: B018 (raises NoMatch with the one-line summary)
    if args.output == "json":
        json.dump(selection_json(catalog, selection), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(catalog, selection, args.limit, sys.stdout)
    return 0
