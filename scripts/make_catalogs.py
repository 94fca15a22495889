"""Write the bundled catalog snapshots under providers/snapshots/ with the real loaders.

AWS snapshots come from the AWS loader run against moto, whose bundled DescribeInstanceTypes and
offerings data is real AWS data; Azure and GCP snapshots from their loaders fed, through the SDKs'
own HTTP transports, the recorded responses in tests/providers/fakes/data/. Known prices are
merged by the loaders. The other Azure and GCP regions that sell GPUs are made from the recorded
region's types and the per-region rows of the clouds' own price lists as
skypilot-org/skypilot-catalog vendors them (`--source-rows`, see `regional`).
Usage: python scripts/make_catalogs.py [--out DIR] [--source-rows FILE ...] [NAME ...]
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from providers.core import prices  # noqa: E402
from providers.core.catalog import Catalog, InstanceType  # noqa: E402
from providers.core.errors import PeerpodsError  # noqa: E402
from providers.core.offers import apply_offer  # noqa: E402
from providers.core.snapshots import load_snapshot, snapshot_json  # noqa: E402

# Every region of moto's AWS data that offers a GPU type (ap-south-2, ap-southeast-4 and
# ca-west-1 offer none there).
AWS_REGIONS = (
    "af-south-1",
    "ap-east-1",
    "ap-northeast-1",
    "ap-northeast-2",
    "ap-northeast-3",
    "ap-south-1",
    "ap-southeast-1",
    "ap-southeast-2",
    "ap-southeast-3",
    "ap-southeast-5",
    "ca-central-1",
    "eu-central-1",
    "eu-central-2",
    "eu-north-1",
    "eu-south-1",
    "eu-south-2",
    "eu-west-1",
    "eu-west-2",
    "eu-west-3",
    "il-central-1",
    "me-central-1",
    "me-south-1",
    "sa-east-1",
    "us-east-1",
    "us-east-2",
    "us-west-1",
    "us-west-2",
)
# Regions moto's data lists that offer no GPU type there.
AWS_REGIONS_WITHOUT_GPUS = ("ap-south-2", "ap-southeast-4", "ca-west-1")
# The moto release whose bundled EC2 data (DescribeInstanceTypes and instance type offerings,
# AWS's own records) the AWS snapshots are made from; config/constraints.txt pins it. Another
# release's data differs (regions, types), so the maker refuses it rather than mislabel it.
MOTO_DATA = "5.2.1"
# AWS regions priced from the AWS Price List directly (prices/aws-<region>.csv); the other AWS
# regions are priced from the same list as skypilot-org/skypilot-catalog vendors it (`aws_listed`).
AWS_PRICE_LIST_REGIONS = ("us-east-1", "us-west-2")
AZURE_REGIONS = ("eastus",)
GCP_REGIONS = ("us-central1",)
# The other regions whose price list (the source below) names a GPU type of the recorded region.
# Azure's list covers the US regions only (westcentralus: no GPU size).
AZURE_SOURCE_REGIONS = (
    "centralus",
    "eastus2",
    "northcentralus",
    "southcentralus",
    "westus",
    "westus2",
    "westus3",
)
GCP_SOURCE_REGIONS = (
    "asia-east1",
    "asia-east2",
    "asia-northeast1",
    "asia-northeast3",
    "asia-south1",
    "asia-south2",
    "asia-southeast1",
    "asia-southeast2",
    "australia-southeast1",
    "europe-central2",
    "europe-north1",
    "europe-west1",
    "europe-west2",
    "europe-west3",
    "europe-west4",
    "europe-west6",
    "europe-west8",
    "europe-west9",
    "me-central2",
    "me-west1",
    "northamerica-northeast1",
    "northamerica-northeast2",
    "southamerica-east1",
    "us-east1",
    "us-east4",
    "us-east5",
    "us-south1",
    "us-west1",
    "us-west2",
    "us-west3",
    "us-west4",
)


def aws(region: str) -> Catalog:
    import boto3
    import moto
    from moto import mock_aws

    from providers.clouds.loaders import aws as loader

    if moto.__version__ != MOTO_DATA:
        raise PeerpodsError(
            f"the AWS snapshots are made from moto {MOTO_DATA}'s EC2 data, moto "
            f"{moto.__version__} is installed: pip install -c config/constraints.txt -e '.[test]'"
        )
    with mock_aws():
        client = boto3.client(
            "ec2", region_name=region, aws_access_key_id="snapshot", aws_secret_access_key="x"
        )
        catalog = loader.load_catalog(region, client=client)
        extra = _aws_supplement(client, region)
    if extra:
        merged = {t.name: t for t in catalog.types}
        merged.update((t.name, t) for t in extra)
        types = tuple(merged[name] for name in sorted(merged))
        catalog = prices.with_prices(catalog.model_copy(update={"types": types}))
    return catalog.model_copy(update={"source": AWS_SOURCE_LABEL})


AWS_SOURCE_LABEL = (
    "snapshot: AWS's own EC2 records (DescribeInstanceTypes, instance type offerings) "
    f"as moto {MOTO_DATA} bundles them"
)


def _aws_supplement(client: Any, region: str) -> list[InstanceType]:
    """Types moto's data lacks in `region`, from recorded DescribeInstanceTypes and offerings
    responses (tests/providers/fakes/data/aws-<region>-supplement.json)."""
    from providers.clouds.loaders import aws as loader

    path = ROOT / "tests" / "providers" / "fakes" / "data" / f"aws-{region}-supplement.json"
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    zones: dict[str, list[str]] = {}
    for offering in data.get("InstanceTypeOfferings", []):
        zones.setdefault(offering["InstanceType"], []).append(offering["Location"])
    recorded = {raw["InstanceType"]: raw for raw in data.get("InstanceTypes", [])}
    known = [name for name in zones if name not in recorded]
    if known:  # described by moto's AWS data, offered here per the recorded offerings
        for raw in client.describe_instance_types(InstanceTypes=known)["InstanceTypes"]:
            recorded[raw["InstanceType"]] = raw
    found = []
    for name, raw in recorded.items():
        parsed = loader.instance_type(raw, tuple(sorted(zones.get(name, ()))))
        if parsed is not None and parsed.zones:
            found.append(parsed)
    return found


def azure(region: str) -> Catalog:
    from providers.clouds.loaders import azure as loader
    from tests.providers.fakes.azure import compute_client, recorded_skus, serve_skus
    from tests.providers.fakes.http import FakeCloud

    fake = FakeCloud()
    serve_skus(fake, recorded_skus(region))
    catalog = loader.load_catalog(region, client=compute_client(fake))
    return catalog.model_copy(update={"source": "snapshot: recorded resource SKUs"})


def gcp(region: str) -> Catalog:
    from providers.clouds.loaders import gcp as loader
    from tests.providers.fakes.gcp import PROJECT, recorded, serve_recorded
    from tests.providers.fakes.gcp import clients as gcp_clients
    from tests.providers.fakes.http import FakeCloud

    fake = FakeCloud()
    serve_recorded(fake, recorded(region))
    catalog = loader.load_catalog(region, client=gcp_clients(fake), project=PROJECT)
    return catalog.model_copy(update={"source": "snapshot: recorded machine/accelerator types"})


# --- Regions made from the clouds' price lists -----------------------------------------------
#
# Source: skypilot-org/skypilot-catalog, which stores each cloud's own per-region price list as
# CSV. A working extract of it (rows `type|region|zone suffixes|price|spot`; GCP's per-GPU rows
# named `gpu:<accelerator>*<count>`) is read with --source-rows. A type of the recorded region is
# bundled in another region where the list names it there, with the list's zones (Azure's list
# has none) and prices; its shape, GPU memory and how it is sold stay the recorded ones.
# A figure is taken only where the list's recorded-region figure for the same type is the
# recorded one, and (GCP) a per-GPU on-demand figure only within 0.9-1.5x its recorded-region
# figure: the list mixes other SKUs into some rows (its H100 row for us-central1 is $4.20076,
# the Cloud Billing Catalog's $9.79655). What is not taken is named in prices/unpriced.csv.

SOURCES = {
    "aws": "skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv @00148f2a",
    "gcp": "skypilot-org/skypilot-catalog catalogs/v8/gcp/vms.csv @006059e0",
    "azure": "skypilot-org/skypilot-catalog catalogs/v6/azure/vms.csv @098741e7",
}
SOURCE_COMMITS = {
    "aws": "00148f2af3672e2229b4f7bf8157d5a3f36e3c35",
    "gcp": "006059e0f18acb1341e22a27751e9f80df6ba92f",
    "azure": "098741e70562f65d7af1cceb81e33b284f742604",
}
RECORDED = {"gcp": "us-central1", "azure": "eastus"}
# GCP bills a GPU machine as its host row plus its GPUs' row (accelerator name in the list)
_GCP_GPU_ROWS = {
    "a2-highgpu": "A100",
    "a2-megagpu": "A100",
    "a2-ultragpu": "A100-80GB",
    "a3-edgegpu": "H100",
    "a3-highgpu": "H100",
    "a3-megagpu": "H100-MEGA",
    "a3-ultragpu": "H200",
    "a4-highgpu": "B200",
    "g2-standard": "L4",
}
# the list's row that prices one GPU of a model (the catalog's `gpu_prices`; not A3 Mega's)
_GCP_PER_GPU = {
    "a100-40gb": "A100",
    "a100-80gb": "A100-80GB",
    "b200": "B200",
    "h100-80gb": "H100",
    "h200": "H200",
    "l4": "L4",
}
_GCP_ATTACHED_ROWS = {"p100": "P100", "p4": "P4", "t4": "T4", "v100": "V100"}
_GPU_RANGE = (0.9, 1.5)
PRICES_DIR = ROOT / "providers" / "snapshots" / "prices"


class SourceRow(NamedTuple):
    """One type (or `gpu:` row) in one region of the price list."""

    zones: tuple[str, ...]  # zone suffixes (GCP)
    price: float | None
    spot: float | None


class Figure(NamedTuple):
    """A composed price, or None with why not."""

    value: float | None
    note: str


SourceRows = Mapping[tuple[str, str], SourceRow]


def read_source_rows(paths: Iterable[Path]) -> dict[tuple[str, str], SourceRow]:
    """(type or `gpu:` row, region) -> row, from the working extracts."""
    rows: dict[tuple[str, str], SourceRow] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            name, region, zones, price, spot = line.split("|")
            rows[(name, region)] = SourceRow(
                tuple(zones), float(price) if price else None, float(spot) if spot else None
            )
    return rows


def _rounded(value: float) -> float:
    return float(f"{value:.6g}")


def _same(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-4, abs_tol=2e-5)


def _gpu_row(rows: SourceRows, name: str, count: int, region: str) -> tuple[SourceRow, int] | None:
    """The list's row for `count` GPUs, or its one-GPU row and the multiplier."""
    for n, times in ((count, 1), (1, count)):
        row = rows.get((f"gpu:{name}*{n}", region))
        if row is not None:
            return row, times
    return None


