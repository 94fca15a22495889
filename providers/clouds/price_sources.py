"""Each cloud's public price source, read into `providers.core.prices.Price` rows for a catalog.

- AWS: the Price List bulk offer file for EC2 in one region
  (`https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/<region>/index.json`,
  no credentials): `products` by SKU with their attributes, `terms.OnDemand` by SKU with the hourly
  rate. Linux, shared tenancy, no pre-installed software, capacity status "Used" is the list price
  of a plain instance. AWS Spot is a market, not a list: its current price per zone comes from
  EC2's DescribeSpotPriceHistory (credentials needed), the cheapest zone's for each type.
- Azure: the Retail Prices API (`https://prices.azure.com/api/retail/prices`, no credentials),
  filtered to Virtual Machines consumption meters in the region, paged by `NextPageLink`. Linux
  meters are those whose product is not a Windows one; `... Spot` SKUs are the Spot price, `...
  Low Priority` ones are skipped.
- GCP: the Cloud Billing Catalog API (`https://cloudbilling.googleapis.com/v1/services/
  6F81-5844-456A/skus`, an API key), paged by `nextPageToken`. Compute Engine bills a machine
  type as vCPUs and memory of its series plus its GPUs, so a type's price is built from the
  series' "Instance Core" and "Instance Ram" SKUs and the GPU SKUs of the region, OnDemand and
  Preemptible (Spot) alike; an N1 type's attachable GPUs get `gpu:<model>` rows.

Every fetch goes through a `requests.Session` the caller may supply (tests mount a fake on it)
and reports each page to a progress callback. Every page is validated (`_price_pages`: shapes,
and prices finite from 0 to MAX_USD_PER_HOUR) before a price is taken from it; Azure's next-page
links are followed only to the API's own host. A malformed answer or an HTTP error is a
one-line CatalogError naming the source.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from providers.clouds._offer_stream import read_offer
from providers.clouds._price_pages import (
    AwsSkuTerms,
    AwsSpotPage,
    AzureItem,
    AzurePage,
    GcpPage,
    GcpSku,
    page,
    same_api,
    strict_json,
)
from providers.clouds.loaders import Progress, import_sdk, report
from providers.core.catalog import Catalog, InstanceType
from providers.core.errors import CatalogError, InvalidRequest
from providers.core.gpus import resolve_gpu
from providers.core.prices import GPU_ROW_PREFIX, Price

__all__ = [
    "AWS_OFFER_URL",
    "AZURE_PRICES_URL",
    "GCP_COMPUTE_SERVICE",
    "GCP_SKUS_URL",
    "aws_prices",
    "aws_spot_prices",
    "azure_prices",
    "fetch_prices",
    "gcp_prices",
    "priced_catalog",
]

log = logging.getLogger(__name__)

AWS_OFFER_URL = (
    "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/{region}/index.json"
)
AZURE_PRICES_URL = "https://prices.azure.com/api/retail/prices"
GCP_COMPUTE_SERVICE = "6F81-5844-456A"  # Compute Engine in the Cloud Billing Catalog
GCP_SKUS_URL = f"https://cloudbilling.googleapis.com/v1/services/{GCP_COMPUTE_SERVICE}/skus"
_TIMEOUT_SECONDS = 60
_STREAM_CHUNK = 1 << 20
_MAX_PAGES = 10_000


def _session(session: Any) -> Any:
    if session is not None:
        return session
    import requests

    return requests.Session()


def _get(session: Any, url: str, source: str, params: Mapping[str, str] | None = None) -> Any:
    """GET one JSON document; any failure is a CatalogError naming the source."""
    import requests

    try:
        response = session.get(url, params=params, timeout=_TIMEOUT_SECONDS)
    except requests.RequestException as exc:
        raise CatalogError(f"{source}: {exc}") from exc
    if response.status_code != 200:
        detail = " ".join(response.text[:200].split())
        raise CatalogError(f"{source}: HTTP {response.status_code}: {detail}")
    return strict_json(response.text, source)


# --- AWS ----------------------------------------------------------------------------------------

_AWS_PLAIN = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}


@contextlib.contextmanager
def _streamed(session: Any, url: str, source: str) -> Iterator[Iterator[bytes]]:
    """GET a document as a stream of chunks (`_STREAM_CHUNK` bytes); any failure, also one in
    the middle of the body, is a CatalogError naming the source."""
    import requests

    try:
        response = session.get(url, timeout=_TIMEOUT_SECONDS, stream=True)
    except requests.RequestException as exc:
        raise CatalogError(f"{source}: {exc}") from exc

    def chunks() -> Iterator[bytes]:
        try:
            yield from response.iter_content(chunk_size=_STREAM_CHUNK)
        except requests.RequestException as exc:
            raise CatalogError(f"{source}: {exc}") from exc

    try:
        if response.status_code != 200:
            head = next(response.iter_content(chunk_size=200), b"")
            detail = " ".join(head.decode("utf-8", "replace").split())
            raise CatalogError(f"{source}: HTTP {response.status_code}: {detail}")
        yield chunks()
    finally:
        response.close()


def _aws_instance_type(source: str) -> Callable[[str, Any], str | None]:
    """The instance type of an offer file product that is a plain Linux instance, else None."""

    def name(sku: str, product: Any) -> str | None:
        attributes = product.get("attributes") if isinstance(product, Mapping) else None
        if not isinstance(attributes, Mapping):
            raise CatalogError(f"{source}: products.{sku}: not an object with attributes")
        found = attributes.get("instanceType")
        if not isinstance(found, str) or not found:
            return None
        if any(attributes.get(k) != v for k, v in _AWS_PLAIN.items()):
            return None
        return found

    return name


def aws_prices(
    region: str, *, session: Any = None, progress: Progress | None = None
) -> dict[str, Price]:
    """On-demand Linux list prices by instance type from the EC2 Price List offer file, read as
    a stream (`_offer_stream`): the file is hundreds of MB, its parse as one document several
    GB."""
    source = f"AWS Price List ({region})"
    url = AWS_OFFER_URL.format(region=region)
    with _streamed(_session(session), url, source) as chunks:
        try:
            offer = read_offer(chunks, _aws_instance_type(source))
        except RecursionError:
            raise CatalogError(f"{source}: the answer is not JSON: nested too deeply") from None
        except ValueError as exc:
            raise CatalogError(f"{source}: the answer is not JSON: {exc}") from None
    if not offer.has_products or not offer.has_on_demand:
        raise CatalogError(f"{source}: no products/terms.OnDemand in the offer file")
    found: dict[str, Price] = {}
    for sku, name in offer.names.items():
        terms = offer.on_demand.get(sku) or {}
        listed = page(AwsSkuTerms, {"terms": terms}, source, f" SKU {sku}")
        for term in listed.terms.values():
            for dimension in term.priceDimensions.values():
                if dimension.unit != "Hrs":
                    continue
                price = dimension.pricePerUnit.get("USD")
                if price is not None and price > 0:
                    found[name] = Price(price, None)
    report(progress, "AWS Price List products", offer.products)
    return found


def aws_spot_prices(client: Any, *, progress: Progress | None = None) -> dict[str, float]:
    """The current Linux Spot price of each type in the client's region: the cheapest zone's
    latest `DescribeSpotPriceHistory` entry (StartTime now returns the price in effect)."""
    import datetime

    latest: dict[tuple[str, str], tuple[Any, float]] = {}
    request: dict[str, Any] = {
        "ProductDescriptions": ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
        "StartTime": datetime.datetime.now(datetime.UTC),
        "MaxResults": 1000,
    }
    for number in range(_MAX_PAGES):
        answer = page(
            AwsSpotPage,
            client.describe_spot_price_history(**request),
            "EC2 Spot price history",
            f" (page {number + 1})",
        )
        report(progress, "EC2 Spot price history", len(answer.SpotPriceHistory))
        for entry in answer.SpotPriceHistory:
            price, name = entry.SpotPrice, entry.InstanceType
            if price is None or not name:
                continue
            key = (name, entry.AvailabilityZone)
            stamp = entry.Timestamp
            known = latest.get(key)
            if known is None or (stamp is not None and known[0] is not None and stamp > known[0]):
                latest[key] = (stamp, price)
        if not answer.NextToken:
            break
        request["NextToken"] = answer.NextToken
    spot: dict[str, float] = {}
    for (name, _zone), (_stamp, price) in latest.items():
        spot[name] = min(spot.get(name, price), price)
    return spot


# --- Azure --------------------------------------------------------------------------------------


def _has_list(raw: Any, key: str, source: str) -> None:
    """A page of a paged price API must hold its item list under `key`."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get(key), list):
        raise CatalogError(f"{source}: no {key} in the answer")


