"""200 concurrent sandboxes through the whole adaptor, the way Kata's shim drives it, on AWS (moto).

The adaptor (`adaptor.node.daemon.Daemon` with the aws provider, selection over the bundled
us-east-1
catalog, agent TLS off) runs in this process on the daemon's event loop; moto's EC2 server and
the pod VMs' forwarder (the Go ttrpc echo server) are separate processes on 127.0.0.1. moto gives
the VMs 10.x addresses: the endpoint resolver maps every VM to that one loopback forwarder, and
an audit hook refuses any connect to a non-loopback address. Each sandbox is CreateVM, StartVM,
one grpc.Health/Check through its agent socket, then StopVM, all over ttrpc on the hypervisor
socket (one connection per sandbox, like the shim); half of them are one-L4 GPU pods.

Printed: wall time; create+start and stop latency p50/p99; a serial baseline from the same run
(sandboxes one at a time, projected to the concurrent count); the adaptor process's peak memory
(tracemalloc peak over the concurrent phase, max RSS); the CPU the adaptor and moto spent in
the concurrent phase (moto's per-call cost grows with the instances it holds); leaked VMs
(instances carrying this adaptor's owner tag left in moto) and sandboxes left in the state
store. tracemalloc runs over both phases, so its overhead cancels in the ratio. Exits 1 if
anything failed or leaked.

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
import ipaddress
import os
import resource
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import tracemalloc
import urllib.request
from collections import Counter
from dataclasses import dataclass
from typing import Any

from adaptor.node.daemon import Daemon
from adaptor.ttrpc import Client
from adaptor.ttrpc.gen import health_pb2
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from adaptor.ttrpc.loop import run as run_loop
from providers.clouds.aws import AwsProvider
from providers.core import contract
from providers.core.base import TAG_OWNER, Instance
from tests.adaptor.daemon_proc import ANNOTATIONS
from tests.adaptor.moto_daemon import moto_aws, moto_settings
from tests.go.peers import GoServer, start_echo_server

OWNER = "bench-owner"
HYPERVISOR = "hypervisor.Hypervisor"
CALL_TIMEOUT_NANO = 60 * 10**9
RUN_TIMEOUT_SECONDS = 600.0
GPU_POD = {
    **ANNOTATIONS,
    contract.DEFAULT_GPUS: "1",
    contract.DEFAULT_GPU_MODEL: "v1:m=l4",
}

refused: list[str] = []


def _loopback_only(event: str, args: tuple[Any, ...]) -> None:
    """Audit hook: the bench never reaches a pod VM's 10.x address, or anything off this host."""
    if event == "socket.connect":
        address = args[1]
        if not isinstance(address, tuple):
            return  # unix sockets
        host = str(address[0])
    elif event == "socket.getaddrinfo":
        host = str(args[0]) if args[0] is not None else ""
    else:
        return
    if host in ("", "localhost"):
        return
    try:
        if ipaddress.ip_address(host.split("%", 1)[0]).is_loopback:
            return
    except ValueError:
        pass
    refused.append(f"{event} {host}")
    raise ConnectionRefusedError(f"bench guard: refusing non-loopback address {host!r}")


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
    proc.wait()
    raise SystemExit("moto server did not start")


@dataclass(frozen=True)
class Timing:
    """One sandbox's latencies as the shim sees them (seconds)."""

    create_start: float
    stop: float


def sandbox_id(n: int) -> str:
    return f"{n:064x}"


