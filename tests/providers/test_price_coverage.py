"""Every bundled GPU type has the list prices its cloud publishes, or is named as not sourced.

A type without a price is ranked by an estimate, and an estimate can put a dearer type first:
a pod asking for one GPU with 70 GiB on GCP got a2-ultragpu-1g ($5.0277/h, Cloud Billing
Catalog) instead of g4-standard-48 ($4.5001/h, the same catalog's G4 list price for
us-central1, as published in dstackai/dstack#3213). Rules: a type sold on demand needs its
on-demand price (GCP N1: the machine's and each attachable GPU's); a type sold as Spot on Azure
or GCP needs its Spot list price (AWS publishes no Spot list price, only a market history, read
live); a type not sold on demand (providers.core.offers: AWS P5e, P6e-GB200, GCP A3 Ultra, A4,
A4X) needs none. Every price row names its source (the CSVs' `source` column); what could not be
sourced offline is listed, with why, in providers/snapshots/prices/unpriced.csv; a new GPU type
without a price fails here, and so does a listed gap that has since been filled.

Figures checked against their public sources (skypilot-org/skypilot-catalog, which vendors the
clouds' price lists as CSV): AWS catalogs/v8/aws/vms.csv @00148f2a (EC2 Price List OnDemand:
g7e.2xlarge $3.36312, g5g.xlarge $0.42, dl1.24xlarge $13.10904 in us-east-1; p5e.48xlarge has
no On-Demand rate in any region), GCP catalogs/v8/gcp/vms.csv @006059e0 (us-central1 Spot:
n1-standard-1 host $0.01306 + T4 $0.175; a2-ultragpu-1g host $0.54978 + A100 80GB $1.964),
Azure catalogs/v6/azure/vms.csv @098741e7 (eastus Spot: Standard_NC4as_T4_v3 $0.062699).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from providers.core import snapshots
from providers.core.catalog import InstanceType
from providers.core.request import InstanceRequest
from providers.core.selection import select

PRICES = Path(__file__).parents[2] / "providers" / "snapshots" / "prices"
# every bundled region of every cloud
REGIONS = [(c, r) for c in ("aws", "azure", "gcp") for r in snapshots.available_snapshots(c)]


def _missing(cloud: str, t: InstanceType) -> list[str]:
    missing = []
    attached = t.attachable_gpus
    if "on-demand" in t.provisioning and (
        t.price_per_hour is None or any(a.price_per_hour is None for a in attached)
    ):
        missing.append("on-demand")
    if (
        cloud != "aws"
        and "spot" in t.provisioning
        and (t.spot_price_per_hour is None or any(a.spot_price_per_hour is None for a in attached))
    ):
        missing.append("spot")
    return missing


def _unpriced() -> dict[tuple[str, str, str], str]:
    with (PRICES / "unpriced.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert all(row["why"].strip() for row in rows), "every gap says why"
    return {(r["cloud"], r["region"], r["instance_type"]): r["missing"] for r in rows}


@pytest.mark.parametrize(("cloud", "region"), REGIONS)
def test_every_bundled_gpu_type_is_priced_or_named_as_not_sourced(cloud: str, region: str) -> None:
    catalog = snapshots.load_catalog(cloud, region)
    gaps = {k[2]: v for k, v in _unpriced().items() if k[:2] == (cloud, region)}
    found = {}
    for t in catalog.types:
        if t.gpu is None and not t.attachable_gpus:
            continue
        missing = _missing(cloud, t)
        if missing:
            found[t.name] = " ".join(missing)
    unlisted = {name: what for name, what in found.items() if gaps.get(name) != what}
    assert not unlisted, f"GPU types without a published price: {unlisted}"
    stale = sorted(set(gaps) - set(found))
    assert not stale, f"unpriced.csv lists types that are priced now: {stale}"


def test_the_g4_list_price_beats_the_dearer_a2_ultragpu() -> None:
    catalog = snapshots.load_catalog("gcp")
    chosen = select(catalog, InstanceRequest(gpus=1, gpu_memory_mib=70 * 1024)).selected
    assert (chosen.name, chosen.price_per_hour, chosen.price_estimated) == (
        "g4-standard-48",
        4.5001,
        False,
    )


def _price_rows() -> list[tuple[str, dict[str, str]]]:
    rows = []
    for path in sorted(PRICES.glob("*-*.csv")):
        if path.name == "unpriced.csv":
            continue
        with path.open(newline="") as handle:
            rows += [(path.name, row) for row in csv.DictReader(handle)]
    return rows


def test_every_price_row_names_its_source() -> None:
    rows = _price_rows()
    assert len(rows) > 200
    unsourced = [(f, r["instance_type"]) for f, r in rows if not (r.get("source") or "").strip()]
    assert not unsourced, f"price rows without a source: {unsourced}"


@pytest.mark.parametrize(
    ("cloud", "region", "name", "on_demand", "spot"),
    [
        ("aws", "us-east-1", "g7e.2xlarge", 3.36312, None),
        ("aws", "us-east-1", "g5g.xlarge", 0.42, None),
        ("aws", "us-west-2", "dl1.24xlarge", 13.10904, None),
        ("aws", "eu-west-1", "g4dn.xlarge", 0.587, None),
        ("aws", "eu-west-1", "p4d.24xlarge", 23.71569, None),
        ("aws", "ap-northeast-1", "p5.48xlarge", 68.8, None),
        ("gcp", "us-central1", "a2-ultragpu-1g", 5.0277, 2.51378),  # 0.54978 + 1.964
        ("gcp", "us-central1", "n1-standard-1", 0.0475, 0.01306),
        ("azure", "eastus", "Standard_NC4as_T4_v3", 0.526, 0.062699),
    ],
)
def test_bundled_prices_are_the_published_figures(
    cloud: str, region: str, name: str, on_demand: float, spot: float | None
) -> None:
    t = snapshots.load_catalog(cloud, region).by_name()[name]
    assert (t.price_per_hour, t.spot_price_per_hour) == (on_demand, spot)


def test_a_type_not_sold_on_demand_needs_no_on_demand_price() -> None:
    # AWS's Price List has no On-Demand rate for p5e.48xlarge: Capacity Blocks and Spot only
    east = snapshots.load_catalog("aws", "us-east-1")
    p5e = east.by_name()["p5e.48xlarge"]
    assert (p5e.provisioning, p5e.price_per_hour) == (("spot", "capacity-block"), None)
    assert _missing("aws", p5e) == []
    selection = select(east, InstanceRequest(gpus=8, gpu_models=("h200",)))
    assert selection.selected.name == "p5en.48xlarge"
    rejected = {r.name: r.reason for r in selection.rejections}
    assert "not on-demand" in rejected["p5e.48xlarge"]


@pytest.mark.parametrize(
    ("cloud", "model", "name", "spot"),
    [
        # the docs' offline Spot example: the N1 machine's Spot price plus one T4's
        ("gcp", "t4", "n1-standard-1", 0.01306 + 0.175),
        ("azure", "t4", "Standard_NC4as_T4_v3", 0.062699),
    ],
)
def test_spot_pods_rank_by_published_spot_prices(
    cloud: str, model: str, name: str, spot: float
) -> None:
    catalog = snapshots.load_catalog(cloud)
    request = InstanceRequest(gpus=1, gpu_models=(model,), provisioning="spot")
    chosen = select(catalog, request).selected
    assert (chosen.name, chosen.price_estimated) == (name, False)
    assert chosen.price_per_hour == pytest.approx(spot)
