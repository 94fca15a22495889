"""Webhook latency over TLS on loopback at a fixed request rate (open loop), the server on one core.

Runs the real server (uvicorn, TLS from trustme) in a child process pinned to one CPU and sends
AdmissionReviews at a fixed rate from a small asyncio HTTP/1.1 client over keep-alive TLS
connections (pinned to the other CPUs): plain GPU pods, and DRA pods whose claims, templates and
device classes come from a fake Kubernetes API (cached after the first lookup). The baseline,
measured in the same run at the same rate, is GET /healthz over the same connections. Besides
latency, each scenario reports the server's CPU time per request (its /proc stat), so the cost
of admission shows apart from TLS and HTTP (the /healthz row), and `--profile` splits the
admission itself into its stages (JSON parse, decide: resources, seal, selection, patch; encode).
Both processes freeze their GC after start-up, and each watches its own event loop with a 5 ms
ticker: a tick over 5 ms late is a stall (the loop busy, or the process not scheduled), so a
p99 over the goal can be told apart as the server's stalls or the client's own.

    python tests/bench/webhook.py [--rate 500] [--seconds 5] [--runs 3] [--no-freeze-gc]
        [--realtime]
    python tests/bench/webhook.py --profile
    python tests/bench/webhook.py --flood [--seconds 10]
    python tests/bench/webhook.py --connection-flood [--seconds 10]

`--realtime` (root): client and server run under SCHED_FIFO, so that other processes on the
machine wait for them rather than take turns with them on the server's CPU: the core is the
server's own, as the goal assumes. Without it, on a busy shared machine, the server gets one
time-sharing share per runnable thread, which favours a server that spreads its work over
threads and says little about the server itself.

Prints p50/p99 latency, throughput and server CPU per request for each scenario and run, the
ratio of each p99 to the baseline's, each side's loop stalls (count over 5 ms and the longest),
and the median of each figure over the runs.
Goal: p99 <= 10 ms at 500 req/s for GPU and DRA pods.

`--flood`: a benign DRA pod of one namespace (a selector never seen before each time, so each
needs a CEL worker), one every 100 ms, while 50 clients of another namespace keep sending pods
whose selector runs until the CEL time limit; prints the benign pods' p50/p99/max and every
answer's outcome. `--connection-flood`: one address holds and re-opens 200 half-sent requests
(past its 64-connection share) while another sends a /healthz and a GPU pod every 50 ms; prints
how many of those were answered and their latency.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder is sys.path[0], where select.py would shadow the standard
# library's `select`: the repository root takes its place.
sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import asyncio
import contextlib
import gc
import json
import os
import ssl
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

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
from tests.webhook.test_dra import CLASSES, TEMPLATES, exactly, template
from tests.webhook.test_hostile_selectors import NESTED
from webhook import Admission, KubeResolver, ServerConfig, Settings

BENIGN_TEMPLATES = 400


class Client:
    """Keep-alive HTTP/1.1 over TLS, one request per connection at a time: the cheapest
    client asyncio allows, so that the figures are the server's."""

    def __init__(
        self, host: str, port: int, context: ssl.SSLContext, connections: int = 48
    ) -> None:
        self.host, self.port, self.context = host, port, context
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.opened = 0
        # as the API server's own pool: a bound on connections (the server allows 64 per
        # address by default), a request waits for a free one (its wait counts as latency)
        self.slots = asyncio.Semaphore(connections)

    async def request(self, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
        async with self.slots:
            return await self._request(head, body)

    async def _request(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        while self.idle:  # a kept-alive connection the server may have closed meanwhile
            reader, writer = self.idle.pop()
            try:
                return await self._exchange(reader, writer, head, body)
            except (ConnectionError, EOFError, asyncio.IncompleteReadError):
                writer.close()
        reader, writer = await asyncio.open_connection(
            self.host, self.port, ssl=self.context, server_hostname=self.host
        )
        self.opened += 1
        return await self._exchange(reader, writer, head, body)

    async def _exchange(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        head: bytes,
        body: bytes,
    ) -> tuple[int, bytes]:
        writer.write(head + body)
        status_line = await reader.readline()
        if not status_line:
            raise EOFError
        length = 0
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        data = await reader.readexactly(length)
        self.idle.append((reader, writer))
        return int(status_line.split()[1]), data

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: webhook\r\n\r\n".encode()


def _post(path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()


def _cpu_seconds(pid: int) -> float:
    """User and system time of a process, all its threads (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


TICK = 0.005  # the loop-stall ticker's period
STALL = 0.005  # a tick this late or more is a stall


async def _watch_loop(stalls: list[tuple[float, float]]) -> None:
    """Record (wall time, lateness) of each tick of this loop that came STALL or more late."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + TICK
        await asyncio.sleep(TICK)
        late = loop.time() - due
        if late >= STALL:
            stalls.append((time.time(), late))


def _stalls_in(stalls: list[tuple[float, float]], start: float, end: float) -> str:
    found = [late for at, late in stalls if start <= at <= end]
    return f"{len(found)}/{max(found, default=0.0) * 1e3:.0f}ms"


@dataclass
class Result:
    name: str
    latencies: list[float]
    throughput: float
    cpu_ms: float  # server CPU per request
    window: tuple[float, float] = (0.0, 0.0)  # wall-clock start and end of the run

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies) * 1e3

    @property
    def p99(self) -> float:
        return statistics.quantiles(self.latencies, n=100)[98] * 1e3


async def _run(
    client: Client, head: bytes, body: bytes, rate: float, seconds: float, pid: int
) -> Result:
    total = int(rate * seconds)
    latencies: list[float] = []
    refused: list[int] = []
    cpu0 = _cpu_seconds(pid)
    began = time.time()
    start = time.perf_counter()

    async def one(at: float) -> None:
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t0 = time.perf_counter()
        status, data = await client.request(head, body)
        latencies.append(time.perf_counter() - t0)
        if status != 200 or (body and b'"allowed":true' not in data):
            if b'"code":429' in data:  # shed: the namespace's share of DRA admissions is busy
                refused.append(1)
                return
            raise SystemExit(f"unexpected answer: {status} {data[:300]!r}")

    async with asyncio.TaskGroup() as tasks:
        for i in range(total):
            tasks.create_task(one(start + i / rate))
    elapsed = time.perf_counter() - start
    cpu_ms = (_cpu_seconds(pid) - cpu0) / total * 1e3
    if refused:
        print(f"  ({len(refused)} of {total} refused with 429: the server fell behind)")
    return Result("", latencies, total / elapsed, cpu_ms, (began, time.time()))


def _bodies() -> tuple[bytes, bytes]:
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
    return json.dumps(review(gpu_pod)).encode(), json.dumps(review(dra)).encode()


def _row(result: Result, base_p99: float | None) -> str:
    ratio = f"{result.p99 / base_p99:6.2f}x" if base_p99 else "   1.00x"
    return (
        f"{result.name:<10} n={len(result.latencies):<5} p50={result.p50:6.2f} ms  "
        f"p99={result.p99:6.2f} ms  {result.throughput:6.1f} req/s  "
        f"server CPU {result.cpu_ms:5.2f} ms/req  p99 vs baseline {ratio}"
    )


async def _bench(
    port: int, ca: trustme.CA, args: argparse.Namespace, pid: int
) -> tuple[list[list[Result]], list[tuple[float, float]]]:
    """The runs, and the client loop's stalls meanwhile."""
    gpu_body, dra_body = _bodies()
    client = Client("127.0.0.1", port, client_context(ca))
    scenarios = [
        ("baseline", _get("/healthz"), b""),
        ("gpu-pod", _post("/mutate", gpu_body), gpu_body),
        ("dra-pod", _post("/mutate", dra_body), dra_body),
    ]
    for _, head, body in scenarios[1:]:  # warm up: connections, CEL programs, lookup cache
        for _ in range(20):
            await client.request(head, body)
    await _run(client, *scenarios[0][1:], args.rate, 1.0, pid)  # warm up at rate: discarded
    gc.collect()
    gc.freeze()  # as the server does: the client's own collections are no server latency
    stalls: list[tuple[float, float]] = []
    watcher = asyncio.create_task(_watch_loop(stalls))
    print(
        f"rate {args.rate:.0f} req/s for {args.seconds:.0f} s per scenario, TLS on loopback, "
        f"server on CPU {args.server_cpu}, gc frozen after start: {not args.no_freeze_gc}, "
        f"real-time scheduling: {args.realtime}"
    )
    runs: list[list[Result]] = []
    for run in range(args.runs):
        results = []
        for name, head, body in scenarios:
            result = await _run(client, head, body, args.rate, args.seconds, pid)
            result.name = name
            results.append(result)
        print(f"run {run + 1}:")
        for result in results:
            print("  " + _row(result, results[0].p99 if result is not results[0] else None))
        runs.append(results)
    print(f"median of {args.runs} runs:")
    for i, (name, _, _) in enumerate(scenarios):
        p50 = statistics.median(r[i].p50 for r in runs)
        p99 = statistics.median(r[i].p99 for r in runs)
        ratio = statistics.median(r[i].p99 / r[0].p99 for r in runs)
        cpu = statistics.median(r[i].cpu_ms for r in runs)
        print(
            f"  {name:<10} p50={p50:6.2f} ms  p99={p99:6.2f} ms  server CPU {cpu:5.2f} ms/req  "
            f"p99 vs baseline {ratio:5.2f}x"
        )
    print(f"connections opened: {client.opened}")
    client.close()
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    gc.unfreeze()
    return runs, stalls


def _print_stalls(
    runs: list[list[Result]],
    client: list[tuple[float, float]],
    server: list[tuple[float, float]],
) -> None:
    print(f"loop stalls (ticks {STALL * 1e3:g} ms or more late: count/longest), server | client:")
    for i, results in enumerate(runs, 1):
        cells = [
            f"{r.name} {_stalls_in(server, *r.window)} | {_stalls_in(client, *r.window)}"
            for r in results
        ]
        print(f"  run {i}: " + ";  ".join(cells))


async def _flood(port: int, ca: trustme.CA, seconds: float) -> None:
    context = client_context(ca)
    stop = asyncio.Event()
    hostile: Counter[str] = Counter()
    hostile_body = json.dumps(
        review(_claim_pod("attacker", "hostile"), namespace="attacker")
    ).encode()

    async def attacker() -> None:
        client = Client("127.0.0.1", port, context)
        while not stop.is_set():
            status, data = await client.request(_post("/mutate", hostile_body), hostile_body)
            answer = json.loads(data)["response"] if status == 200 else {}
            hostile[str(answer.get("status", {}).get("code", status))] += 1
        client.close()

    async def benign() -> tuple[list[float], Counter[str]]:
        client = Client("127.0.0.1", port, context)
        latencies: list[float] = []
        outcomes: Counter[str] = Counter()
        start = time.perf_counter()
        i = 0
        while time.perf_counter() - start < seconds and i < BENIGN_TEMPLATES:
            body = json.dumps(review(_claim_pod("tenant", f"benign-{i}"), namespace="tenant"))
            data = body.encode()
            t0 = time.perf_counter()
            status, reply = await client.request(_post("/mutate", data), data)
            latencies.append(time.perf_counter() - t0)
            answer = json.loads(reply)["response"] if status == 200 else {}
            outcomes["allowed" if answer.get("allowed") else str(status)] += 1
            i += 1
            await asyncio.sleep(max(0.0, start + i * 0.1 - time.perf_counter()))
        client.close()
        return latencies, outcomes

    attackers = [asyncio.create_task(attacker()) for _ in range(50)]
    await asyncio.sleep(0.5)  # the flood is in
    latencies, outcomes = await benign()
    stop.set()
    await asyncio.gather(*attackers)
    q = statistics.quantiles(latencies, n=100)
    print(f"flood: 50 clients of namespace attacker, selector until the CEL limit, {seconds:g} s")
    print(
        f"benign DRA pods of namespace tenant (a new selector each): n={len(latencies)} "
        f"p50={statistics.median(latencies) * 1e3:.1f} ms p99={q[98] * 1e3:.1f} ms "
        f"max={max(latencies) * 1e3:.1f} ms outcomes={dict(outcomes)}"
    )
    print(f"hostile answers by status code: {dict(sorted(hostile.items()))}")


async def _hold_half_sent(port: int, context: ssl.SSLContext, seconds: float) -> None:
    """The flooding address (its own process, so the probe's client never waits on it)."""
    stop = time.monotonic() + seconds
    opened = refused = 0

    async def flooder() -> None:
        nonlocal opened, refused
        while time.monotonic() < stop:
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=context, local_addr=("127.0.0.2", 0)
                )
            except (OSError, ssl.SSLError):
                refused += 1
                await asyncio.sleep(0.01)
                continue
            opened += 1
            writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
            with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
                async with asyncio.timeout(max(0.0, stop - time.monotonic())):
                    await reader.read()  # until the server drops it at its header deadline
            writer.close()

    await asyncio.gather(*(flooder() for _ in range(200)))
    print(f"{opened} {refused}", flush=True)


async def _connection_flood(port: int, ca: trustme.CA, directory: Path, seconds: float) -> None:
    """One address (127.0.0.2) keeps 200 half-sent requests open, re-opening each as the
    server drops it; from 127.0.0.1, a /healthz and a GPU pod every 50 ms."""
    context = client_context(ca)
    ca.cert_pem.write_to_path(str(directory / "ca.crt"))
    flood = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--hold-half-sent",
        str(port),
        str(directory),
        str(seconds),
        stdout=subprocess.PIPE,
    )
    gpu_body, _ = _bodies()
    answered: Counter[str] = Counter()
    latencies: list[float] = []
    await asyncio.sleep(1.0)
    client = Client("127.0.0.1", port, context)
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < seconds - 2:
        for name, head, body in (
            ("healthz", _get("/healthz"), b""),
            ("gpu-pod", _post("/mutate", gpu_body), gpu_body),
        ):
            t0 = time.perf_counter()
            try:
                async with asyncio.timeout(5):
                    status, _ = await client.request(head, body)
            except (OSError, ssl.SSLError, TimeoutError, EOFError):
                answered[f"{name} failed"] += 1
                client.close()
                continue
            latencies.append(time.perf_counter() - t0)
            answered[f"{name} {status}"] += 1
        i += 1
        await asyncio.sleep(max(0.0, start + i * 0.05 - time.perf_counter()))
    client.close()
    out, _ = await flood.communicate()
    opened, refused = out.decode().split()
    q = statistics.quantiles(latencies, n=100)
    print(f"connection flood from 127.0.0.2: 200 half-sent requests held and re-opened, "
          f"{opened} connections accepted, {refused} refused, {seconds:g} s")  # fmt: skip
    print(
        f"from 127.0.0.1 every 50 ms: {dict(sorted(answered.items()))}; "
        f"p50={statistics.median(latencies) * 1e3:.1f} ms p99={q[98] * 1e3:.1f} ms"
    )


