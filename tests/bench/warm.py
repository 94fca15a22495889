"""Warm against cold starts: StartVM-to-agent-ready of 50 pods adopting a warm pool's VMs, then
50 launched cold while the pool refills behind them, in one run on one latency model.

The whole adaptor (`Daemon`, aws provider, moto's EC2 in process) runs behind the
latency-modelled cloud (tests/clouds/latency.py; its figures and their sources are in
docs/warm-pools.md), scaled by --scale so the run takes seconds. Each pod is CreateVM, then
StartVM timed until it answers (the adaptor has reached the pod VM's agent), then one health
check through the agent socket. The warm phase starts once the pool holds --pods warm VMs; the
cold phase starts as the warm phase ends, while the pool's refills are still booting, so none
of its pods can adopt. Printed: p50 and p99 of each phase, the ratio of the medians, how long
the pool took to be full again after the warm phase (against one cold launch of the model),
and the VMs left: the pool is drained at exit, so none. Exits 1 if a pod failed, a warm pod
launched cold, a cold pod adopted, or a VM leaked.

    python tests/bench/warm.py [--pods 50] [--scale 0.2] [--in-process]

moto's EC2 runs as a server process (the cloud's CPU is not the adaptor's); --in-process runs
it inside the bench instead. At --scale 0.2 the model's cold start is 30 s and its warm start
5 s; much smaller scales measure mostly moto's own time per call (50 concurrent launches cost
it seconds), which weighs on both phases alike.
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
import statistics
import tempfile
import time
from typing import Any

from tests.clouds.latency import LatencyModel
from tests.clouds.warm_rig import Rig, warm_rig


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def line(name: str, values: list[float]) -> str:
    return (
        f"{name:<5} n={len(values):<3} p50 {statistics.median(values) * 1000:8.1f} ms"
        f"   p99 {percentile(values, 0.99) * 1000:8.1f} ms"
    )


async def phase(rig: Rig, prefix: str, pods: int) -> list[float]:
    return list(await asyncio.gather(*(rig.start_pod(f"{prefix}-{n}") for n in range(pods))))


async def bench(pods: int, model: LatencyModel, endpoint_url: str) -> int:
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pw", dir="/tmp") as directory:
        rig_of = warm_rig(Path(directory), model, pods, endpoint_url, warm_pool_drain_on_exit=True)
        async with rig_of as rig:
            filled = await rig.until_warm(pods, seconds=120)
            print(f"pool of {pods} {rig.daemon.settings.warm_pools[0]} warm after {filled:.2f} s")
            warm = await phase(rig, "warm", pods)
            warm_done = time.monotonic()
            if rig.cloud.adoptions != pods or rig.cloud.creates:
                failures.append(
                    f"warm phase: {rig.cloud.adoptions} adopted, {rig.cloud.creates} cold"
                )
            cold = await phase(rig, "cold", pods)
            if rig.cloud.adoptions != pods or rig.cloud.creates != pods:
                failures.append(f"cold phase: {rig.cloud.creates} of {pods} cold")
            await rig.until_warm(pods, seconds=120)
            refill = time.monotonic() - warm_done
            for n in range(pods):
                await asyncio.gather(rig.stop_pod(f"warm-{n}"), rig.stop_pod(f"cold-{n}"))
            provider: Any = rig.cloud
        left = [vm for vm in await provider.list_owned() if vm.extra.get("state") != "terminated"]
    print(line("cold", cold))
    print(line("warm", warm))
    ratio = statistics.median(warm) / statistics.median(cold)
    print(f"warm/cold p50 ratio {ratio:.3f} (goal <= 0.25)")
    print(
        f"pool refilled to {pods} in {refill:.2f} s after the warm phase; one cold launch: "
        f"{statistics.median(cold):.2f} s in this run (p50), {model.cold:.2f} s in the model "
        f"(launch {model.scaled(model.launch):.2f} + first boot "
        f"{model.scaled(model.first_boot):.2f} + pull {model.scaled(model.image_pull):.2f})"
    )
    print(f"VMs left after StopVMs and the drain: {len(left)}")
    if left:
        failures.append(f"{len(left)} VMs leaked")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--scale", type=float, default=0.2)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="moto in this process (its CPU then competes with the adaptor's event loop)",
    )
    args = parser.parse_args()
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ[key] = value
    model = LatencyModel(scale=args.scale)
    if args.in_process:
        from moto import mock_aws

        with mock_aws():
            sys.exit(asyncio.run(bench(args.pods, model, "")))
    # moto's EC2 as its own process, as the cloud is: its CPU is not the adaptor's
    from tests.bench.lifecycle import free_port, start_moto

    port = free_port()
    moto = start_moto(port)
    try:
        code = asyncio.run(bench(args.pods, model, f"http://127.0.0.1:{port}"))
    finally:
        moto.terminate()
        moto.wait(10)
    sys.exit(code)


if __name__ == "__main__":
    main()
