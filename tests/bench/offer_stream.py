"""Peak memory of `catalog refresh` reading the EC2 offer file: streamed (aws_prices now) against
the whole document parsed at once (as aws_prices did before), on a synthetic offer file.

    python tests/bench/offer_stream.py [--size-mib N] [--old-size-mib N] [--old-full]

The largest regional offer file (us-east-1) is assumed to be about 450 MB (a public report of
2026: "the ~450 MB AmazonEC2 file json.loads to ~2.5 GB RAM"), so the default file is 512 MiB:
about 10% products (one in 50 a plain Linux instance), 10% on-demand terms, the rest Reserved
terms, as in the real file. Each reader runs in a child process that reads the file from
disk through `requests` (a transport adapter over the open file: the body is never held whole),
and prints its peak RSS (ru_maxrss). The old reader is run on --old-size-mib (default 64)
and on half that, and its peak projected to the full size along the slope between the two;
--old-full runs it at the full size too (several GB of memory).
Prints each peak, the ratio, and the streamed peak against the CronJob's memory limit
(config/catalog-refresh/cronjob.yaml).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import json
import re
import subprocess
import tempfile
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20

_PLAIN = (
    '"productFamily":"Compute Instance","attributes":{{"instanceType":"{name}",'
    '"location":"US East (N. Virginia)","operatingSystem":"{os}","tenancy":"Shared",'
    '"preInstalledSw":"NA","capacitystatus":"Used","vcpu":"4","memory":"16 GiB",'
    '"usagetype":"BoxUsage:{name}","operation":"RunInstances","servicecode":"AmazonEC2"}}'
)
_TERM = (
    '"{sku}.{code}":{{"offerTermCode":"{code}","sku":"{sku}","effectiveDate":"2026-01-01T00:00:00Z",'
    '"priceDimensions":{{"{sku}.{code}.6YS6EN2CT7":{{"rateCode":"{sku}.{code}.6YS6EN2CT7",'
    '"description":"$0.192 per On Demand Linux m.xlarge Instance Hour","beginRange":"0",'
    '"endRange":"Inf","unit":"Hrs","pricePerUnit":{{"USD":"{usd}"}},"appliesTo":[]}}}},'
    '"termAttributes":{{}}}}'
)


def write_offer(path: Path, size: int) -> int:
    """A synthetic offer file of about `size` bytes, written piece by piece; the SKU count."""
    product = len(_PLAIN.format(name="m5.xlarge", os="Linux")) + 40
    term = len(_TERM.format(sku="X" * 16, code="JRTCKXETXF", usd="0.19")) + 30
    skus = max(10, size // 10 // product)
    reserved_per_sku = max(1, (size - skus * (product + term)) // (skus * term))
    with path.open("w") as out:
        out.write('{"formatVersion":"v1.0","offerCode":"AmazonEC2","products":{')
        for i in range(skus):
            os_name = "Linux" if i % 50 == 0 else ("Windows", "RHEL", "SUSE")[i % 3]
            name = f"x{i % 900}.{i // 900}xlarge"
            body = _PLAIN.format(name=name, os=os_name)
            out.write(f'{"," if i else ""}"S{i:015d}":{{"sku":"S{i:015d}",{body}}}')
        out.write('},"terms":{"OnDemand":{')
        for i in range(skus):
            sku = f"S{i:015d}"
            entry = _TERM.format(sku=sku, code="JRTCKXETXF", usd=f"{0.1 + i % 97 / 100:.4f}")
            out.write(f'{"," if i else ""}"{sku}":{{{entry}}}')
        out.write('},"Reserved":{')
        for i in range(skus):
            sku = f"S{i:015d}"
            entries = ",".join(
                _TERM.format(sku=sku, code=f"R{k:09d}", usd="0.1") for k in range(reserved_per_sku)
            )
            out.write(f'{"," if i else ""}"{sku}":{{{entries}}}')
        out.write("}}}")
    return skus


CHILD = r"""
import json, resource, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
import requests
from requests.adapters import BaseAdapter
from requests.models import Response

class FileAdapter(BaseAdapter):
    def send(self, request, **kwargs):
        response = Response()
        response.status_code = 200
        response.raw = open(sys.argv[2], "rb")
        response.url = request.url
        response.request = request
        return response
    def close(self):
        pass

session = requests.Session()
session.mount("https://", FileAdapter())
if sys.argv[1] == "stream":
    from providers.clouds.price_sources import aws_prices
    rows = aws_prices("us-east-1", session=session)
else:  # the old reader: the whole answer as text, then one json.loads
    from providers.clouds._price_pages import strict_json
    text = session.get("https://pricing.example/index.json").text
    offer = strict_json(text, "old")
    rows = {p["attributes"]["instanceType"] for p in offer["products"].values()
            if p["attributes"]["operatingSystem"] == "Linux"}
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"peak": peak, "rows": len(rows)}))
"""


def run(kind: str, path: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(path), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{kind} reader failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def cronjob_limit() -> int:
    text = (ROOT / "config" / "catalog-refresh" / "cronjob.yaml").read_text()
    found = re.findall(r"limits:\s*\n(?:\s+\w+:.*\n)*?\s+memory:\s*(\d+)(Mi|Gi)", text)
    if not found:
        raise SystemExit("no memory limit in config/catalog-refresh/cronjob.yaml")
    number, unit = found[0]
    return int(number) * (MIB if unit == "Mi" else 1024 * MIB)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--old-size-mib", type=int, default=64)
    parser.add_argument("--old-full", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        full, small = Path(scratch) / "full.json", Path(scratch) / "small.json"
        skus = write_offer(full, args.size_mib * MIB)
        write_offer(small, args.old_size_mib * MIB)
        size, small_size = full.stat().st_size, small.stat().st_size
        print(
            f"offer file: {size / MIB:.0f} MiB, {skus} SKUs "
            f"(old reader: {small_size / MIB:.0f} MiB)"
        )
        streamed = run("stream", full)
        print(f"streamed, {size / MIB:.0f} MiB: peak RSS {streamed['peak'] / MIB:.0f} MiB")
        half = Path(scratch) / "half.json"
        write_offer(half, args.old_size_mib * MIB // 2)
        old, old_half = run("old", small), run("old", half)
        # the slope between two sizes leaves out the interpreter's own memory
        slope = (old["peak"] - old_half["peak"]) / (small_size - half.stat().st_size)
        projected = old["peak"] + slope * (size - small_size)
        print(
            f"whole document, {small_size / MIB:.0f} MiB: peak RSS {old['peak'] / MIB:.0f} MiB "
            f"({slope:.1f} bytes of memory per byte of file; projected at {size / MIB:.0f} MiB: "
            f"{projected / 1024 / MIB:.1f} GiB)"
        )
        if args.old_full:
            old_full = run("old", full)
            print(
                f"whole document, {size / MIB:.0f} MiB: peak RSS {old_full['peak'] / MIB:.0f} MiB"
            )
        limit = cronjob_limit()
        print(
            f"CronJob memory limit {limit / MIB:.0f} MiB: streamed peak is "
            f"{streamed['peak'] / limit:.0%} of it; the whole document would need "
            f"{projected / limit:.1f}x the limit"
        )


if __name__ == "__main__":
    main()
