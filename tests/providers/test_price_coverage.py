"""Every bundled GPU type has the list prices its cloud publishes, or is named as not sourced.

A type without a price is ranked by an estimate, and an estimate can put a dearer type first:
a pod asking for one GPU with 70 GiB on GCP got a2-ultragpu-1g ($5.0277/h, Cloud Billing
Catalog) instead of g4-standard-48 ($4.5001/h, the same catalog's G4 list price for
us-central1, as published in dstackai/dstack#3213). Rules: a type sold on demand needs its
on-demand price (GCP N1: the machine's and each attachable GPU's); a type sold as Spot on Azure
or GCP needs its Spot list price (AWS publishes no Spot list price, only a market history, read
live). What could not be sourced offline is listed, with why, in
providers/snapshots/prices/unpriced.csv; a new GPU type without a price fails here, and so does
a listed gap that has since been filled.
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
REGIONS = [("aws", "us-east-1"), ("aws", "us-west-2"), ("azure", "eastus"), ("gcp", "us-central1")]


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
    catalog = snapshots.load_catalog(cloud, region)  # type: ignore[arg-type]
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