def _claim_pod(namespace: str, template_name: str) -> dict[str, Any]:
    main = container("main")
    main["resources"] = {"claims": [{"name": "c"}]}
    p = pod(main, resourceClaims=[{"name": "c", "resourceClaimTemplateName": template_name}])
    p["metadata"]["namespace"] = namespace
    return p


def _flood_objects() -> list[dict[str, Any]]:
    def namespaced(name: str, namespace: str, expression: str) -> dict[str, Any]:
        body = template(name, [exactly("gpu", "gpu.nvidia.com", expression)])
        body["metadata"]["namespace"] = namespace
        return body

    objects = [namespaced("hostile", "attacker", NESTED)]
    for i in range(BENIGN_TEMPLATES):
        expression = f"device.attributes['gpu.nvidia.com'].type == 'gpu' && {i} >= 0"
        objects.append(namespaced(f"benign-{i}", "tenant", expression))
    return objects


def _profile() -> None:
    """Where one admission's CPU goes, in process (no HTTP, no TLS): thread CPU per stage."""
    import cProfile
    import pstats

    from webhook._reviews import parse_review

    gpu_body, _ = _bodies()
    catalog = make_catalog()
    admission = Admission(Settings(), lambda: catalog)
    for _ in range(50):
        admission.decide(parse_review(gpu_body))
    n = 2000
    t0 = time.thread_time()
    for _ in range(n):
        parsed = parse_review(gpu_body)
    t1 = time.thread_time()
    for _ in range(n):
        answer = admission.decide(parsed)
    t2 = time.thread_time()
    for _ in range(n):
        json.dumps(answer, separators=(",", ":"))
    t3 = time.thread_time()
    print("GPU pod, CPU per admission in process (ms):")
    print(f"  JSON parse + review model  {(t1 - t0) / n * 1e3:.3f}")
    print(f"  decide                     {(t2 - t1) / n * 1e3:.3f}")
    print(f"  response JSON              {(t3 - t2) / n * 1e3:.3f}")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(500):
        admission.decide(parsed)
    profiler.disable()
    print("decide, by function (cumulative, top 15):")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)


