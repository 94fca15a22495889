"""Known on-demand list prices, merged into catalogs so selection can rank cheapest first.

Prices live as CSV files `providers/snapshots/prices/<cloud>-<region>.csv` with the columns
`instance_type,usd_per_hour`. Only published figures go there; a type without a row has no known
price (None) and selection falls back to ranking by size.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from providers.catalog import Catalog
from providers.errors import CatalogError

__all__ = ["PRICES_DIR", "known_prices", "price_per_hour", "with_prices"]

PRICES_DIR = Path(__file__).resolve().parent / "snapshots" / "prices"


@functools.cache
def _read(path: Path) -> Mapping[str, float]:
    prices: dict[str, float] = {}
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None or not {"instance_type", "usd_per_hour"} <= set(
                reader.fieldnames
            ):
                raise CatalogError(f"{path}: needs the columns instance_type,usd_per_hour")
            for line, row in enumerate(reader, start=2):
                name = (row["instance_type"] or "").strip()
                try:
                    price = float(row["usd_per_hour"])
                except (TypeError, ValueError):
                    price = math.nan
                if not name or not math.isfinite(price) or price < 0:
                    raise CatalogError(f"{path}:{line}: not an instance type and a price")
                prices[name] = price
    except OSError as exc:
        raise CatalogError(f"{path}: {exc.strerror or exc}") from exc
    return MappingProxyType(prices)


def known_prices(cloud: str, region: str, directory: Path | None = None) -> Mapping[str, float]:
    """USD per hour by instance type for one cloud region; empty when none are known."""
    path = (directory or PRICES_DIR) / f"{cloud}-{region}.csv"
    if not path.is_file():
        return MappingProxyType({})
    return _read(path)


def price_per_hour(
    cloud: str, region: str, instance_type: str, directory: Path | None = None
) -> float | None:
    """The known on-demand price of one type, or None."""
    return known_prices(cloud, region, directory).get(instance_type)


def with_prices(catalog: Catalog, directory: Path | None = None) -> Catalog:
    """The catalog with known prices filled in where a type has none yet."""
    prices = known_prices(catalog.cloud, catalog.region, directory)
    if not prices:
        return catalog
    types = tuple(
        t.model_copy(update={"price_per_hour": prices[t.name]})
        if t.price_per_hour is None and t.name in prices
        else t
        for t in catalog.types
    )
    return catalog.model_copy(update={"types": types})
