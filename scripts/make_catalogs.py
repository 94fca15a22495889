"""Write the bundled catalog snapshots under providers/snapshots/ with the real loaders.

AWS snapshots come from the AWS loader run against moto, whose bundled DescribeInstanceTypes and
offerings data is real AWS data; Azure and GCP snapshots from their loaders fed, through the SDKs'
own HTTP transports, the recorded responses in tests/providers/fakes/data/. Known prices are
merged by the loaders. Usage: python scripts/make_catalogs.py [--out DIR] [NAME ...]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from providers.core import prices  # noqa: E402
from providers.core.catalog import Catalog, InstanceType  # noqa: E402
from providers.core.errors import PeerpodsError  # noqa: E402
from providers.core.snapshots import snapshot_json  # noqa: E402

# Every region of moto's AWS data that offers a GPU type (ap-south-2, ap-southeast-4 and
# ca-west-1 offer none there).
AWS_REGIONS = (
    "af-south-1",
    "ap-east-1",
    "ap-northeast-1",
    "ap-northeast-2",
    "ap-northeast-3",
    "ap-south-1",
    "ap-southeast-1",
    "ap-southeast-2",
    "ap-southeast-3",
    "ap-southeast-5",
    "ca-central-1",
    "eu-central-1",
    "eu-central-2",
    "eu-north-1",
    "eu-south-1",
    "eu-south-2",
    "eu-west-1",
    "eu-west-2",
    "eu-west-3",
    "il-central-1",
    "me-central-1",
    "me-south-1",
    "sa-east-1",
    "us-east-1",
    "us-east-2",
    "us-west-1",
    "us-west-2",
)
AZURE_REGIONS = ("eastus",)
GCP_REGIONS = ("us-central1",)


def aws(region: str) -> Catalog:
    import boto3
    import moto
    from moto import mock_aws

    from providers.clouds.loaders import aws as loader

    with mock_aws():
        client = boto3.client(
            "ec2", region_name=region, aws_access_key_id="snapshot", aws_secret_access_key="x"
        )
        catalog = loader.load_catalog(region, client=client)
        extra = _aws_supplement(client, region)
    if extra:
        merged = {t.name: t for t in catalog.types}
        merged.update((t.name, t) for t in extra)
        types = tuple(merged[name] for name in sorted(merged))
        catalog = prices.with_prices(catalog.model_copy(update={"types": types}))
    return catalog.model_copy(update={"source": f"snapshot: moto {moto.__version__} AWS data"})


def _aws_supplement(client: Any, region: str) -> list[InstanceType]:
    """Types moto's data lacks in `region`, from recorded DescribeInstanceTypes and offerings
    responses (tests/providers/fakes/data/aws-<region>-supplement.json)."""
    from providers.clouds.loaders import aws as loader

    path = ROOT / "tests" / "providers" / "fakes" / "data" / f"aws-{region}-supplement.json"
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    zones: dict[str, list[str]] = {}
    for offering in data.get("InstanceTypeOfferings", []):
        zones.setdefault(offering["InstanceType"], []).append(offering["Location"])
    recorded = {raw["InstanceType"]: raw for raw in data.get("InstanceTypes", [])}
    known = [name for name in zones if name not in recorded]
    if known:  # described by moto's AWS data, offered here per the recorded offerings
        for raw in client.describe_instance_types(InstanceTypes=known)["InstanceTypes"]:
            recorded[raw["InstanceType"]] = raw
    found = []
    for name, raw in recorded.items():
        parsed = loader.instance_type(raw, tuple(sorted(zones.get(name, ()))))
        if parsed is not None and parsed.zones:
            found.append(parsed)
    return found


def azure(region: str) -> Catalog:
    from providers.clouds.loaders import azure as loader
    from tests.providers.fakes.azure import compute_client, recorded_skus, serve_skus
    from tests.providers.fakes.http import FakeCloud

    fake = FakeCloud()
    serve_skus(fake, recorded_skus(region))
    catalog = loader.load_catalog(region, client=compute_client(fake))
    return catalog.model_copy(update={"source": "snapshot: recorded resource SKUs"})


def gcp(region: str) -> Catalog:
    from providers.clouds.loaders import gcp as loader
    from tests.providers.fakes.gcp import PROJECT, recorded, serve_recorded
    from tests.providers.fakes.gcp import clients as gcp_clients
    from tests.providers.fakes.http import FakeCloud

    fake = FakeCloud()
    serve_recorded(fake, recorded(region))
    catalog = loader.load_catalog(region, client=gcp_clients(fake), project=PROJECT)
    return catalog.model_copy(update={"source": "snapshot: recorded machine/accelerator types"})


def makers() -> dict[str, Callable[[], Catalog]]:
    """Snapshot name -> how to make it."""
    found: dict[str, Callable[[], Catalog]] = {}
    for cloud, regions, make in (
        ("aws", AWS_REGIONS, aws),
        ("azure", AZURE_REGIONS, azure),
        ("gcp", GCP_REGIONS, gcp),
    ):
        for region in regions:
            found[f"{cloud}-{region}"] = functools.partial(make, region)
    return found


def dumps(catalog: Catalog) -> str:
    """JSON with one instance type per line (defaults left out), so snapshots diff well."""
    return snapshot_json(catalog)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="snapshots to write (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "providers" / "snapshots")
    args = parser.parse_args(argv)
    known = makers()
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"unknown snapshot {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or list(known):
        try:
            catalog = known[name]()
        except PeerpodsError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
        text = dumps(catalog)
        Catalog.model_validate_json(text)  # what is written must load back
        path = args.out / f"{name}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        gpus = sum(1 for t in catalog.types if t.gpu or t.attachable_gpus)
        print(
            f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: "
            f"{len(catalog.types)} types, {gpus} with GPUs"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
