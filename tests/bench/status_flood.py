"""What a flood of status listings costs the shims' CreateVM.

A `serve` (static provider, agent TLS off) holds N recorded sandboxes (CreateVM only: each is a
record). Then, while C clients (each a process of its own) ask `GET /v1/sandboxes` again as soon
as answered, CreateVM
calls are made one after another (each on a new connection, as the shim makes them, each
removed again with StopVM) and timed. Printed: CreateVM's p50/p99/max without the flood and
under it, and how many listings were answered meanwhile.

`--source DIR` runs the `serve` of another checkout (e.g. one made with `git worktree add`),
to compare versions on the same machine:

    python tests/bench/status_flood.py [--sandboxes 1000] [--clients 16] [--calls 200]
        [--source DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder is sys.path[0], where select.py would shadow the standard
# library's `select`: the repository root takes its place.
ROOT = Path(__file__).resolve().parents[2]
sys.path[0] = str(ROOT)

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import tempfile
import time

import httpx

from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from tests.adaptor.daemon_proc import ANNOTATIONS, hypervisor_call


async def start_serve(source: Path, root: Path) -> tuple[asyncio.subprocess.Process, str]:
    """`peerpods serve` of the checkout at `source`, over `root`: (process, status URL)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERPODS_")}
    env["PYTHONPATH"] = str(source)
    log = (root / "serve.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "adaptor.cli.main",
        "--log-level",
        "warning",
        "serve",
        "--socket",
        str(root / "hv.sock"),
        "--pods-dir",
        str(root / "pods"),
        "--state-dir",
        str(root / "state"),
        "--status-address",
        "127.0.0.1:0",
        "--provider",
        "static",
        "--static-endpoints",
        "127.0.0.1:1",
        "--no-agent-tls",
        "--gc-interval",
        "0s",
        stdout=subprocess.PIPE,
        stderr=log,
        cwd=source,
        env=env,
    )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
    if "status API " not in line:
        raise RuntimeError(f"serve did not start: {line!r}")
    return process, line.split("status API ", 1)[1].rstrip(")\n")


async def create_one(socket: str, sandbox_id: str) -> float:
    request = pb.CreateVMRequest(id=sandbox_id, annotations=ANNOTATIONS)
    started = time.perf_counter()
    await hypervisor_call(socket, "CreateVM", request)
    took = time.perf_counter() - started
    await hypervisor_call(socket, "StopVM", pb.StopVMRequest(id=sandbox_id))
    return took


async def timed_creates(socket: str, calls: int, prefix: str) -> list[float]:
    return [await create_one(socket, f"{prefix}{i:05d}") for i in range(calls)]


def figures(name: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (
        f"{name}: CreateVM p50 {statistics.median(ms):.2f} ms, p99 {p99:.2f} ms, "
        f"max {ms[-1]:.2f} ms ({len(ms)} calls)"
    )


def flood(url: str) -> None:
    """One flooding client, in a process of its own (its parsing must not slow the timed
    calls): asks for the listing again as soon as answered, until SIGTERM; prints its count."""
    answered = refused = 0
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    with httpx.Client(base_url=url, timeout=60) as http:
        while not stopping:
            status = http.get("/v1/sandboxes").status_code
            if status == 429:  # rate limited: asked again at once, as a flood does
                refused += 1
                continue
            if status != 200:
                raise RuntimeError(f"GET /v1/sandboxes: {status}")
            answered += 1
            if answered == 1:
                print("up", flush=True)  # the bench times CreateVM once every client is up
    print(answered, refused, flush=True)


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        root = Path(directory)
        process, url = await start_serve(args.source, root)
        socket = str(root / "hv.sock")
        try:
            for i in range(args.sandboxes):
                request = pb.CreateVMRequest(id=f"held{i:05d}", annotations=ANNOTATIONS)
                await hypervisor_call(socket, "CreateVM", request)
            quiet = await timed_creates(socket, args.calls, "quiet")
            clients = [
                await asyncio.create_subprocess_exec(
                    sys.executable, __file__, "--flood-url", url, stdout=subprocess.PIPE
                )
                for _ in range(args.clients)
            ]
            try:
                for client in clients:  # the flood is on once each has had an answer
                    assert client.stdout is not None
                    await asyncio.wait_for(client.stdout.readline(), 120)
                loaded = await timed_creates(socket, args.calls, "flood")
            finally:
                for client in clients:
                    client.terminate()
                counts = [(await c.communicate())[0].split() or [b"0", b"0"] for c in clients]
            print(f"source {args.source}, {args.sandboxes} sandboxes, {args.clients} clients")
            print(figures("without the flood", quiet))
            print(figures("under the flood", loaded))
            answered = sum(int(c[0]) for c in counts)
            refused = sum(int(c[1]) for c in counts if len(c) > 1)
            print(f"listings meanwhile: {answered} answered, {refused} refused (429)")
        finally:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--source", type=Path, default=ROOT)
    parser.add_argument("--flood-url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flood_url:
        flood(args.flood_url)
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