def _gcp_figure(
    rows: SourceRows, t: InstanceType, region: str, spot: bool
) -> tuple[float | None, str, float | None]:
    """(host + GPUs, how, one GPU) from the list for a GCP type in a region."""
    what = "Spot" if spot else "on-demand"
    host_row = rows.get((t.name, region))
    host = None if host_row is None else (host_row.spot if spot else host_row.price)
    if host is None:
        return None, f"the list has no {what} figure for the machine in {region}", None
    if t.gpu is None:
        return host, f"{region}, {host}", None
    name = _GCP_GPU_ROWS.get(t.name.rsplit("-", 1)[0], "")
    found = _gpu_row(rows, name, t.gpu.count, region)
    part = None if found is None else (found[0].spot if spot else found[0].price)
    if found is None or part is None:
        return None, f"the list has no {what} figure for {name} x{t.gpu.count} in {region}", None
    total = host + part * found[1]
    one = part * found[1] / t.gpu.count
    return total, f"{region}, host {host} + {name} x{t.gpu.count} {_rounded(part * found[1])}", one


def _gcp_price(
    rows: SourceRows, base: InstanceType, t: InstanceType, region: str, spot: bool
) -> Figure:
    recorded = RECORDED["gcp"]
    value, note, one = _gcp_figure(rows, t, region, spot)
    if value is None:
        return Figure(None, note)
    check, _, check_one = _gcp_figure(rows, t, recorded, spot)
    kept = base.spot_price_per_hour if spot else base.price_per_hour
    if check is None or kept is None:
        return Figure(None, f"no {recorded} figure to check the list's {region} one against")
    if not _same(check, kept):
        return Figure(
            None,
            f"the list's {recorded} figure for the type ({_rounded(check)}) is not the bundled "
            f"{recorded} one ({kept}), so its {region} figure is not taken",
        )
    if not spot and one is not None and check_one:
        ratio = one / check_one
        if not _GPU_RANGE[0] <= ratio <= _GPU_RANGE[1]:
            return Figure(
                None,
                f"the list's per-GPU on-demand figure in {region} ({_rounded(one)}) is "
                f"{ratio:.2f}x its {recorded} one: another SKU, not the list price",
            )
    return Figure(_rounded(value), note)