def _azure_items(session: Any, region: str, progress: Progress | None) -> Iterator[AzureItem]:
    source = f"Azure Retail Prices ({region})"
    query = (
        f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' "
        "and priceType eq 'Consumption'"
    )
    url: str | None = AZURE_PRICES_URL
    params: dict[str, str] | None = {"$filter": query, "currencyCode": "USD"}
    for number in range(_MAX_PAGES):
        if url is None:
            return
        raw = _get(session, url, source, params)
        _has_list(raw, "Items", source)
        answer = page(AzurePage, raw, source, f" (page {number + 1})")
        report(progress, "Azure Retail Prices", len(answer.Items))
        yield from answer.Items
        link = answer.NextPageLink
        url = same_api(link, AZURE_PRICES_URL, source) if link else None
        params = None
    raise CatalogError(f"{source}: more than {_MAX_PAGES} pages")


def azure_prices(
    region: str, *, session: Any = None, progress: Progress | None = None
) -> dict[str, Price]:
    """Linux pay-as-you-go and Spot prices by VM size from the Azure Retail Prices API."""
    on_demand: dict[str, float] = {}
    spot: dict[str, float] = {}
    for item in _azure_items(_session(session), region, progress):
        size, sku_name, product, price = item.armSkuName, item.skuName, item.productName, item.price
        if not size or price is None or price == 0 or "Windows" in product:
            continue
        if item.unitOfMeasure != "1 Hour" or "Low Priority" in sku_name:
            continue
        table = spot if sku_name.endswith("Spot") else on_demand
        table[size] = min(table.get(size, price), price)
    return {
        size: Price(on_demand.get(size), spot.get(size)) for size in sorted({*on_demand, *spot})
    }


