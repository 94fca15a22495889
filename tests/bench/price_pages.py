"""What validating the price pages costs `catalog refresh`: a synthetic EC2 Price List offer
file of N products (a third of them Windows, skipped before their terms are validated) read by
`aws_prices` through a fake transport, and the same offer parsed as plain JSON for comparison.

    python tests/bench/price_pages.py [--products N] [--runs N]

Prints the offer's size, the median time of `aws_prices` and of `json.loads` alone, and the
share of the refresh the page models add over the parse.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import json
import statistics
import time
from typing import Any

import requests

from providers.clouds.price_sources import aws_prices
from tests.providers.fakes.http import FakeCloud, FakeResponse


def offer(products: int) -> bytes:
    listed: dict[str, Any] = {}
    terms: dict[str, Any] = {}
    for i in range(products):
        sku = f"SKU{i:08d}"
        listed[sku] = {
            "sku": sku,
            "productFamily": "Compute Instance",
            "attributes": {
                "instanceType": f"m{i % 500}.xlarge",
                "operatingSystem": "Windows" if i % 3 == 0 else "Linux",
                "tenancy": "Shared",
                "preInstalledSw": "NA",
                "capacitystatus": "Used",
                "location": "US East (N. Virginia)",
                "vcpu": "4",
                "memory": "16 GiB",
                "usagetype": "BoxUsage:m.xlarge",
                "operation": "RunInstances",
            },
        }
        dimension = {"unit": "Hrs", "pricePerUnit": {"USD": "0.1920000000"}, "appliesTo": []}
        terms[sku] = {
            f"{sku}.JRTCKXETXF": {
                "offerTermCode": "JRTCKXETXF",
                "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": dimension},
            }
        }
    document = {"formatVersion": "v1.0", "products": listed, "terms": {"OnDemand": terms}}
    return json.dumps(document).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    body = offer(args.products)
    fake = FakeCloud()
    fake.route("GET", r"/.*", lambda _request: FakeResponse(200, body))
    session = requests.Session()
    fake.mount_on(session)
    refresh, parse = [], []
    for _ in range(args.runs):
        start = time.perf_counter()
        rows = aws_prices("us-east-1", session=session)
        refresh.append(time.perf_counter() - start)
        start = time.perf_counter()
        json.loads(body)
        parse.append(time.perf_counter() - start)
    full, alone = statistics.median(refresh), statistics.median(parse)
    print(f"offer: {args.products} products, {len(body) / 1e6:.0f} MB, {len(rows)} types priced")
    print(f"aws_prices (fetch, strict parse, validation): median {full:.2f} s")
    print(f"json.loads alone:                             median {alone:.2f} s")
    print(f"beyond the parse: {full - alone:.2f} s ({(full - alone) / full:.0%} of the refresh)")


if __name__ == "__main__":
    main()