def _gcp_attached(
    rows: SourceRows, base: InstanceType, t: InstanceType, region: str
) -> tuple[tuple[Any, ...], dict[str, tuple[Figure, Figure]]]:
    """The N1 type's attachable GPUs the list names in the region, and their prices."""
    recorded = RECORDED["gcp"]
    kept = {a.model: a for a in base.attachable_gpus}
    zones = set(t.zones)
    found = []
    figures: dict[str, tuple[Figure, Figure]] = {}
    for a in base.attachable_gpus:
        name = _GCP_ATTACHED_ROWS[a.model]
        row = rows.get((f"gpu:{name}*1", region))
        check = rows.get((f"gpu:{name}*1", recorded))
        if row is None or not zones & {f"{region}-{z}" for z in row.zones}:
            continue
        where = tuple(sorted(zones & {f"{region}-{z}" for z in row.zones}))
        pair = []
        for spot in (False, True):
            value = row.spot if spot else row.price
            ref = (check.spot if spot else check.price) if check else None
            mine = kept[a.model].spot_price_per_hour if spot else kept[a.model].price_per_hour
            if value is None:
                pair.append(Figure(None, f"the list has no figure for one {name} in {region}"))
            elif not _same(ref, mine):
                pair.append(Figure(None, f"the list's {recorded} {name} figure is not ours"))
            elif not spot and ref and not _GPU_RANGE[0] <= value / ref <= _GPU_RANGE[1]:
                pair.append(
                    Figure(
                        None,
                        f"the list's {name} figure in {region} is {value / ref:.2f}x "
                        f"its {recorded} one",
                    )
                )
            else:
                pair.append(Figure(value, f"{region}, per attached {name}"))
        figures[a.model] = (pair[0], pair[1])
        found.append(
            a.model_copy(
                update={
                    "zones": () if set(where) == zones else where,
                    "price_per_hour": pair[0].value,
                    "spot_price_per_hour": pair[1].value,
                }
            )
        )
    return tuple(found), figures