# --- GCP ----------------------------------------------------------------------------------------

_SPOT_PREFIX = r"^(?:Spot )?(?:Preemptible )?"
_GPU_SKU = re.compile(_SPOT_PREFIX + r"Nvidia (?P<model>.+?) GPU running in", re.IGNORECASE)
_SERIES_SKU = re.compile(
    _SPOT_PREFIX + r"(?P<series>[A-Z][A-Z0-9]*) (?:Predefined )?Instance (?P<what>Core|Ram) "
    r"running in"
)
_NOT_LIST = ("Custom", "Sole Tenancy", "Commitment", "DWS", "Calendar", "Reserved", "Extended")


def _gcp_skus(session: Any, key: str, progress: Progress | None) -> Iterator[GcpSku]:
    source = "GCP Cloud Billing Catalog"
    token = ""
    for number in range(_MAX_PAGES):
        params = {"key": key, "pageSize": "5000", "currencyCode": "USD"}
        if token:
            params["pageToken"] = token
        raw = _get(session, GCP_SKUS_URL, source, params)
        _has_list(raw, "skus", source)
        answer = page(GcpPage, raw, source, f" (page {number + 1})")
        report(progress, "Cloud Billing Catalog SKUs", len(answer.skus))
        yield from answer.skus
        token = answer.nextPageToken
        if not token:
            return
    raise CatalogError(f"{source}: more than {_MAX_PAGES} pages")