async def cycle(hv_socket: str, n: int) -> Timing:
    """CreateVM, StartVM, Health.Check through the agent socket, StopVM: one sandbox."""
    sid = sandbox_id(n)
    annotations = dict(GPU_POD if n % 2 else ANNOTATIONS)
    annotations["io.kubernetes.cri.sandbox-name"] = f"pod-{n}"
    async with await Client.connect_unix(hv_socket) as hv:
        began = time.perf_counter()
        created = pb.CreateVMResponse.FromString(
            await hv.call(
                HYPERVISOR,
                "CreateVM",
                pb.CreateVMRequest(id=sid, annotations=annotations).SerializeToString(),
                timeout_nano=CALL_TIMEOUT_NANO,
            )
        )
        await hv.call(
            HYPERVISOR,
            "StartVM",
            pb.StartVMRequest(id=sid).SerializeToString(),
            timeout_nano=CALL_TIMEOUT_NANO,
        )
        started = time.perf_counter()
        async with await Client.connect_unix(created.agentSocketPath) as agent:
            health = health_pb2.HealthCheckResponse.FromString(
                await agent.call(
                    "grpc.Health",
                    "Check",
                    health_pb2.CheckRequest().SerializeToString(),
                    timeout_nano=CALL_TIMEOUT_NANO,
                )
            )
        if health.status != health_pb2.HealthCheckResponse.SERVING:
            raise RuntimeError(f"sandbox {n}: agent health {health.status}")
        stopping = time.perf_counter()
        await hv.call(
            HYPERVISOR,
            "StopVM",
            pb.StopVMRequest(id=sid).SerializeToString(),
            timeout_nano=CALL_TIMEOUT_NANO,
        )
        return Timing(started - began, time.perf_counter() - stopping)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(values: list[float]) -> str:
    return f"p50 {statistics.median(values) * 1000:.0f} ms, p99 {pct(values, 0.99) * 1000:.0f} ms"


@dataclass
class Result:
    """What one run measured."""

    baseline: list[Timing]
    timings: list[Timing]
    failures: list[str]
    wall: float
    cpu: float
    moto_cpu: float
    peak_traced: int
    rss_before_mib: float
    leaked_vms: list[str]
    leaked_sandboxes: list[str]
    launched: Counter[str]


async def measure(
    root: Path, moto_port: int, moto_pid: int, forwarder: GoServer, sandboxes: int, baseline: int
) -> Result:
    aws = moto_aws(moto_port, OWNER, zones=("us-east-1a", "us-east-1b", "us-east-1c"))

    def resolve(instance: Instance) -> tuple[str, int]:
        return forwarder.host, forwarder.port  # the VM's 10.x address, reached on loopback

    settings = moto_settings(root, OWNER, proxy_timeout_seconds=30, shutdown_grace_seconds=5)
    daemon = Daemon(settings, provider=aws, resolve_endpoint=resolve)
    await daemon.start()
    hv_socket = str(settings.socket)
    try:
        for i in range(2):  # warm-up, one pod of each kind: clients, catalog, first calls
            await cycle(hv_socket, 2_000_000 + i)
        tracemalloc.start()
        base = [await cycle(hv_socket, 1_000_000 + i) for i in range(baseline)]
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        tracemalloc.reset_peak()
        cpu_began, moto_began = time.process_time(), cpu_seconds(moto_pid)
        began = time.perf_counter()
        async with asyncio.timeout(RUN_TIMEOUT_SECONDS):
            outcomes = await asyncio.gather(
                *(cycle(hv_socket, i) for i in range(sandboxes)), return_exceptions=True
            )
        wall = time.perf_counter() - began
        cpu = time.process_time() - cpu_began
        moto_cpu = cpu_seconds(moto_pid) - moto_began
        _, peak_traced = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert daemon.store is not None
        left = [r.id for r in await daemon.store.records()]
    finally:
        await daemon.close()
    owned = [i.id for i in await aws.list_owned()]
    launched = await asyncio.to_thread(launched_types, aws)
    timings = [o for o in outcomes if isinstance(o, Timing)]
    failures = [f"{type(o).__name__}: {o}" for o in outcomes if isinstance(o, BaseException)]
    return Result(
        base, timings, failures, wall, cpu, moto_cpu, peak_traced, rss_before, owned, left, launched
    )


