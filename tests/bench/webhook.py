"""Webhook latency over TLS on loopback at a fixed request rate (open loop).

Runs the real server (uvicorn, TLS from trustme) in a thread and sends AdmissionReviews at a
fixed rate from an asyncio client: plain GPU pods, and DRA pods whose claims, templates and
device classes come from a fake Kubernetes API (cached after the first lookup). The baseline,
measured in the same run at the same rate, is GET /healthz over the same connections.

    python tests/bench/webhook.py [--rate 200] [--seconds 5]

Prints p50/p99 latency and achieved throughput per scenario, and the ratio to the baseline.
Target: p99 under 10 ms at 200 req/s.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder is sys.path[0], where select.py would shadow the standard
# library's `select`: the repository root takes its place.
sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import trustme

from tests.webhook.conftest import (
    ServerThread,
    client_context,
    container,
    make_catalog,
    pod,
    review,
)
from tests.webhook.fakekube import FakeKube
from tests.webhook.test_dra import CLASSES, TEMPLATES
from webhook import Admission, KubeResolver, ServerConfig, Settings


async def _run(
    client: httpx.AsyncClient, url: str, body: bytes | None, rate: float, seconds: float
) -> tuple[list[float], float]:
    total = int(rate * seconds)
    latencies: list[float] = []
    start = time.perf_counter()

    async def one(at: float) -> None:
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t0 = time.perf_counter()
        if body is None:
            reply = await client.get(url)
        else:
            reply = await client.post(
                url, content=body, headers={"content-type": "application/json"}
            )
        latencies.append(time.perf_counter() - t0)
        if reply.status_code != 200 or (
            body is not None and not reply.json()["response"]["allowed"]
        ):
            raise SystemExit(f"unexpected answer: {reply.status_code} {reply.text[:200]}")

    async with asyncio.TaskGroup() as tasks:
        for i in range(total):
            tasks.create_task(one(start + i / rate))
    return latencies, total / (time.perf_counter() - start)


def _row(name: str, latencies: list[float], throughput: float, base_p99: float | None) -> str:
    q = statistics.quantiles(latencies, n=100)
    p50, p99 = statistics.median(latencies) * 1e3, q[98] * 1e3
    ratio = f"{p99 / (base_p99 * 1e3):6.2f}x" if base_p99 else "   1.00x"
    return (
        f"{name:<14} n={len(latencies):<5} p50={p50:6.2f} ms  p99={p99:6.2f} ms  "
        f"{throughput:7.1f} req/s  p99 vs baseline {ratio}"
    )


async def _bench(url: str, ca: trustme.CA, rate: float, seconds: float) -> None:
    gpu_pod = pod(
        container("train", {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 4}),
        container("side", {"nvidia.com/mig-1g.10gb": 1}),
    )
    dra = pod(
        container("main"),
        resourceClaims=[
            {"name": "a", "resourceClaimTemplateName": "big-memory"},
            {"name": "b", "resourceClaimTemplateName": "first-available"},
        ],
    )
    dra["spec"]["containers"][0]["resources"] = {"claims": [{"name": "a"}, {"name": "b"}]}
    gpu_body = json.dumps(review(gpu_pod)).encode()
    dra_body = json.dumps(review(dra)).encode()
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    async with httpx.AsyncClient(verify=client_context(ca), limits=limits, timeout=10) as client:
        for body in (gpu_body, dra_body):  # warm up: connections, CEL programs, lookup cache
            for _ in range(20):
                await client.post(url + "/mutate", content=body)
        await _run(client, url + "/healthz", None, rate, 1.0)  # warm up at rate: discarded
        print(f"rate {rate:.0f} req/s for {seconds:.0f} s per scenario, TLS on loopback")
        base, tput = await _run(client, url + "/healthz", None, rate, seconds)
        base_p99 = statistics.quantiles(base, n=100)[98]
        print(_row("baseline", base, tput, None))
        for name, body in (("gpu-pod", gpu_body), ("dra-pod", dra_body)):
            lat, tput = await _run(client, url + "/mutate", body, rate, seconds)
            print(_row(name, lat, tput, base_p99))


def _serve(directory: Path) -> None:
    """The server side, in its own process so client and server never share one GIL."""
    with FakeKube() as fake:
        fake.add_yaml(CLASSES)
        fake.add(*TEMPLATES)
        from kubernetes import config as kube_config

        api = kube_config.new_client_from_config(config_file=str(fake.kubeconfig(directory)))
        catalog = make_catalog()
        resolver = KubeResolver(ttl_seconds=600, api_client=api)
        admission = Admission(Settings(), lambda: catalog, resolver)
        config = ServerConfig(
            host="127.0.0.1",
            port=0,
            cert_file=directory / "tls.crt",
            key_file=directory / "tls.key",
            shutdown_seconds=2,
        )
        with ServerThread(admission, config) as server:
            print(server.port, flush=True)
            sys.stdin.read()  # until the parent closes stdin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve)
        return
    ca = trustme.CA()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        cert = ca.issue_cert("127.0.0.1")
        cert.private_key_pem.write_to_path(str(directory / "tls.key"))
        cert.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
        with subprocess.Popen(
            [sys.executable, __file__, "--serve", str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as child:
            assert child.stdout is not None and child.stdin is not None
            port = int(child.stdout.readline())
            try:
                asyncio.run(_bench(f"https://127.0.0.1:{port}", ca, args.rate, args.seconds))
            finally:
                child.stdin.close()
                child.wait(30)


if __name__ == "__main__":
    main()
