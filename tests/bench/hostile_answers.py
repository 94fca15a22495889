"""What a hostile server costs the node's clients: peak RSS of one Kubernetes API call answered
with 300 MB, and how long one call and one whole `peerpods serve` start take against servers
that drip (a byte every 50 ms, for as long as the client listens).

    python tests/bench/hostile_answers.py [--answer-mib N] [--runs N]

Each figure is the median of --runs child processes (the RSS is each child's ru_maxrss, before
and after the call). The Kubernetes client's timeout is 2 s and its answer bound 64 MiB; the
metadata client's timeout is 2 s per request. Without a total deadline the dripping calls never
end; without a bound the 300 MB answer is held whole.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import os
import statistics
import subprocess
import tempfile
import time

from tests.hostile_http import drip, flood, hostile

KUBE_CALL = """
import resource, sys, time
from providers.clouds.kube import KubeApiError, KubeClient, KubeConfig
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
client = KubeClient(KubeConfig(server=sys.argv[1], source="bench"), timeout_seconds=2)
start = time.monotonic()
try:
    client.get("/api/v1/nodes")
except KubeApiError as exc:
    said = str(exc)
else:
    said = "answered"
took = time.monotonic() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(before / 1024, after / 1024, took, said[-60:])
"""


def kube_call(url: str) -> tuple[float, float, float, str]:
    out = subprocess.run(
        [sys.executable, "-c", KUBE_CALL, url], capture_output=True, text=True, check=True
    ).stdout.split(" ", 3)
    return float(out[0]), float(out[1]), float(out[2]), out[3].strip()


def serve_start(url: str) -> tuple[float, int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PEERPODS_", "AWS_"))}
    with tempfile.TemporaryDirectory() as root:
        start = time.monotonic()
        done = subprocess.run(
            [
                sys.executable, "-m", "adaptor.cli.main", "serve", "--provider", "aws",
                "--pod-vm-image", "ami-1", "--aws-region", "eu-west-1",
                "--instance-metadata-url", url, "--state-dir", f"{root}/state",
                "--socket", f"{root}/hv.sock", "--pods-dir", f"{root}/pods",
                "--no-agent-tls", "--status-address", "",
            ],
            capture_output=True, text=True, timeout=600, env=env,
        )  # fmt: skip
        return time.monotonic() - start, done.returncode, done.stderr.strip()[-80:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--answer-mib", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    total = args.answer_mib << 20

    runs = []
    for _ in range(args.runs):
        with hostile(flood(total, announce=False)) as server:
            runs.append(kube_call(server.url))
    print(f"kube call, {args.answer_mib} MiB answer (length not announced):")
    print(f"  peak RSS before {statistics.median(r[0] for r in runs):.0f} MiB, after "
          f"{statistics.median(r[1] for r in runs):.0f} MiB; {runs[0][3]}")  # fmt: skip

    runs = []
    for _ in range(args.runs):
        with hostile(drip(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n{")) as server:
            runs.append(kube_call(server.url))
    took = statistics.median(r[2] for r in runs)
    print(f"kube call, body dripped, timeout 2 s: median {took:.2f} s")

    starts = []
    for _ in range(args.runs):
        with hostile(drip(b"HTTP/1.1 200 OK\r\nX-Drip: ")) as server:
            starts.append(serve_start(server.url))
    print(
        f"serve start, IMDS dripping its headers: median "
        f"{statistics.median(s[0] for s in starts):.2f} s to exit {starts[0][1]}; "
        f"...{starts[0][2]}"
    )


if __name__ == "__main__":
    main()