def _azure_price(rows: SourceRows, base: InstanceType, region: str, spot: bool) -> Figure:
    recorded = RECORDED["azure"]
    row, check = rows.get((base.name, region)), rows.get((base.name, recorded))
    assert row is not None
    value = row.spot if spot else row.price
    if value is None:
        return Figure(None, f"the list has no {'Spot' if spot else 'on-demand'} price in {region}")
    if spot and value == row.price:
        return Figure(
            None,
            f"the list has no Spot meter for the size in {region}: its Spot column repeats the "
            "pay-as-you-go rate",
        )
    ref = None if check is None else (check.spot if spot else check.price)
    kept = base.spot_price_per_hour if spot else base.price_per_hour
    if ref is None or kept is None:
        return Figure(None, f"no {recorded} figure to check the list's {region} one against")
    if not _same(ref, kept):
        return Figure(None, f"the list's {recorded} figure for the size is not the bundled one")
    return Figure(value, region)


class Regional(NamedTuple):
    """A region's catalog with its price rows and its gaps."""

    catalog: Catalog
    price_rows: tuple[tuple[str, float | None, float | None, str], ...]
    gaps: tuple[tuple[str, str, str], ...]  # (type, missing, why)


def regional(cloud: str, region: str, rows: SourceRows) -> Regional:
    """The recorded region's types the list names in `region`, priced from the list."""
    base = load_snapshot(cloud, RECORDED[cloud])
    source = SOURCES[cloud]
    types: list[InstanceType] = []
    price_rows: list[tuple[str, float | None, float | None, str]] = []
    gaps: list[tuple[str, str, str]] = []
    gpu_prices: dict[str, float] = {}
    for b in base.types:
        row = rows.get((b.name, region))
        if row is None:
            continue
        t, od, spot, attached = _priced(cloud, region, rows, b, row)
        types.append(t)
        _note_gpu_prices(gpu_prices, rows, t, od, attached, region)
        price_rows += _price_rows(t, od, spot, attached, source)
        gap = _gap(t, od, spot, attached, source)
        if gap is not None:
            gaps.append(gap)
    if not any(t.gpu or t.attachable_gpus for t in types):
        raise PeerpodsError(f"the list names no GPU type of {RECORDED[cloud]} in {region}")
    catalog = Catalog(
        cloud=cloud,
        region=region,
        source=f"snapshot: {source} (the {RECORDED[cloud]} types the list names in {region})",
        gpu_prices=dict(sorted(gpu_prices.items())),
        types=tuple(types),
    )
    unique = {r[0]: r for r in price_rows}
    return Regional(catalog, tuple(unique[k] for k in sorted(unique)), tuple(gaps))


