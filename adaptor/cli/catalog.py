"""`peerpods catalog refresh`: a catalog snapshot with instance types and prices, from the cloud.

Types come from the cloud's API (`--types live`, credentials needed) or from the bundled snapshot
(`--types snapshot`, to re-price it); prices from the cloud's public price source
(providers.clouds.price_sources: AWS Price List, Azure Retail Prices, GCP Cloud Billing Catalog). It
writes `<provider>-<region>.json` and `prices/<provider>-<region>.csv` under `--out`, which
`--catalog-dir` (or `PEERPODS_CATALOG_DIR`) then reads. Progress goes to stderr as a tqdm bar.
Exit status: 0 written; 1 a source failed or answered a page that does not validate (one line
on stderr, nothing written); 2 bad input (flags, a missing API key).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptor.cli import flags

if TYPE_CHECKING:
    from providers.core.catalog import Catalog, Cloud
    from providers.core.prices import Price


def configure(parser: argparse.ArgumentParser) -> None:
    """Add this subcommand's flags (from `CatalogRefreshSettings`)."""
    from adaptor.cli.settings import CatalogRefreshSettings

    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    refresh = sub.add_parser(
        "refresh",
        help="write a snapshot with types and prices from the cloud's public sources",
        description="Write <provider>-<region>.json and prices/<provider>-<region>.csv: "
        "instance types (live or the bundled snapshot) priced from the cloud's public source "
        "(AWS Price List, Azure Retail Prices, GCP Cloud Billing Catalog).",
    )
    flags.add_settings(refresh, CatalogRefreshSettings)


def _bar(args: argparse.Namespace, label: str) -> Any:
    if args.no_progress:
        return None
    from tqdm import tqdm

    return tqdm(desc=label, unit=" items", file=sys.stderr, leave=False)


def _ec2_client(region: str, client: Any) -> Any:
    """The EC2 client Spot prices are read with, or None (with a warning) without credentials."""
    if client is not None:
        return client
    try:
        import boto3

        session = boto3.Session(region_name=region)
        if session.get_credentials() is None:
            raise LookupError("no AWS credentials")
        return session.client("ec2")
    except Exception as exc:  # ImportError, LookupError, botocore errors: Spot prices are extra
        print(f"peerpods catalog refresh: no Spot prices ({exc})", file=sys.stderr)
        return None


def run(args: argparse.Namespace, *, session: Any = None, client: Any = None) -> int:
    """Refresh one snapshot. `session` (HTTP, for the price source) and `client` (the cloud SDK
    client: live types, and AWS Spot prices) are for tests."""
    from adaptor.cli.region import catalog_region
    from providers.clouds.price_sources import priced_catalog
    from providers.core.errors import CatalogError
    from providers.core.snapshots import DEFAULT_REGIONS, parse_cloud

    cloud = parse_cloud(args.provider)
    region = catalog_region(cloud, args.region) or DEFAULT_REGIONS[cloud]
    bar = _bar(args, f"{cloud} {region}")

    def progress(stage: str, advance: int) -> None:
        if bar is not None:
            bar.set_description(stage)
            bar.update(advance)

    try:
        catalog, rows = _types_and_prices(args, cloud, region, session, client, progress)
    except CatalogError as exc:
        # a source that failed or answered a bad page: one line, and nothing is written
        print(f"peerpods catalog refresh: {exc}", file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.close()
    priced = priced_catalog(catalog, rows)
    priced = priced.model_copy(update={"source": f"refresh: {catalog.source or 'live'} + prices"})
    _write(priced, Path(args.out), f"{cloud}-{region}")
    return 0


def _types_and_prices(
    args: argparse.Namespace,
    cloud: Cloud,
    region: str,
    session: Any,
    client: Any,
    progress: Callable[[str, int], None],
) -> tuple[Catalog, dict[str, Price]]:
    """The instance types (bundled or live) and their price rows from the public source."""
    from providers.clouds.price_sources import fetch_prices
    from providers.core.snapshots import load_live, load_snapshot

    if args.types == "snapshot":
        catalog = load_snapshot(cloud, region)
    elif client is not None:
        from providers.clouds.loaders import load

        catalog = load(cloud, region, client=client, progress=progress)
    else:
        catalog = load_live(cloud, region, progress=progress)
    ec2 = _ec2_client(region, client) if cloud == "aws" and args.aws_spot else None
    rows = fetch_prices(
        catalog,
        session=session,
        progress=progress,
        gcp_api_key=args.gcp_api_key.strip(),
        ec2_client=ec2,
    )
    return catalog, rows


def _write(priced: Catalog, out: Path, name: str) -> None:
    """The snapshot (replaced whole, never half written) and its price rows, then a summary."""
    from providers.core import prices
    from providers.core.snapshots import snapshot_json

    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(snapshot_json(priced))
    tmp.replace(path)
    written = prices.write_prices(priced, out / "prices" / f"{name}.csv")
    with_price = sum(1 for t in priced.types if t.price_per_hour is not None)
    with_spot = sum(1 for t in priced.types if t.spot_price_per_hour is not None)
    print(
        f"{path}: {len(priced.types)} types, {with_price} with an on-demand price, "
        f"{with_spot} with a Spot price ({written} price rows)"
    )