def gcp_prices(
    catalog: Catalog,
    *,
    api_key: str,
    session: Any = None,
    progress: Progress | None = None,
) -> dict[str, Price]:
    """Prices of the catalog's machine types (series vCPU and RAM, plus bundled GPUs) and of
    the GPUs N1 types attach, OnDemand and Spot, from the Cloud Billing Catalog."""
    if not api_key:
        raise InvalidRequest("gcp: the Cloud Billing Catalog needs an API key (--gcp-api-key)")
    series: dict[tuple[str, str, str], float] = {}  # (series, Core|Ram, usage) -> USD
    gpus: dict[tuple[str, str], float] = {}  # (model id, usage) -> USD per GPU-hour
    for sku in _gcp_skus(_session(session), api_key, progress):
        if catalog.region not in sku.serviceRegions:
            continue
        usage = sku.category.usageType
        if usage not in ("OnDemand", "Preemptible"):
            continue
        description = sku.description
        if any(word in description for word in _NOT_LIST):
            continue
        price = sku.unit_price
        if price is None:
            continue
        gpu = _GPU_SKU.match(description)
        if gpu and sku.category.resourceGroup == "GPU":
            try:
                model = resolve_gpu(gpu.group("model")).id
            except InvalidRequest:
                continue
            gpus.setdefault((model, usage), price)
            continue
        found = _SERIES_SKU.match(description)
        if found:
            series.setdefault((found.group("series").lower(), found.group("what"), usage), price)
    rows: dict[str, Price] = {
        GPU_ROW_PREFIX + model: Price(price, gpus.get((model, "Preemptible")))
        for (model, usage), price in sorted(gpus.items())
        if usage == "OnDemand"
    }
    for t in catalog.types:
        on_demand = _gcp_type_price(t, series, gpus, "OnDemand")
        spot = _gcp_type_price(t, series, gpus, "Preemptible")
        if on_demand is not None or spot is not None:
            rows[t.name] = Price(on_demand, spot)
        for a in t.attachable_gpus:
            row = Price(gpus.get((a.model, "OnDemand")), gpus.get((a.model, "Preemptible")))
            if row.on_demand is not None or row.spot is not None:
                rows[GPU_ROW_PREFIX + a.model] = row
    return rows


def _gcp_type_price(
    t: InstanceType,
    series: Mapping[tuple[str, str, str], float],
    gpus: Mapping[tuple[str, str], float],
    usage: str,
) -> float | None:
    core = series.get((t.family, "Core", usage))
    ram = series.get((t.family, "Ram", usage))
    if core is None or ram is None:
        return None
    price = t.vcpus * core + t.memory_mib / 1024 * ram
    if t.gpu is not None:
        gpu = gpus.get((t.gpu.model, usage))
        if gpu is None:
            return None
        price += t.gpu.count * gpu
    return round(price, 6)


# --- all ----------------------------------------------------------------------------------------


def fetch_prices(
    catalog: Catalog,
    *,
    session: Any = None,
    progress: Progress | None = None,
    gcp_api_key: str = "",
    ec2_client: Any = None,
) -> dict[str, Price]:
    """The cloud's public prices for this catalog's region (AWS Spot prices when an EC2 client
    for the region is given)."""
    if catalog.cloud == "aws":
        rows = aws_prices(catalog.region, session=session, progress=progress)
        if ec2_client is None:
            return rows
        botocore = import_sdk("botocore.exceptions", "aws")
        try:
            spot = aws_spot_prices(ec2_client, progress=progress)
        except (botocore.BotoCoreError, botocore.ClientError) as exc:
            log.warning("aws %s: no Spot prices: %s", catalog.region, exc)
            return rows
        known = {t.name for t in catalog.types}
        return {
            name: Price(rows.get(name, Price()).on_demand, spot.get(name))
            for name in sorted({*rows, *(n for n in spot if n in known)})
        }
    if catalog.cloud == "azure":
        return azure_prices(catalog.region, session=session, progress=progress)
    return gcp_prices(catalog, api_key=gcp_api_key, session=session, progress=progress)


def priced_catalog(catalog: Catalog, rows: Mapping[str, Price]) -> Catalog:
    """The catalog with these prices set (replacing any it had), types without a row unpriced."""
    gpu_prices = {
        name[len(GPU_ROW_PREFIX) :]: row.on_demand
        for name, row in rows.items()
        if name.startswith(GPU_ROW_PREFIX) and row.on_demand is not None
    }
    types = []
    for t in catalog.types:
        row = rows.get(t.name, Price())
        update: dict[str, object] = {
            "price_per_hour": row.on_demand,
            "spot_price_per_hour": row.spot,
        }
        if t.attachable_gpus:
            update["attachable_gpus"] = tuple(
                a.model_copy(
                    update={
                        "price_per_hour": rows.get(GPU_ROW_PREFIX + a.model, Price()).on_demand,
                        "spot_price_per_hour": rows.get(GPU_ROW_PREFIX + a.model, Price()).spot,
                    }
                )
                for a in t.attachable_gpus
            )
        types.append(t.model_copy(update=update))
    return catalog.model_copy(update={"types": tuple(types), "gpu_prices": gpu_prices})