def _serve(directory: Path, freeze_gc: bool, flood: bool, cpu: int) -> None:
    """The server side, in its own process on one CPU (client and server never share a GIL)."""
    os.sched_setaffinity(0, {cpu})
    with FakeKube() as fake:
        fake.add_yaml(CLASSES)
        fake.add(*TEMPLATES)
        if flood:
            fake.add(*_flood_objects())
        from providers.clouds.kube import KubeClient, kubeconfig_config

        kubeconfig = fake.kubeconfig(directory)
        api = KubeClient(kubeconfig_config({"KUBECONFIG": str(kubeconfig)}))
        catalog = make_catalog()
        resolver = KubeResolver(ttl_seconds=600, client=api)
        admission = Admission(Settings(), lambda: catalog, resolver)
        config = ServerConfig(
            host="127.0.0.1",
            port=0,
            cert_file=directory / "tls.crt",
            key_file=directory / "tls.key",
            shutdown_seconds=2,
            freeze_gc=freeze_gc,
        )
        thread = ServerThread(admission, config)
        with thread as server:
            pauses = _GcPauses()
            stalls: list[tuple[float, float]] = []
            watching = asyncio.run_coroutine_threadsafe(_watch_loop(stalls), thread.loop)
            print(server.port, flush=True)
            sys.stdin.read()  # until the parent closes stdin
            watching.cancel()
            pauses.stop()
            print(pauses.summary(), flush=True)
            print("stalls " + json.dumps(stalls), flush=True)


