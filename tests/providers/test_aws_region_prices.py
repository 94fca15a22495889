"""AWS list prices outside us-east-1 and us-west-2: every bundled AWS region's GPU types carry the
on-demand rate of the AWS Price List as skypilot-org/skypilot-catalog vendors it (catalogs/v8/aws/
vms.csv @00148f2a), each row naming it, or are listed in prices/unpriced.csv with why; `peerpods
select` ranks by those rates, not by estimates; scripts/make_catalogs.py takes a regional figure
only where the list's us-east-1 figure is the bundled one."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from adaptor.cli.main import main
from providers.core import snapshots
from tests.providers.catalog_script import make_catalogs

PRICES = Path(__file__).parents[2] / "providers" / "snapshots" / "prices"
LISTED = "skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv @00148f2a"


def test_select_in_eu_west_1_prints_list_prices_not_estimates(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["select", "--provider", "aws", "--region", "eu-west-1", "--gpus", "1"])
    out, err = capsys.readouterr()
    assert code == 0 and not err
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert rows and rows[0][1:3] == ["g4dn.xlarge", "0.5870"], out
    assert "~$" not in out and "estimate" not in out, out
    # Ireland's own rate, not N. Virginia's ($0.526)
    assert snapshots.load_catalog("aws", "us-east-1").by_name()["g4dn.xlarge"].price_per_hour == (
        0.526
    )


def test_every_aws_region_has_a_price_file_whose_rows_name_the_source() -> None:
    for region in snapshots.available_snapshots("aws"):
        path = PRICES / f"aws-{region}.csv"
        assert path.is_file(), region
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        if region in make_catalogs().AWS_PRICE_LIST_REGIONS:
            continue
        for row in rows:
            assert row["source"].startswith(LISTED) and row["source"].endswith(f", {region}")
            assert not row["spot_usd_per_hour"], "AWS publishes no Spot list price"


def test_regions_the_list_does_not_price_are_named_with_why() -> None:
    with (PRICES / "unpriced.csv").open(newline="") as handle:
        gaps = [r for r in csv.DictReader(handle) if r["cloud"] == "aws"]
    # the list vendors no rows for these regions at all: every GPU type there is a named gap
    for region in ("sa-east-1", "il-central-1", "eu-central-2", "ap-southeast-5"):
        catalog = snapshots.load_catalog("aws", region)
        gpu_types = {t.name for t in catalog.types if t.gpu and "on-demand" in t.provisioning}
        named = {r["instance_type"] for r in gaps if r["region"] == region}
        assert gpu_types and gpu_types == named, region
        assert all(
            f"no on-demand figure for the type in {region}" in r["why"]
            for r in gaps
            if r["region"] == region
        )


@pytest.mark.slow
def test_a_regional_figure_is_taken_only_where_the_lists_us_east_1_figure_is_ours() -> None:
    script = make_catalogs()
    row = script.SourceRow
    rows = {
        ("g5.xlarge", "il-central-1"): row((), 1.25, None),
        ("g5.xlarge", "us-east-1"): row((), 1.006, None),  # the bundled us-east-1 rate
        ("g5.2xlarge", "il-central-1"): row((), 1.5, None),
        ("g5.2xlarge", "us-east-1"): row((), 9.99, None),  # not ours: the figure is refused
    }
    made = script.aws_listed("il-central-1", rows)
    prices = {name: od for name, od, _, _ in made.price_rows}
    assert prices == {"g5.xlarge": 1.25}
    gaps = {name: why for name, _, why in made.gaps}
    assert "not the bundled one (1.212)" in gaps["g5.2xlarge"]
    assert "no on-demand figure for the type in il-central-1" in gaps["g5.4xlarge"]
    assert made.catalog.by_name()["g5.xlarge"].price_per_hour == 1.25
    assert made.catalog.by_name()["g5.2xlarge"].price_per_hour is None