_Attached = dict[str, tuple[Figure, Figure]]  # GPU model -> (on-demand, Spot) to attach one


def _priced(
    cloud: str, region: str, rows: SourceRows, b: InstanceType, row: SourceRow
) -> tuple[InstanceType, Figure, Figure, _Attached]:
    """A recorded type as the list offers it in `region`: its zones and attachable GPUs there,
    its on-demand and Spot figures (none for a way it is not sold), its GPUs' to attach."""
    zones = tuple(f"{region}-{z}" for z in row.zones) if cloud == "gcp" else ()
    t = apply_offer(cloud, b.model_copy(update={"zones": zones, "attachable_gpus": ()}))
    attached: _Attached = {}
    if cloud == "gcp":
        found, attached = _gcp_attached(rows, b, t, region)
        t = t.model_copy(update={"attachable_gpus": found})
        od, spot = (_gcp_price(rows, b, t, region, s) for s in (False, True))
    else:
        od, spot = (_azure_price(rows, b, region, s) for s in (False, True))
    if "on-demand" not in t.provisioning:
        od = Figure(None, "")
    if "spot" not in t.provisioning:
        spot = Figure(None, "")
    t = t.model_copy(update={"price_per_hour": od.value, "spot_price_per_hour": spot.value})
    return t, od, spot, attached


def _note_gpu_prices(
    gpu_prices: dict[str, float],
    rows: SourceRows,
    t: InstanceType,
    od: Figure,
    attached: _Attached,
    region: str,
) -> None:
    """The per-GPU rates a priced type shows, each model's first kept: a type whose GPUs the
    list prices at the plain per-GPU rate, and the GPUs it attaches."""
    plain = _GCP_GPU_ROWS.get(t.name.rsplit("-", 1)[0]) == _GCP_PER_GPU.get(
        t.gpu.model if t.gpu else ""
    )
    if t.gpu is not None and od.value is not None and plain:
        one = _gcp_figure(rows, t, region, False)[2]
        if one is not None:
            gpu_prices.setdefault(t.gpu.model, _rounded(one))
    for model, (a_od, _) in attached.items():
        if a_od.value is not None:
            gpu_prices.setdefault(model, a_od.value)