class _GcPauses:
    """Every cyclic collection in this process while serving: its generation and how long it
    held the GIL (nothing else runs meanwhile: it is a stall of every request in flight)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.pauses: list[tuple[int, float]] = []
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self.started))

    def stop(self) -> None:
        gc.callbacks.remove(self)

    def summary(self) -> str:
        parts = []
        for generation in (0, 1, 2):
            times = [t * 1e3 for g, t in self.pauses if g == generation]
            if times:
                parts.append(
                    f"gen{generation}: {len(times)} collections, max {max(times):.2f} ms, "
                    f"total {sum(times):.0f} ms"
                )
        return "server GC while serving: " + ("; ".join(parts) or "none")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-freeze-gc", action="store_true", help="leave the GC as it is")
    parser.add_argument(
        "--realtime", action="store_true", help="client and server under SCHED_FIFO (root)"
    )
    parser.add_argument("--profile", action="store_true", help="the admission's stages only")
    parser.add_argument("--flood", action="store_true", help="benign DRA pods under a flood")
    parser.add_argument(
        "--connection-flood", action="store_true", help="health checks beside one address's flood"
    )
    cpus = sorted(os.sched_getaffinity(0))
    parser.add_argument("--server-cpu", type=int, default=cpus[-1])
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--hold-half-sent", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile:
        _profile()
        return
    if args.hold_half_sent:
        port, directory, seconds = args.hold_half_sent
        context = ssl.create_default_context(cafile=str(Path(directory) / "ca.crt"))
        asyncio.run(_hold_half_sent(int(port), context, float(seconds)))
        return
    if args.serve:
        _serve(args.serve, not args.no_freeze_gc, args.flood, args.server_cpu)
        return
    if args.realtime:  # inherited by the server process and its threads
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    ca = trustme.CA()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        cert = ca.issue_cert("127.0.0.1")
        cert.private_key_pem.write_to_path(str(directory / "tls.key"))
        cert.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
        command = [sys.executable, __file__, "--serve", str(directory)]
        command += ["--server-cpu", str(args.server_cpu)]
        command += ["--no-freeze-gc"] * args.no_freeze_gc + ["--flood"] * args.flood
        with subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        ) as child:
            assert child.stdout is not None and child.stdin is not None
            port = int(child.stdout.readline())
            others = set(cpus) - {args.server_cpu}
            if others:
                os.sched_setaffinity(0, others)
            runs: list[list[Result]] = []
            client_stalls: list[tuple[float, float]] = []
            try:
                if args.flood:
                    asyncio.run(_flood(port, ca, args.seconds))
                elif args.connection_flood:
                    asyncio.run(_connection_flood(port, ca, directory, args.seconds))
                else:
                    runs, client_stalls = asyncio.run(_bench(port, ca, args, child.pid))
            finally:
                child.stdin.close()
                server_stalls: list[tuple[float, float]] = []
                for line in child.stdout.read().strip().splitlines():
                    if line.startswith("stalls "):
                        server_stalls = [tuple(x) for x in json.loads(line[7:])]
                    else:
                        print(line)  # the server's GC summary
                child.wait(30)
            if runs:
                _print_stalls(runs, client_stalls, server_stalls)


if __name__ == "__main__":
    main()
