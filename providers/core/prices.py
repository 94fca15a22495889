"""Known list prices, merged into catalogs so selection can rank cheapest first.

Prices live as CSV files `providers/snapshots/prices/<cloud>-<region>.csv` with the columns
`instance_type,usd_per_hour` and optionally `spot_usd_per_hour`. A cell left empty is a price
not known (a Spot-only type has no on-demand price; a type with no Spot offer no Spot price).
Rows named `gpu:<model id>` price one GPU attached to a machine type (GCP N1: the VM costs the
machine type plus its attached GPUs). Only published figures go there (docs/gpus.md names the
sources); a type without a price is ranked by an estimate from its GPUs (providers.core.estimates).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from providers.core.catalog import AttachableGpu, Catalog, InstanceType
from providers.core.errors import CatalogError

__all__ = [
    "GPU_ROW_PREFIX",
    "PRICES_DIR",
    "Price",
    "known_prices",
    "price_per_hour",
    "price_table",
    "with_prices",
    "write_prices",
]

PRICES_DIR = Path(__file__).resolve().parents[1] / "snapshots" / "prices"
GPU_ROW_PREFIX = "gpu:"
_COLUMNS = ("instance_type", "usd_per_hour", "spot_usd_per_hour")


@dataclass(frozen=True)
class Price:
    """One row: on-demand and Spot USD per hour, each None when not known."""

    on_demand: float | None = None
    spot: float | None = None


def _cell(value: str | None) -> float | None:
    """An empty cell is None; anything else must be a finite price >= 0 (ValueError if not)."""
    text = (value or "").strip()
    if not text:
        return None
    price = float(text)
    if not math.isfinite(price) or price < 0:
        raise ValueError(text)
    return price


def _read(path: Path) -> Mapping[str, Price]:
    table: dict[str, Price] = {}
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
                    price = Price(_cell(row["usd_per_hour"]), _cell(row.get("spot_usd_per_hour")))
                except ValueError:
                    name = ""
                if not name or (price.on_demand is None and price.spot is None):
                    raise CatalogError(f"{path}:{line}: not an instance type and a price")
                table[name] = price
    except OSError as exc:
        raise CatalogError(f"{path}: {exc.strerror or exc}") from exc
    return MappingProxyType(table)


def price_table(cloud: str, region: str, directory: Path | None = None) -> Mapping[str, Price]:
    """Every known row (types and `gpu:` rows) for one cloud region; empty when none."""
    path = (directory or PRICES_DIR) / f"{cloud}-{region}.csv"
    if not path.is_file():
        return MappingProxyType({})
    return _read(path)


def known_prices(cloud: str, region: str, directory: Path | None = None) -> Mapping[str, float]:
    """On-demand USD per hour by instance type for one cloud region; empty when none are known."""
    return MappingProxyType(
        {
            name: row.on_demand
            for name, row in price_table(cloud, region, directory).items()
            if row.on_demand is not None and not name.startswith(GPU_ROW_PREFIX)
        }
    )


def price_per_hour(
    cloud: str, region: str, instance_type: str, directory: Path | None = None
) -> float | None:
    """The known on-demand price of one type, or None."""
    row = price_table(cloud, region, directory).get(instance_type)
    return row.on_demand if row is not None else None


def _priced_gpu(gpu: AttachableGpu, table: Mapping[str, Price]) -> AttachableGpu:
    row = table.get(GPU_ROW_PREFIX + gpu.model)
    if row is None:
        return gpu
    update: dict[str, float] = {}
    if gpu.price_per_hour is None and row.on_demand is not None:
        update["price_per_hour"] = row.on_demand
    if gpu.spot_price_per_hour is None and row.spot is not None:
        update["spot_price_per_hour"] = row.spot
    return gpu.model_copy(update=update) if update else gpu


def _priced(t: InstanceType, table: Mapping[str, Price]) -> InstanceType:
    update: dict[str, object] = {}
    row = table.get(t.name)
    if row is not None:
        if t.price_per_hour is None and row.on_demand is not None:
            update["price_per_hour"] = row.on_demand
        if t.spot_price_per_hour is None and row.spot is not None:
            update["spot_price_per_hour"] = row.spot
    if t.attachable_gpus:
        gpus = tuple(_priced_gpu(g, table) for g in t.attachable_gpus)
        if gpus != t.attachable_gpus:
            update["attachable_gpus"] = gpus
    return t.model_copy(update=update) if update else t


def with_prices(catalog: Catalog, directory: Path | None = None) -> Catalog:
    """The catalog with known prices filled in where a type (or attachable GPU) has none yet."""
    table = price_table(catalog.cloud, catalog.region, directory)
    if not table:
        return catalog
    types = tuple(_priced(t, table) for t in catalog.types)
    gpu_prices = dict(catalog.gpu_prices)
    for name, row in table.items():
        model = name[len(GPU_ROW_PREFIX) :]
        if name.startswith(GPU_ROW_PREFIX) and row.on_demand is not None:
            gpu_prices.setdefault(model, row.on_demand)
    return catalog.model_copy(
        update={"types": types, "gpu_prices": dict(sorted(gpu_prices.items()))}
    )


def _text(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def write_prices(catalog: Catalog, path: Path) -> int:
    """Write a catalog's prices as a price CSV (atomically); returns the rows written."""
    rows: dict[str, Price] = {
        GPU_ROW_PREFIX + model: Price(price, None) for model, price in catalog.gpu_prices.items()
    }
    for t in catalog.types:
        if t.price_per_hour is not None or t.spot_price_per_hour is not None:
            rows[t.name] = Price(t.price_per_hour, t.spot_price_per_hour)
        for gpu in t.attachable_gpus:
            if gpu.price_per_hour is not None or gpu.spot_price_per_hour is not None:
                rows[GPU_ROW_PREFIX + gpu.model] = Price(
                    gpu.price_per_hour, gpu.spot_price_per_hour
                )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(_COLUMNS)
        for name in sorted(rows):
            writer.writerow((name, _text(rows[name].on_demand), _text(rows[name].spot)))
    tmp.replace(path)
    return len(rows)