def _price_rows(
    t: InstanceType, od: Figure, spot: Figure, attached: _Attached, source: str
) -> list[tuple[str, float | None, float | None, str]]:
    """The price CSV's rows for a type and for each GPU it attaches, where one has a figure."""
    found: list[tuple[str, float | None, float | None, str]] = []
    if od.value is not None or spot.value is not None:
        notes = [
            f"on demand {od.note}" if od.value is not None else "",
            f"Spot {spot.note}" if spot.value is not None else "",
        ]
        found.append(
            (t.name, od.value, spot.value, f"{source}: " + "; ".join(n for n in notes if n))
        )
    for model, (a_od, a_spot) in attached.items():
        if a_od.value is not None or a_spot.value is not None:
            found.append(
                (f"gpu:{model}", a_od.value, a_spot.value, f"{source}: {a_od.note or a_spot.note}")
            )
    return found


def _gap(
    t: InstanceType, od: Figure, spot: Figure, attached: _Attached, source: str
) -> tuple[str, str, str] | None:
    """A GPU type's line of unpriced.csv: the ways it is sold that have no figure, and why."""
    missing, why = [], []
    a_od_gap = [f for f, _ in attached.values() if f.value is None]
    a_spot_gap = [f for _, f in attached.values() if f.value is None]
    if "on-demand" in t.provisioning and (od.value is None or a_od_gap):
        missing.append("on-demand")
        why += [f.note for f in [od, *a_od_gap] if f.value is None and f.note]
    if "spot" in t.provisioning and (spot.value is None or a_spot_gap):
        missing.append("spot")
        why += [f.note for f in [spot, *a_spot_gap] if f.value is None and f.note]
    if (t.gpu is not None or t.attachable_gpus) and missing:
        reasons = "; ".join(dict.fromkeys(why))
        return (t.name, " ".join(missing), f"{source}: {reasons}")
    return None


def _cell(value: float | None) -> str:
    """A figure as the list gives it (an AWS rate has up to 7 significant digits)."""
    return "" if value is None else f"{value:.10g}"


def write_regional(made: Regional, out: Path) -> None:
    """The region's price CSV and its lines of unpriced.csv (other regions' lines kept)."""
    cloud, region = made.catalog.cloud, made.catalog.region
    prices_dir = out / "prices"
    prices_dir.mkdir(parents=True, exist_ok=True)
    path = prices_dir / f"{cloud}-{region}.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(("instance_type", "usd_per_hour", "spot_usd_per_hour", "source"))
        for name, od, spot, note in made.price_rows:
            writer.writerow((name, _cell(od), _cell(spot), note))
    unpriced = prices_dir / "unpriced.csv"
    header = ["cloud", "region", "instance_type", "missing", "why"]
    kept: list[dict[str, str]] = []
    if unpriced.is_file():
        with unpriced.open(newline="") as handle:
            kept = [
                r for r in csv.DictReader(handle) if (r["cloud"], r["region"]) != (cloud, region)
            ]
    kept += [
        {"cloud": cloud, "region": region, "instance_type": n, "missing": m, "why": w}
        for n, m, w in made.gaps
    ]
    with unpriced.open("w", newline="") as handle:
        table = csv.DictWriter(handle, header, lineterminator="\n")
        table.writeheader()
        table.writerows(kept)


