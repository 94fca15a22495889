"""The price sources' pages as pydantic models: what `price_sources` reads, and nothing it has
not checked.

Every page a price source answers is validated before a price is taken from it: objects where
objects belong, strings where strings belong, and every price a finite number from 0 to
MAX_USD_PER_HOUR (JSON's NaN and Infinity, which Python's json accepts, are refused while
parsing). A page that fails is a CatalogError of one line naming the source, the page and the
first field at fault. Fields the parser does not use are not modelled (and not checked).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from providers.core.errors import CatalogError

# No instance type costs more than this per hour (the largest list prices are a few hundred
# dollars); anything above is a broken page, not a price.
MAX_USD_PER_HOUR = 100_000.0

Usd = Annotated[float, Field(ge=0, le=MAX_USD_PER_HOUR, allow_inf_nan=False)]
M = TypeVar("M", bound=BaseModel)


class _Page(BaseModel):
    """Field names are the APIs' own (camelCase, PascalCase)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


# --- AWS Price List offer file -------------------------------------------------------------------


class AwsDimension(_Page):
    unit: str = ""
    pricePerUnit: dict[str, Usd] = {}


class AwsTerm(_Page):
    priceDimensions: dict[str, AwsDimension] = {}


class AwsSkuTerms(_Page):
    """The on-demand terms of one SKU (validated only for the SKUs that are read: the offer
    file lists a few hundred thousand, and validating each would double the refresh's time)."""

    terms: dict[str, AwsTerm]


class AwsSpotEntry(_Page):
    InstanceType: str = ""
    AvailabilityZone: str = ""
    SpotPrice: Usd | None = None
    Timestamp: Any = None  # a datetime from the SDK


class AwsSpotPage(_Page):
    SpotPriceHistory: list[AwsSpotEntry] = []
    NextToken: str = ""


# --- Azure Retail Prices ------------------------------------------------------------------------


class AzureItem(_Page):
    armSkuName: str = ""
    skuName: str = ""
    productName: str = ""
    retailPrice: Usd | None = None
    unitPrice: Usd | None = None
    unitOfMeasure: str = "1 Hour"

    @property
    def price(self) -> float | None:
        return self.retailPrice if self.retailPrice is not None else self.unitPrice


class AzurePage(_Page):
    Items: list[AzureItem]
    NextPageLink: str | None = None


def same_api(link: str, api: str, source: str) -> str:
    """`link` when it is an https URL on the host of `api`; a next-page link anywhere else (a
    link-local metadata address, another site) is a CatalogError, and is never requested."""
    try:
        to, own = urlsplit(link), urlsplit(api)
        same = to.scheme == "https" and to.hostname == own.hostname and to.port in (None, 443)
    except ValueError:
        same = False
    if not same:
        raise CatalogError(f"{source}: a next-page link leaves {urlsplit(api).hostname}")
    return link


# --- GCP Cloud Billing Catalog ------------------------------------------------------------------


class GcpMoney(_Page):
    units: int = Field(0, ge=0, le=int(MAX_USD_PER_HOUR))
    nanos: int = Field(0, ge=0, lt=1_000_000_000)

    @property
    def usd(self) -> float:
        return self.units + self.nanos / 1e9


class GcpRate(_Page):
    unitPrice: GcpMoney = GcpMoney()


class GcpExpression(_Page):
    tieredRates: list[GcpRate] = []


class GcpPricing(_Page):
    pricingExpression: GcpExpression = GcpExpression()


class GcpCategory(_Page):
    resourceGroup: str = ""
    usageType: str = ""


class GcpSku(_Page):
    description: str = ""
    category: GcpCategory = GcpCategory()
    serviceRegions: list[str] = []
    pricingInfo: list[GcpPricing] = []

    @property
    def unit_price(self) -> float | None:
        """USD per unit (hour, GiB-hour) of the current first tier's last rate, if any."""
        if not self.pricingInfo or not self.pricingInfo[0].pricingExpression.tieredRates:
            return None
        return self.pricingInfo[0].pricingExpression.tieredRates[-1].unitPrice.usd


class GcpPage(_Page):
    skus: list[GcpSku]
    nextPageToken: str = ""


# --- reading -------------------------------------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def strict_json(text: str, source: str) -> Any:
    """A JSON answer with NaN and Infinity refused; nesting too deep is a CatalogError."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise CatalogError(f"{source}: the answer is not JSON: nested too deeply") from None
    except ValueError as exc:
        raise CatalogError(f"{source}: the answer is not JSON: {exc}") from None


def page(model: type[M], raw: Any, source: str, where: str = "") -> M:
    """`raw` validated as `model`; a CatalogError naming the first field at fault."""
    if not isinstance(raw, Mapping):
        raise CatalogError(f"{source}{where}: the answer is not a JSON object")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error["loc"]) or "the page"
        raise CatalogError(f"{source}{where}: {field}: {error['msg']}") from None
