"""Agent proxy benchmark: unary calls/s and p50/p99 at concurrency 1 and 4.

Three paths, measured in one run with the same Go ttrpc load generator (one connection, C
concurrent callers, like the shim): direct to the Go echo server (the pod VM), through our proxy
(a separate process on uvloop, as `peerpods serve` runs it), and through a pass-through proxy
written with Go's ttrpc. Prints ratios against the Go proxy, then the idle memory per proxy (RSS
growth of one process holding N idle connected proxies, divided by N).

    python tests/bench/proxy.py [--duration 2] [--idle 50]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder is sys.path[0], where select.py would shadow the standard
# library's `select`: the repository root takes its place.
sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.go.build import go_binary


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _start(args: list[str], ready: str) -> tuple[subprocess.Popen[str], str]:
    """Start a helper and wait for its ready line; returns the process and that line's rest."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(ready):
        proc.kill()
        proc.wait()
        raise SystemExit(f"{args[0]} did not start: {line!r}")
    return proc, line[len(ready) :].strip()


def _bench(target: list[str], concurrency: int, duration: float) -> dict[str, float]:
    out = subprocess.run(
        [
            str(go_binary("ttrpc-bench")),
            *target,
            "-concurrency",
            str(concurrency),
            "-duration",
            f"{duration}s",
            "-warmup",
            "0.5s",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


_PROXY_CHILD = """
import asyncio, sys
sys.path.insert(0, {root!r})
from adaptor.proxy import AgentProxy, tcp_dialer
from adaptor.ttrpc.loop import run

async def main() -> None:
    host, port = {host!r}, {port}
    paths = sys.argv[1:]
    proxies = [AgentProxy(p, tcp_dialer(host, port, None), sandbox_id=str(i))
               for i, p in enumerate(paths)]
    for p in proxies:
        await p.start()
        await p.connect(10)
    print("listening", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for p in proxies:
            await p.stop()

run(main())
"""


def _our_proxy(host: str, port: int, paths: list[str]) -> subprocess.Popen[str]:
    code = _PROXY_CHILD.format(root=str(ROOT), host=host, port=port)
    return _start([sys.executable, "-c", code, *paths], "listening")[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per measurement")
    parser.add_argument("--idle", type=int, default=50, help="idle proxies for the memory figure")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="pp-bench-"))
    echo, addr = _start(
        [str(go_binary("ttrpc-echo-server")), "-listen", "tcp:127.0.0.1:0"], "listening"
    )
    procs: list[subprocess.Popen[str]] = [echo]
    try:
        host, port = addr.rsplit(":", 1)
        ours_path = str(tmp / "ours.sock")
        go_path = str(tmp / "go.sock")
        ours = _our_proxy(host, int(port), [ours_path])
        procs.append(ours)
        gop, _ = _start(
            [str(go_binary("ttrpc-proxy")), "-socket", go_path, "-upstream", addr], "listening"
        )
        procs.append(gop)
        targets = {
            "direct": ["-addr", addr],
            "go-proxy": ["-socket", go_path],
            "our-proxy": ["-socket", ours_path],
        }
        _print_ratios(_measure(targets, args.duration))
        _measure_idle_memory(host, int(port), tmp, args.idle, procs)
    finally:
        for proc in reversed(procs):  # proxies before the server they are connected to
            proc.kill()
            proc.wait()
    return 0


def _measure(
    targets: dict[str, list[str]], duration: float
) -> dict[tuple[str, int], dict[str, float]]:
    """Each path at concurrency 1 and 4, printed as measured; the results by (path, C)."""
    results: dict[tuple[str, int], dict[str, float]] = {}
    print(f"{'path':<10} {'conc':>4} {'calls/s':>10} {'p50 us':>8} {'p99 us':>8}")
    for concurrency in (1, 4):
        for name, target in targets.items():
            r = _bench(target, concurrency, duration)
            results[(name, concurrency)] = r
            print(
                f"{name:<10} {concurrency:>4} {r['calls_per_s']:>10.0f} "
                f"{r['p50_us']:>8.0f} {r['p99_us']:>8.0f}"
            )
    return results


def _print_ratios(results: dict[tuple[str, int], dict[str, float]]) -> None:
    """Our proxy's calls/s against the Go proxy's and the direct path's."""
    for concurrency in (1, 4):
        ours_r = results[("our-proxy", concurrency)]["calls_per_s"]
        go_r = results[("go-proxy", concurrency)]["calls_per_s"]
        direct_r = results[("direct", concurrency)]["calls_per_s"]
        print(
            f"concurrency {concurrency}: ours/go-proxy = {ours_r / go_r:.2f}x, "
            f"ours/direct = {ours_r / direct_r:.2f}x, go-proxy/direct = {go_r / direct_r:.2f}x"
        )


def _measure_idle_memory(
    host: str, port: int, tmp: Path, idle: int, procs: list[subprocess.Popen[str]]
) -> None:
    """Idle memory: one process with 1 proxy vs one with 1 + `idle` proxies (both added to
    `procs`, for the caller to stop)."""
    base = _our_proxy(host, port, [str(tmp / "b0.sock")])
    procs.append(base)
    many_paths = [str(tmp / f"m{i}.sock") for i in range(idle + 1)]
    many = _our_proxy(host, port, many_paths)
    procs.append(many)
    time.sleep(0.5)
    delta = _rss_kib(many.pid) - _rss_kib(base.pid)
    print(
        f"idle memory per proxy: {delta / idle:.1f} KiB "
        f"({idle} idle connected proxies, RSS delta {delta} KiB)"
    )


if __name__ == "__main__":
    sys.exit(main())