def aws_listed(region: str, rows: SourceRows) -> Regional:
    """An AWS region's snapshot with its GPU types' on-demand list prices from the price list's
    rows (skypilot-catalog's copy of the AWS Price List: OnDemand, Linux, shared tenancy).

    A figure is taken only where the list's us-east-1 figure for the same type is the one
    bundled for us-east-1 from the AWS Price List itself; a type the list has no row for in the
    region, or whose us-east-1 figure differs, is named in prices/unpriced.csv. AWS publishes no
    Spot list price (only a market history, read live), so no Spot column is written."""
    catalog = aws(region)
    source = f"{SOURCES['aws']} (AWS Price List OnDemand, Linux)"
    recorded = {t.name: t.price_per_hour for t in load_snapshot("aws", "us-east-1").types}
    price_rows: list[tuple[str, float | None, float | None, str]] = []
    gaps: list[tuple[str, str, str]] = []
    found: dict[str, float] = {}
    for t in catalog.types:
        if (t.gpu is None and not t.attachable_gpus) or "on-demand" not in t.provisioning:
            continue
        row, check = rows.get((t.name, region)), rows.get((t.name, "us-east-1"))
        kept = recorded.get(t.name)
        if row is None or row.price is None:
            why = f"the list has no on-demand figure for the type in {region}"
        elif kept is not None and not _same(check.price if check else None, kept):
            why = f"the list's us-east-1 figure for the type is not the bundled one ({kept})"
        else:
            found[t.name] = row.price
            price_rows.append((t.name, row.price, None, f"{source}, {region}"))
            continue
        gaps.append((t.name, "on-demand", f"{SOURCES['aws']}: {why}"))
    types = tuple(  # the list's figure, also over one an earlier price file gave the loader
        t.model_copy(update={"price_per_hour": found[t.name]}) if t.name in found else t
        for t in catalog.types
    )
    return Regional(catalog.model_copy(update={"types": types}), tuple(price_rows), tuple(gaps))


def makers(rows: SourceRows | None = None) -> dict[str, Callable[[], Catalog | Regional]]:
    """Snapshot name -> how to make it (the list-made regions only with the list's rows)."""
    found: dict[str, Callable[[], Catalog | Regional]] = {}
    for cloud, regions, make in (
        ("aws", AWS_REGIONS, aws),
        ("azure", AZURE_REGIONS, azure),
        ("gcp", GCP_REGIONS, gcp),
    ):
        for region in regions:
            found[f"{cloud}-{region}"] = functools.partial(make, region)
    if rows is not None:  # the other AWS regions' prices from the price list's rows
        for region in AWS_REGIONS:
            if region not in AWS_PRICE_LIST_REGIONS:
                found[f"aws-{region}"] = functools.partial(aws_listed, region, rows)
    listed: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("azure", AZURE_SOURCE_REGIONS),
        ("gcp", GCP_SOURCE_REGIONS),
    )
    for cloud, listed_regions in listed:
        for region in listed_regions:
            name = f"{cloud}-{region}"
            found[name] = (
                functools.partial(_need_rows, name)
                if rows is None
                else functools.partial(regional, cloud, region, rows)
            )
    return found


def _need_rows(name: str) -> Regional:
    raise PeerpodsError(f"{name} is made from the price list's rows: give --source-rows FILE")


def dumps(catalog: Catalog) -> str:
    """JSON with one instance type per line (defaults left out), so snapshots diff well."""
    return snapshot_json(catalog)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="snapshots to write (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "providers" / "snapshots")
    parser.add_argument(
        "--source-rows",
        type=Path,
        action="append",
        default=[],
        help="the working extract of the clouds' price lists (see `regional`); repeatable",
    )
    args = parser.parse_args(argv)
    rows = read_source_rows(args.source_rows) if args.source_rows else None
    known = makers(rows)
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"unknown snapshot {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.names or list(known)
    if not args.names and rows is None:  # all but the regions made from the price lists
        listed = {f"azure-{r}" for r in AZURE_SOURCE_REGIONS}
        listed |= {f"gcp-{r}" for r in GCP_SOURCE_REGIONS}
        names = [n for n in names if n not in listed]
        print("the list-made Azure and GCP regions need --source-rows: left as they are")
    for name in names:
        try:
            made = known[name]()
        except PeerpodsError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
        catalog = made.catalog if isinstance(made, Regional) else made
        text = dumps(catalog)
        Catalog.model_validate_json(text)  # what is written must load back
        path = args.out / f"{name}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        if isinstance(made, Regional):
            write_regional(made, args.out)
        gpus = sum(1 for t in catalog.types if t.gpu or t.attachable_gpus)
        print(
            f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: "
            f"{len(catalog.types)} types, {gpus} with GPUs"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
