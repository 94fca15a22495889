"""`peerpods catalog refresh`: types plus each cloud's public prices, through fake transports.

The price sources answer from recorded response shapes (tests/providers/fakes/data/prices/):
the EC2 Price List offer file, Azure Retail Prices pages, Cloud Billing Catalog SKU pages. The
expected figures are the clouds' published list prices those recordings carry (AWS us-east-1
p5.4xlarge $6.88/h, Azure eastus ND96isr_H100_v5 $98.32/h, GCP us-central1 N1 vCPU $0.031611/h
and GiB $0.004237/h, A100 40GB $2.933908/h, T4 $0.35/h).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests

from adaptor.cli.main import main
from providers.clouds.price_sources import azure_prices, fetch_prices, gcp_prices
from providers.core import prices, snapshots
from providers.core.catalog import Catalog
from providers.core.errors import CatalogError
from tests.providers.fakes.http import FakeCloud, PageToken

DATA = Path(__file__).resolve().parent / "fakes" / "data" / "prices"
AWS_OFFER = r"/offers/v1\.0/aws/AmazonEC2/current/us-east-1/index\.json"
AZURE_PRICES = r"/api/retail/prices"
GCP_SKUS = r"/v1/services/6F81-5844-456A/skus"


def _recorded(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def _session(fake: FakeCloud) -> requests.Session:
    session = requests.Session()
    fake.mount_on(session)
    return session


def _fake() -> FakeCloud:
    fake = FakeCloud()
    fake.reply("GET", AWS_OFFER, _recorded("aws-offer-us-east-1.json"))
    azure = PageToken(param="$skiptoken", field="NextPageLink", absolute=True)
    fake.pages("GET", AZURE_PRICES, _recorded("azure-retail-eastus.json")["pages"], azure)
    gcp = PageToken(param="pageToken", field="nextPageToken")
    fake.pages("GET", GCP_SKUS, _recorded("gcp-billing-skus.json")["pages"], gcp)
    return fake


def _refresh(
    monkeypatch: pytest.MonkeyPatch, fake: FakeCloud, out: Path, *argv: str
) -> tuple[int, Catalog]:
    import adaptor.cli.catalog as cli

    real_run = cli.run
    monkeypatch.setattr(cli, "run", lambda args: real_run(args, session=_session(fake)))
    code = main(["catalog", "refresh", "--types", "snapshot", "--out", str(out), *argv])
    provider = argv[argv.index("--provider") + 1]
    region = snapshots.DEFAULT_REGIONS[provider]
    written = Catalog.model_validate_json((out / f"{provider}-{region}.json").read_text())
    return code, written


def test_aws_refresh_writes_types_and_price_list_prices(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, written = _refresh(monkeypatch, _fake(), tmp_path, "--provider", "aws", "--no-aws-spot")
    assert code == 0
    by = written.by_name()
    # Linux, shared tenancy, no software, "Used" capacity: the list price; Windows, Dedicated
    # and capacity-reservation products are other prices of the same type.
    assert by["p5.4xlarge"].price_per_hour == 6.88
    assert by["g6.xlarge"].price_per_hour == 0.8048
    assert by["p5e.48xlarge"].price_per_hour is None  # a zero rate is no price
    assert by["m7i.large"].price_per_hour is None  # not in the (trimmed) offer file
    assert len(written.types) == len(snapshots.load_snapshot("aws", "us-east-1").types)
    table = prices.known_prices("aws", "us-east-1", tmp_path / "prices")
    assert table == {"g6.xlarge": 0.8048, "p5.4xlarge": 6.88}
    captured = capsys.readouterr()
    assert "2 with an on-demand price" in captured.out
    assert "AWS Price List" in captured.err  # the progress bar's stage
    # the written snapshot is what --catalog-dir reads
    assert snapshots.load_snapshot("aws", "us-east-1", tmp_path).by_name()["p5.4xlarge"]


def test_aws_spot_prices_come_from_the_spot_price_history(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import boto3
    from moto import mock_aws

    import adaptor.cli.catalog as cli

    real_run = cli.run
    fake = _fake()
    with mock_aws():
        ec2 = boto3.client(
            "ec2", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
        )
        history = ec2.describe_spot_price_history(InstanceTypes=["p5.4xlarge"])
        moto_price = min(float(e["SpotPrice"]) for e in history["SpotPriceHistory"])
        monkeypatch.setattr(
            cli, "run", lambda args: real_run(args, session=_session(fake), client=ec2)
        )
        argv = ["--types", "snapshot", "--out", str(tmp_path), "--no-progress"]
        assert main(["catalog", "refresh", "--provider", "aws", *argv]) == 0
    written = snapshots.load_snapshot("aws", "us-east-1", tmp_path).by_name()["p5.4xlarge"]
    # the Price List's on-demand rate, and the cheapest zone's Spot price EC2 reports
    assert (written.price_per_hour, written.spot_price_per_hour) == (6.88, moto_price)
    row = prices.price_table("aws", "us-east-1", tmp_path / "prices")["p5.4xlarge"]
    assert row == prices.Price(6.88, moto_price)


def test_azure_refresh_reads_every_page_linux_and_spot(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = _fake()
    code, written = _refresh(monkeypatch, fake, tmp_path, "--provider", "azure", "--no-progress")
    assert code == 0
    h100 = written.by_name()["Standard_ND96isr_H100_v5"]
    assert (h100.price_per_hour, h100.spot_price_per_hour) == (98.32, 29.496)  # not Windows
    a100 = written.by_name()["Standard_NC24ads_A100_v4"]
    assert (a100.price_per_hour, a100.spot_price_per_hour) == (3.673, 0.5142)  # not Low Priority
    asked = fake.seen("GET", AZURE_PRICES)
    assert len(asked) == 2 and "armRegionName eq 'eastus'" in asked[0].query["$filter"]


def test_gcp_refresh_builds_machine_plus_gpu_prices(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = _fake()
    code, written = _refresh(
        monkeypatch, fake, tmp_path, "--provider", "gcp", "--gcp-api-key", "k", "--no-progress"
    )
    assert code == 0
    by = written.by_name()
    # n1-standard-4: 4 vCPUs and 15 GiB at the N1 rates of the region (not EMEA's)
    assert by["n1-standard-4"].price_per_hour == pytest.approx(4 * 0.031611 + 15 * 0.004237)
    assert by["n1-standard-4"].spot_price_per_hour == pytest.approx(4 * 0.00698 + 15 * 0.000936)
    # a2-highgpu-1g: 12 vCPUs, 85 GiB and one A100 40GB = GCP's $3.673385/h list price
    assert by["a2-highgpu-1g"].price_per_hour == pytest.approx(3.673385, abs=1e-5)
    # N1 attaches GPUs: priced per GPU (not the DWS Flex-start rate), Spot too
    t4 = next(a for a in by["n1-standard-4"].attachable_gpus if a.model == "t4")
    assert (t4.price_per_hour, t4.spot_price_per_hour) == (0.35, 0.14)
    table = prices.price_table("gcp", "us-central1", tmp_path / "prices")
    assert table["gpu:t4"] == prices.Price(0.35, 0.14)
    assert all(r.query["key"] == "k" for r in fake.seen("GET", GCP_SKUS))


def test_gcp_needs_an_api_key_and_http_errors_are_catalog_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    catalog = snapshots.load_snapshot("gcp", "us-central1")
    assert main(["catalog", "refresh", "--provider", "gcp", "--types", "snapshot"]) == 2
    assert "API key" in capsys.readouterr().err
    broken = FakeCloud()
    broken.reply("GET", GCP_SKUS, {"error": {"code": 403, "message": "API key not valid"}}, 403)
    with pytest.raises(CatalogError, match="HTTP 403"):
        gcp_prices(catalog, api_key="bad", session=_session(broken))
    garbage = FakeCloud()
    garbage.reply("GET", AZURE_PRICES, {"unexpected": True})
    garbage.reply("GET", AWS_OFFER, {"unexpected": True})
    with pytest.raises(CatalogError, match="no Items"):
        azure_prices("eastus", session=_session(garbage))
    with pytest.raises(CatalogError, match="no products"):
        fetch_prices(snapshots.load_snapshot("aws", "us-east-1"), session=_session(garbage))