def cpu_seconds(pid: int) -> float:
    """User+system CPU time of another process (moto's server), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def launched_types(aws: AwsProvider) -> Counter[str]:
    """Instance types of every VM this adaptor launched (moto keeps terminated ones listed)."""
    pages = aws.client.get_paginator("describe_instances").paginate(
        Filters=[{"Name": f"tag:{TAG_OWNER}", "Values": [OWNER]}]
    )
    return Counter(
        i["InstanceType"] for page in pages for r in page["Reservations"] for i in r["Instances"]
    )


async def main(sandboxes: int, baseline: int) -> int:
    sys.addaudithook(_loopback_only)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "testing")
    root = Path(tempfile.mkdtemp(prefix="pp-"))
    port = free_port()
    moto = start_moto(port)
    forwarder: GoServer | None = None
    try:
        try:
            forwarder = await start_echo_server()
        except BaseException as exc:  # pytest's skip when Go is missing is a BaseException
            raise SystemExit(f"cannot start the Go echo server: {exc}") from None
        result = await measure(root, port, moto.pid, forwarder, sandboxes, baseline)
    finally:
        if forwarder is not None:
            await forwarder.kill()
        moto.terminate()
        moto.wait(10)
        shutil.rmtree(root, ignore_errors=True)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report(result, sandboxes, rss_mib)
    bad = result.failures or result.leaked_vms or result.leaked_sandboxes or refused
    return 1 if bad else 0


def report(r: Result, sandboxes: int, rss_mib: float) -> None:
    create = [t.create_start for t in r.timings]
    stop = [t.stop for t in r.timings]
    serial = [t.create_start + t.stop for t in r.baseline]
    done = len(r.timings)  # projected for what completed, so failures cannot flatter the ratio
    projected = statistics.mean(serial) * done
    print(
        f"sandboxes            {sandboxes} concurrent (half 1xL4 GPU pods) through the adaptor's "
        "hypervisor socket, aws provider on moto (loopback)"
    )
    print(f"completed            {len(r.timings)} ok, {len(r.failures)} failed")
    kinds = ", ".join(f"{name} {count}" for name, count in r.launched.most_common())
    print(
        f"VMs launched         {sum(r.launched.values())} (warm-up and baseline included): {kinds}"
    )
    for failure in r.failures[:5]:
        print(f"  failure            {failure}")
    print(f"wall time            {r.wall:.2f} s")
    if r.timings:
        print(f"create+start         {ms(create)}")
        print(f"stop                 {ms(stop)}")
    print(
        f"baseline (serial)    {len(serial)} sandboxes one at a time: create+start "
        f"{ms([t.create_start for t in r.baseline])}, stop {ms([t.stop for t in r.baseline])}"
    )
    print(f"                     {projected:.2f} s projected for {done}")
    print(f"speedup vs serial    {projected / r.wall:.1f}x")
    print(
        f"CPU, concurrent run  adaptor {r.cpu:.1f} s ({r.cpu / r.wall:.0%} of a core), "
        f"moto {r.moto_cpu:.1f} s ({r.moto_cpu / r.wall:.0%} of a core); {os.cpu_count()} cores"
    )
    print(
        f"adaptor peak memory  {r.peak_traced / 2**20:.1f} MiB Python heap (concurrent phase), "
        f"{rss_mib:.0f} MiB max RSS ({r.rss_before_mib:.0f} MiB after the serial phase)"
    )
    print(f"leaked VMs           {len(r.leaked_vms)} {' '.join(r.leaked_vms[:5])}".rstrip())
    print(f"leaked sandboxes     {len(r.leaked_sandboxes)}")
    if refused:
        print(f"non-loopback dials   {len(refused)} refused: {refused[:3]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=200)
    parser.add_argument("--baseline", type=int, default=20)
    args = parser.parse_args()
    if args.sandboxes < 1 or args.baseline < 1:
        parser.error("--sandboxes and --baseline must be at least 1")
    sys.exit(run_loop(main(args.sandboxes, args.baseline)))
