"""`catalog refresh` against hostile price sources: malformed pages, prices that are not finite
or out of bounds, and a next-page link to another host are each one line and exit 1 with
nothing written; the link is never followed."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import requests

from adaptor.cli.main import main
from providers.clouds.price_sources import azure_prices, fetch_prices, gcp_prices
from providers.core import snapshots
from providers.core.errors import CatalogError
from tests.providers.fakes.http import FakeCloud, FakeResponse, PageToken

DATA = Path(__file__).resolve().parent / "fakes" / "data" / "prices"
AWS_OFFER = r"/offers/v1\.0/aws/AmazonEC2/current/us-east-1/index\.json"
AZURE_PRICES = r"/api/retail/prices"
GCP_SKUS = r"/v1/services/6F81-5844-456A/skus"
METADATA = "http://169.254.169.254/metadata/instance?api-version=2021-02-01"


def _recorded(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def _session(fake: FakeCloud) -> requests.Session:
    session = requests.Session()
    fake.mount_on(session)
    return session


def _raw(fake: FakeCloud, pattern: str, text: str) -> None:
    body = text.encode()
    fake.route("GET", pattern, lambda _r: FakeResponse(200, body, {"Content-Type": "x/json"}))


def _azure_page(**changes: Any) -> dict[str, Any]:
    page = copy.deepcopy(_recorded("azure-retail-eastus.json")["pages"][0])
    item = page["Items"][0]
    for key, value in changes.items():
        if key == "Items":
            page["Items"] = value
        elif key == "NextPageLink":
            page["NextPageLink"] = value
        else:
            item[key] = value
    return page


AZURE_BAD = {
    "Infinity price": (_azure_page(retailPrice=float("inf")), "Infinity is not a JSON number"),
    "NaN price": (_azure_page(unitPrice=float("nan"), retailPrice=None), "NaN"),
    "Infinity as text": (_azure_page(retailPrice="Infinity"), "retailPrice"),
    "negative price": (_azure_page(retailPrice=-0.5), "greater than or equal to 0"),
    "absurd price": (_azure_page(retailPrice=1e12), "less than or equal to 100000"),
    "item not an object": (_azure_page(Items=["x"]), "Items.0"),
    "size not a string": (_azure_page(armSkuName=["a"]), "armSkuName"),
    "link not a string": (_azure_page(NextPageLink=7), "NextPageLink"),
    "page not an object": ([1, 2], "no Items"),
}


@pytest.mark.parametrize("case", sorted(AZURE_BAD))
def test_bad_azure_pages_are_one_line_catalog_errors(case: str) -> None:
    body, message = AZURE_BAD[case]
    fake = FakeCloud()
    fake.reply("GET", AZURE_PRICES, body)
    with pytest.raises(CatalogError, match=message) as caught:
        azure_prices("eastus", session=_session(fake))
    assert "\n" not in str(caught.value) and str(caught.value).startswith("Azure Retail Prices")


def test_deeply_nested_and_non_json_answers_are_catalog_errors() -> None:
    fake = FakeCloud()
    _raw(fake, AZURE_PRICES, '{"Items": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(CatalogError, match="nested too deeply"):
        azure_prices("eastus", session=_session(fake))
    _raw(fake, AZURE_PRICES, "<html>")
    with pytest.raises(CatalogError, match="not JSON"):
        azure_prices("eastus", session=_session(fake))


def _gcp_page(**changes: Any) -> dict[str, Any]:
    page = copy.deepcopy(_recorded("gcp-billing-skus.json")["pages"][0])
    sku = page["skus"][0]
    money = sku["pricingInfo"][0]["pricingExpression"]["tieredRates"][-1]["unitPrice"]
    for key, value in changes.items():
        if key in ("units", "nanos"):
            money[key] = value
        else:
            sku[key] = value
    page.pop("nextPageToken", None)
    return page


GCP_BAD = {
    "units Infinity": (_gcp_page(units="Infinity"), "units"),
    "huge units": (_gcp_page(units="9" * 5000), "units"),
    "negative nanos": (_gcp_page(nanos=-1), "nanos"),
    "regions not a list": (_gcp_page(serviceRegions=5), "serviceRegions"),
    "category not an object": (_gcp_page(category="GPU"), "category"),
}


@pytest.mark.parametrize("case", sorted(GCP_BAD))
def test_bad_gcp_pages_are_one_line_catalog_errors(case: str) -> None:
    body, message = GCP_BAD[case]
    fake = FakeCloud()
    fake.reply("GET", GCP_SKUS, body)
    catalog = snapshots.load_snapshot("gcp", "us-central1")
    with pytest.raises(CatalogError, match=message) as caught:
        gcp_prices(catalog, api_key="k", session=_session(fake))
    assert "\n" not in str(caught.value)


def _aws_offer(change: str) -> dict[str, Any]:
    offer = copy.deepcopy(_recorded("aws-offer-us-east-1.json"))
    sku = next(iter(offer["terms"]["OnDemand"]))
    if change == "product":
        offer["products"][sku] = ["not", "an", "object"]
    elif change == "terms":
        offer["terms"]["OnDemand"] = "none"
    elif change == "price":
        for term in offer["terms"]["OnDemand"][sku].values():
            for dimension in term["priceDimensions"].values():
                dimension["pricePerUnit"]["USD"] = "NaN"
    return offer


@pytest.mark.parametrize(
    ("change", "message"),
    [("product", "products"), ("terms", "terms.OnDemand"), ("price", "pricePerUnit.USD")],
)
def test_bad_aws_offer_files_are_one_line_catalog_errors(change: str, message: str) -> None:
    fake = FakeCloud()
    fake.reply("GET", AWS_OFFER, _aws_offer(change))
    with pytest.raises(CatalogError, match=message) as caught:
        fetch_prices(snapshots.load_snapshot("aws", "us-east-1"), session=_session(fake))
    assert "\n" not in str(caught.value)


def _refresh(monkeypatch: pytest.MonkeyPatch, fake: FakeCloud, out: Path) -> int:
    import adaptor.cli.catalog as cli

    real_run = cli.run
    monkeypatch.setattr(cli, "run", lambda args: real_run(args, session=_session(fake)))
    return main(
        ["catalog", "refresh", "--types", "snapshot", "--out", str(out), "--provider", "azure",
         "--no-progress"]
    )  # fmt: skip


@pytest.mark.parametrize(
    "link",
    [
        METADATA,
        "https://169.254.169.254/api/retail/prices?$skiptoken=1",
        "http://prices.azure.com/api/retail/prices?$skiptoken=1",
        "https://prices.azure.com.example.org/api/retail/prices",
        "https://prices.azure.com:8443/api/retail/prices",
    ],
)
def test_a_next_page_link_to_another_host_is_never_followed(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    link: str,
) -> None:
    fake = FakeCloud()
    fake.route("GET", r"/.*", lambda _r: FakeResponse(200, {"Items": []}))  # any other host
    fake.reply("GET", AZURE_PRICES, _azure_page(NextPageLink=link))
    code = _refresh(monkeypatch, fake, tmp_path / "out")
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert "a next-page link leaves prices.azure.com" in err
    assert [r.url for r in fake.requests if "prices.azure.com/" not in r.url] == []
    assert len(fake.requests) == 1
    assert not (tmp_path / "out").exists()


def test_a_bad_page_through_the_cli_is_exit_1_and_nothing_written(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fake = FakeCloud()
    azure = PageToken(param="$skiptoken", field="NextPageLink", absolute=True)
    good = _recorded("azure-retail-eastus.json")["pages"][0]
    fake.pages("GET", AZURE_PRICES, [good, _azure_page(retailPrice=float("inf"))], azure)
    code = _refresh(monkeypatch, fake, tmp_path / "out")
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "Infinity" in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()
