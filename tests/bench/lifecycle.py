"""200 concurrent sandboxes created and stopped through the aws provider against moto's server.

moto runs as a separate process on 127.0.0.1, so the peak memory printed is the adaptor's own
(this process: provider, boto3 client, threads). The baseline, measured in the same run, is the
same create+stop done one sandbox at a time; the ratio says what concurrency buys. Leaked VMs
(owned instances left after every stop) must be 0.

    python tests/bench/lifecycle.py [--sandboxes 200] [--baseline 20]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder is sys.path[0], where select.py would shadow the standard
# library's `select`: the repository root takes its place.
sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import asyncio
import os
import resource
import socket
import statistics
import subprocess
import time
import tracemalloc
import urllib.request

from providers.aws import AwsConfig, AwsProvider
from providers.base import VMSpec

OWNER = "bench-owner"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("moto server did not start")


def spec(n: int) -> VMSpec:
    return VMSpec(
        sandbox_id=f"{n:064x}",
        pod_namespace="bench",
        pod_name=f"pod-{n}",
        candidates=("g5.xlarge",),
        user_data="#cloud-config\nwrite_files: []\n",
    )


async def cycle(aws: AwsProvider, n: int) -> float:
    start = time.perf_counter()
    vm = await aws.create(spec(n))
    await aws.delete(vm.id)
    return time.perf_counter() - start


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(sandboxes: int, baseline: int) -> int:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "testing")
    port = free_port()
    moto = start_moto(port)
    try:
        config = AwsConfig(
            region="us-east-1",
            image_id="ami-0a1b2c3d4e5f60718",
            zones=("us-east-1a",),
            endpoint_url=f"http://127.0.0.1:{port}",
            poll_interval_seconds=0.05,
        )
        aws = AwsProvider(config, OWNER)
        base = [await cycle(aws, 10_000 + i) for i in range(baseline)]
        tracemalloc.start()
        start = time.perf_counter()
        lat = await asyncio.gather(*(cycle(aws, i) for i in range(sandboxes)))
        wall = time.perf_counter() - start
        _, peak_traced = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        leaked = await aws.list_owned()
    finally:
        moto.terminate()
        moto.wait(10)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    seq_total = sum(base) / len(base) * sandboxes
    print(f"sandboxes            {sandboxes} concurrent create+stop (moto server on loopback)")
    print(f"wall time            {wall:.2f} s")
    print(
        f"per sandbox          median {statistics.median(lat) * 1000:.0f} ms, "
        f"p99 {pct(list(lat), 0.99) * 1000:.0f} ms"
    )
    print(
        f"baseline (serial)    median {statistics.median(base) * 1000:.0f} ms per sandbox, "
        f"{seq_total:.2f} s projected for {sandboxes}"
    )
    print(f"speedup vs serial    {seq_total / wall:.1f}x")
    print(
        f"peak memory          {peak_traced / 2**20:.1f} MiB Python heap, {rss_mib:.0f} MiB max RSS"
    )
    print(f"leaked VMs           {len(leaked)}")
    return 0 if not leaked else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=200)
    parser.add_argument("--baseline", type=int, default=20)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.sandboxes, args.baseline)))
