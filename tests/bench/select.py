"""Catalog load time and selection latency over the full AWS us-east-1 catalog.

    python tests/bench/select.py [--iterations N] [--moto-runs N]

Prints: snapshot load (JSON -> Catalog, uncached) and moto load (moto's EC2 data through the AWS
loader, in-process `mock_aws`) medians; then per request the p50/p99 of `select(...).selected`
(what StartVM needs), of building every candidate and rejection (what the CLI prints), and of a
naive baseline measured in the same run (every type through the full check, then sorted), with
the ratio of the baselines' p50 to select's.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder is sys.path[0], where this very file would shadow the standard
# library's `select`: the repository root takes its place.
sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable

from providers.core import snapshots
from providers.core.catalog import Catalog
from providers.core.errors import NoMatch
from providers.core.request import InstanceRequest
from providers.core.selection import Rejection, Selector, _Matcher, _rank_key

GIB = 1024
REQUESTS: dict[str, InstanceRequest] = {
    "8 vCPU / 8 GiB (no GPU)": InstanceRequest(vcpus=8, memory_mib=8 * GIB),
    "one H100": InstanceRequest(gpus=1, gpu_models=("h100",)),
    "eight H100 + EFA": InstanceRequest(gpus=8, gpu_models=("h100",), rdma=True),
    "any GPU >= 20 GiB": InstanceRequest(gpus=1, gpu_memory_mib=20 * GIB),
    "MIG 1g.10gb x8": InstanceRequest(mig={"1g.10gb": 8}),
    "fractional L4, zone 1b": InstanceRequest(
        gpus=1, gpu_models=("l4",), fractional=True, zone="us-east-1b"
    ),
    "impossible: 16 H100": InstanceRequest(gpus=16, gpu_models=("h100",)),
    "any GPU >= 23 GiB of one form": InstanceRequest(
        gpus=1, gpu_memory_mib=23 * GIB, gpu_products=("nvidia-l40s",)
    ),
}


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered), p99


def timed(fn: Callable[[], object], iterations: int) -> list[float]:
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def selected(selector: Selector, request: InstanceRequest) -> None:
    with contextlib.suppress(NoMatch):
        _ = selector.select(request).selected


def everything(selector: Selector, request: InstanceRequest) -> None:
    s = selector.select(request)
    _ = s.candidates, s.rejections
    if not s.candidates:
        s.summary()


def naive(selector: Selector, request: InstanceRequest) -> None:
    index = selector._index
    matcher = _Matcher.build(request, index)
    fits = []
    for t in selector.catalog.types:
        result = matcher.check(t)
        if not isinstance(result, Rejection):
            fits.append((t, result))
    fits.sort(key=lambda pair: _rank_key(*pair, index.rates))


def moto_load() -> Catalog:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "testing")
    import boto3
    from moto import mock_aws

    from providers.clouds.loaders import aws

    with mock_aws():
        return aws.load_catalog("us-east-1", client=boto3.client("ec2", region_name="us-east-1"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--moto-runs", type=int, default=1)
    args = parser.parse_args()

    path = snapshots.snapshot_path("aws", "us-east-1")
    raw = path.read_bytes()
    loads = timed(lambda: Catalog.model_validate_json(raw), 10)
    catalog = snapshots.load_catalog("aws", "us-east-1")
    start = time.perf_counter()
    selector = Selector(catalog)
    index_seconds = time.perf_counter() - start
    print(f"catalog aws us-east-1: {len(catalog.types)} types, {len(raw) / 1e6:.2f} MB snapshot")
    print(f"  snapshot load (parse + validate)  median {statistics.median(loads) * 1e3:8.1f} ms")
    print(f"  selection index build (once)             {index_seconds * 1e3:8.1f} ms")
    if args.moto_runs > 0:  # --moto-runs 0: selection figures only
        moto = timed(moto_load, args.moto_runs)
        print(f"  moto load via the AWS loader       median {statistics.median(moto) * 1e3:8.1f} ms"
              f"  ({args.moto_runs} run(s))")  # fmt: skip
    print()
    header = f"{'request':28} {'selected p50/p99 us':>20} {'all p50/p99 us':>18}"
    print(f"{header} {'naive p50/p99 us':>18} {'naive/sel':>9}")
    worst_p99 = 0.0
    for label, request in REQUESTS.items():
        for fn in (selected, everything, naive):  # warm caches (index, MIG packing)
            fn(selector, request)
        sel = percentiles(timed(lambda r=request: selected(selector, r), args.iterations))
        full = percentiles(timed(lambda r=request: everything(selector, r), args.iterations // 4))
        base = percentiles(timed(lambda r=request: naive(selector, r), args.iterations // 4))
        worst_p99 = max(worst_p99, sel[1])
        print(
            f"{label:28} {sel[0] * 1e6:9.1f}/{sel[1] * 1e6:<9.1f} "
            f"{full[0] * 1e6:8.1f}/{full[1] * 1e6:<9.1f} "
            f"{base[0] * 1e6:8.1f}/{base[1] * 1e6:<9.1f} {base[0] / sel[0]:8.1f}x"
        )
    print(f"\nworst selection p99: {worst_p99 * 1e6:.1f} us (target: under 1000 us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
