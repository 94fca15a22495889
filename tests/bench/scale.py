"""1,000 sandboxes on one adaptor with pod networking, on AWS (moto), as one worker node (root).

The static tunnel topology of the podnet tests (tests/podnet/topology.py): a worker netns with a
CNI bridge and one pod netns per sandbox. The adaptor runs as the worker's daemon (this script in
`--worker` mode: `adaptor.node.daemon.serve` on the aws provider against moto, both inside the
worker netns; every pod VM's forwarder is dialled at one loopback kata-agent). Each sandbox is
driven as Kata's Go shim drives it (tests/shim_emulator.py): CreateVM with the pod's netns,
StartVM, the agent connection with the pause container running; all of them concurrently, then
one StopVM each, concurrently.

Printed, for the adaptor process: RSS and open file descriptors with every sandbox running (and
before the first), CPU per sandbox lifecycle (create, start, stop: the adaptor's user+system
time over the run, divided by the sandboxes; moto runs as a process of its own, and its CPU is
printed apart), that CPU by thread, the EC2 calls per lifecycle, StartVM as the shim saw it and
StartVM's own share
(its time less the provider's VM create, measured inside the adaptor) at p50/p99 with the
tunnel setup's part of it; and after: sandbox records, VNI leases, VMs and tunnel parts left
(each must be 0). Goals: RSS <= 400 MiB, CPU <= 20 ms per lifecycle.

The baseline, in the same run on the same adaptor: --baseline sandboxes (20) first go through the
same lifecycle together, on a node with nothing else running; their CPU per lifecycle, and the
ratio of the full wave's to it, say how a sandbox's cost grows with the sandboxes beside it.

    sudo python tests/bench/scale.py [--sandboxes 1000] [--baseline 20] [--profile adaptor.pstat]

`--profile` writes the adaptor's CPU profile over every thread (yappi, installed apart; it slows
the adaptor several times over, so the figures of such a run are not the adaptor's own):
`python -m pstats adaptor.pstat`.
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
import contextvars
import importlib
import json
import os
import resource
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

AGENT_PORT_FILE = "agent-port"
STATS_FILE = "worker-stats.json"
PROFILE_FILE = "worker.pstat"
MOTO_PORT = 5050  # inside the worker netns: its own loopback
DRAIN_SECONDS = 600.0  # for the VM deletes an OK StopVM left running to finish


# --- the worker (the adaptor process) ---------------------------------------------------------


@dataclass
class _StartTimes:
    """Inside the adaptor: each StartVM's time and the parts spent elsewhere."""

    start: list[float] = field(default_factory=list)
    own: list[float] = field(default_factory=list)
    tunnel: list[float] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)  # EC2 operation -> calls
    current: contextvars.ContextVar[list[float] | None] = field(
        default_factory=lambda: contextvars.ContextVar("provider_time", default=None)
    )


def _timed(
    method: Callable[..., Awaitable[Any]], record: Callable[[float], None]
) -> Callable[..., Awaitable[Any]]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return await method(*args, **kwargs)
        finally:
            record(time.perf_counter() - began)

    return wrapper


def _start_owner() -> Any:
    """The class whose `start_vm` runs a StartVM: the sandbox manager's start part where it has
    one (adaptor.hypervisor.start), else the manager itself."""
    with contextlib.suppress(ModuleNotFoundError, AttributeError):
        return importlib.import_module("adaptor.hypervisor.start").Starts
    from adaptor.hypervisor.sandboxes import SandboxManager

    return SandboxManager


def _instrument(times: _StartTimes) -> None:
    """Wrap StartVM, the provider's create and the tunnel setup with timers (bench only)."""
    from adaptor.podnet import PodNet
    from providers.clouds.aws import AwsProvider

    starts = _start_owner()
    start_vm = starts.start_vm
    create = AwsProvider.create
    call = AwsProvider._call

    async def counted_call(self: Any, what: str, method: str, **kwargs: Any) -> Any:
        times.calls[method] = times.calls.get(method, 0) + 1
        return await call(self, what, method, **kwargs)

    async def timed_start(self: Any, sandbox_id: str) -> None:
        spent: list[float] = []
        token = times.current.set(spent)
        began = time.perf_counter()
        try:
            await start_vm(self, sandbox_id)
        finally:
            took = time.perf_counter() - began
            times.current.reset(token)
            times.start.append(took)
            times.own.append(took - sum(spent))

    def provider_time(took: float) -> None:
        spent = times.current.get()
        if spent is not None:
            spent.append(took)

    starts.start_vm = timed_start
    AwsProvider.create = _timed(create, provider_time)  # type: ignore[method-assign, assignment]
    PodNet.setup = _timed(PodNet.setup, times.tunnel.append)  # type: ignore[method-assign, assignment]
    AwsProvider._call = counted_call  # type: ignore[method-assign]


def worker(root: Path, agent_port: int, profile: bool) -> None:
    """The adaptor: `serve` on moto with pod networking, timing what StartVM spends."""
    from adaptor.node.daemon import serve
    from adaptor.runtime.logs import configure
    from providers.clouds.aws import AwsConfig, AwsProvider
    from providers.core.base import Instance
    from tests.adaptor.moto_daemon import IMAGE, moto_settings

    configure("warning", "text")
    _name_threads()
    times = _StartTimes()
    _instrument(times)
    # polling for a VM's state at the provider's own interval (the tests' helper polls every
    # 50 ms: with a thousand VMs pending, that polling would be most of the CPU measured)
    config = AwsConfig(
        region="us-east-1",
        image_id=IMAGE,
        zones=("us-east-1a", "us-east-1b"),
        endpoint_url=f"http://127.0.0.1:{MOTO_PORT}",
    )
    provider = AwsProvider(config, "scale-owner")

    def resolve(instance: Instance) -> tuple[str, int]:
        return "127.0.0.1", agent_port

    settings = moto_settings(
        root,
        "scale-owner",
        proxy_timeout_seconds=120,
        gc_interval_seconds=0,
        shutdown_grace_seconds=5,
        shutdown_drain_seconds=5,
    )
    with _profiled(root / PROFILE_FILE) if profile else contextlib.nullcontext():
        asyncio.run(serve(settings, provider=provider, resolve_endpoint=resolve))
    stats = {"start": times.start, "own": times.own, "tunnel": times.tunnel, "calls": times.calls}
    (root / STATS_FILE).write_text(json.dumps(stats))


def _name_threads() -> None:
    """Each OS thread takes its Python thread's name (PR_SET_NAME keeps 15 bytes), so the node
    can read from /proc whose CPU is whose (bench only)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    run = threading.Thread.run

    def named_run(self: threading.Thread) -> None:
        libc.prctl(15, self.name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        run(self)

    threading.Thread.run = named_run  # type: ignore[method-assign]


@contextlib.contextmanager
def _profiled(path: Path) -> Iterator[None]:
    """CPU time by function over every thread of the adaptor (yappi's CPU clock)."""
    import yappi  # type: ignore[import-not-found, import-untyped, unused-ignore]

    yappi.set_clock_type("cpu")
    yappi.start(builtins=True)
    try:
        yield
    finally:
        yappi.stop()
        yappi.get_func_stats().save(str(path), type="pstat")


# --- the node ---------------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[float, float, int]:
    """(CPU seconds user+system, RSS MiB, open fds) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = int(fields[21]) * resource.getpagesize() / 2**20
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return cpu, rss, fds


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds by thread name (a pool's numbered threads summed under its prefix; the main
    thread, the event loop's, keeps the interpreter's name), of the threads alive now."""
    found: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            head, tail = (task / "stat").read_text().rsplit(")", 1)
            name = head.split("(", 1)[1].rstrip("0123456789").rstrip("_-")
            fields = tail.split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            found[name] = found.get(name, 0.0) + cpu
    return found


def _child(command: str) -> int | None:
    """This process's child whose command line holds `command`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == os.getpid() and command in (entry / "cmdline").read_text():
                return int(entry.name)
    return None


def _add_pod(topo: Any, i: int) -> str:
    """A pod netns on the worker's CNI bridge (past the podnet tests' 240 addresses: /16)."""
    from tests.podnet.topology import POD_MTU, path

    pod = topo._create(f"P{i}")
    topo._veth(pod, "eth0", topo.ns("W"), f"w-p{i}", POD_MTU)
    topo._enslave(topo.ns("W"), f"w-p{i}", "cni0")
    topo._address(pod, "eth0", f"10.128.{i // 200 + 1}.{i % 200 + 10}/16", "10.128.0.1")
    return str(path(pod))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(values: list[float]) -> str:
    if not values:
        return "none"
    return f"p50 {statistics.median(values) * 1e3:.1f} ms, p99 {pct(values, 0.99) * 1e3:.1f} ms"


async def node(sandboxes: int, baseline: int, profile: Path | None) -> int:
    from tests.adaptor.daemon_proc import ANNOTATIONS, ServeProcess
    from tests.podnet.leftovers import kernel_leftovers, nothing_left
    from tests.podnet.test_restart_no_leak import agents, bound, live_vms, moto_in
    from tests.podnet.topology import Topology
    from tests.shim_emulator import ShimEmulator

    class Worker(ServeProcess):
        agent_port: int = 0

        def argv(self) -> list[str]:
            argv = [sys.executable, __file__, "--worker", str(self.root), str(self.agent_port)]
            return argv + (["--profile", "-"] if profile else [])

    topo = await asyncio.to_thread(lambda: Topology().build())
    root = Path(tempfile.mkdtemp(prefix="pp-scale-"))
    try:
        began = time.perf_counter()
        pods = [await asyncio.to_thread(_add_pod, topo, i) for i in range(sandboxes)]
        print(f"topology             {sandboxes} pod netns on the worker's bridge in "
              f"{time.perf_counter() - began:.0f} s")  # fmt: skip
        listener = bound(topo.worker, ("127.0.0.1", 0))
        aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        proc = Worker(root, [], netns=topo.worker, env=aws)
        proc.agent_port = listener.getsockname()[1]
        with moto_in(topo.worker):
            async with agents([listener]):
                await proc.start()
                assert proc.process is not None
                pid = proc.process.pid
                moto = _child("moto.server")
                _, rss0, fds0 = _proc_stat(pid)
                shims = [
                    ShimEmulator(
                        proc.socket,
                        f"{i:064x}",
                        {**ANNOTATIONS, "io.kubernetes.cri.sandbox-name": f"pod-{i}"},
                        netns=netns,
                    )
                    for i, netns in enumerate(pods)
                ]
                started_at: list[float] = []

                async def run(shim: ShimEmulator) -> None:
                    await shim.create_vm()
                    t0 = time.perf_counter()
                    await shim.start_vm()
                    started_at.append(time.perf_counter() - t0)
                    await shim.start_pause()

                async def drain() -> None:
                    # an OK StopVM may leave the VM's delete to finish in the background
                    # (durably): the sandbox is forgotten when it has
                    deadline = time.monotonic() + DRAIN_SECONDS
                    while proc.rows("SELECT id FROM sandboxes") and time.monotonic() < deadline:  # noqa: ASYNC110 - another process's database
                        await asyncio.sleep(0.2)

                # the baseline: a few sandboxes alone, the same lifecycle, the same adaptor
                alone = [
                    ShimEmulator(
                        proc.socket,
                        f"b{i:063x}",
                        {**ANNOTATIONS, "io.kubernetes.cri.sandbox-name": f"alone-{i}"},
                        netns=pods[i],
                    )
                    for i in range(baseline)
                ]
                base0 = _proc_stat(pid)[0]
                await asyncio.gather(*(run(s) for s in alone))
                await asyncio.gather(*(s.stop_vm() for s in alone))
                for shim in alone:
                    await shim.close()
                await drain()
                base_cpu = (_proc_stat(pid)[0] - base0) / max(baseline, 1) * 1e3
                started_at.clear()
                cpu0, _, _ = _proc_stat(pid)
                threads0 = _thread_cpu(pid)
                moto0 = _proc_stat(moto)[0] if moto else 0.0

                began = time.perf_counter()
                outcomes = await asyncio.gather(*(run(s) for s in shims), return_exceptions=True)
                up = time.perf_counter() - began
                failures = [o for o in outcomes if isinstance(o, BaseException)]
                _, rss_up, fds_up = _proc_stat(pid)
                running = len(proc.rows("SELECT id FROM sandboxes WHERE state='running'"))
                began = time.perf_counter()
                stops = await asyncio.gather(*(s.stop_vm() for s in shims))
                down = time.perf_counter() - began
                for shim in shims:
                    await shim.close()
                await drain()
                drained = time.perf_counter() - began
                cpu1, rss_after, fds_after = _proc_stat(pid)
                threads1 = _thread_cpu(pid)
                moto1 = _proc_stat(moto)[0] if moto else 0.0
                records = len(proc.rows("SELECT id FROM sandboxes"))
                leases = len(proc.rows("SELECT * FROM leases"))
                vms = await asyncio.to_thread(live_vms, topo.worker)
                await proc.terminate(60)
        stats = json.loads((root / STATS_FILE).read_text())
        if profile:
            await asyncio.to_thread(shutil.copyfile, root / PROFILE_FILE, profile)
        left = await asyncio.to_thread(kernel_leftovers, topo.worker, pods)
    finally:
        await asyncio.to_thread(topo.close)
    cpu_per = (cpu1 - cpu0) / sandboxes * 1e3
    print(f"sandboxes            {sandboxes} concurrent, pod networking on, aws provider on moto")
    print(f"started              {running} running, {len(failures)} failed in {up:.1f} s; "
          f"stopped in {down:.1f} s ({sum(1 for s in stops if s.ok)} StopVM ok), every record "
          f"gone {drained:.1f} s after the first StopVM")  # fmt: skip
    for failure in failures[:3]:
        print(f"  failure            {type(failure).__name__}: {failure}")
    print(f"adaptor RSS          {rss0:.0f} MiB idle, {rss_up:.0f} MiB with all running, "
          f"{rss_after:.0f} MiB after")  # fmt: skip
    print(f"adaptor open fds     {fds0} idle, {fds_up} with all running, {fds_after} after")
    print(f"adaptor CPU          {cpu_per:.1f} ms per sandbox lifecycle (create, start, stop)"
          f"{' (profiled)' if profile else ''}")  # fmt: skip
    if baseline:
        print(f"  baseline           {base_cpu:.1f} ms per lifecycle with {baseline} sandboxes "
              f"alone; ratio {cpu_per / base_cpu:.2f}")  # fmt: skip
    by_thread = {n: c - threads0.get(n, 0.0) for n, c in threads1.items()}
    print("  by thread (alive)  " + ", ".join(
        f"{name} {spent / sandboxes * 1e3:.1f} ms"
        for name, spent in sorted(by_thread.items(), key=lambda kv: -kv[1]) if spent > 0
    ))  # fmt: skip
    calls = stats["calls"]  # counted over both waves
    lives = sandboxes + baseline
    print(f"EC2 calls            {sum(calls.values()) / lives:.2f} per lifecycle: " + ", ".join(
        f"{method} {n / lives:.2f}" for method, n in sorted(calls.items())
    ))  # fmt: skip
    print(f"moto CPU             {(moto1 - moto0) / sandboxes * 1e3:.1f} ms per lifecycle "
          "(its own process, not the adaptor's)")  # fmt: skip
    print(f"StartVM (shim)       {ms(started_at)}")
    # the baseline's starts were recorded first
    print(f"StartVM own share    {ms(stats['own'][baseline:])} (less the provider's VM create)")
    print(f"  tunnel setup       {ms(stats['tunnel'][baseline:])}")
    print(f"left after           {records} records, {leases} leases, {vms} VMs, "
          f"tunnel parts {left}")  # fmt: skip
    clean = not failures and records == leases == vms == 0 and nothing_left(left)
    return 0 if clean else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=1000)
    parser.add_argument("--baseline", type=int, default=20, help="sandboxes alone first (0: none)")
    parser.add_argument("--profile", type=Path, help="write the adaptor's CPU profile (pstat)")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), int(args.worker[1]), args.profile is not None)
        return
    if os.geteuid() != 0:
        raise SystemExit("scale.py needs root (network namespaces)")
    if not 1 <= args.sandboxes <= 8000:
        parser.error("--sandboxes must be 1..8000")
    if not 0 <= args.baseline <= args.sandboxes:
        parser.error("--baseline must be 0..--sandboxes")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "testing")
    with contextlib.suppress(ValueError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    profile = args.profile.resolve() if args.profile else None
    sys.exit(asyncio.run(node(args.sandboxes, args.baseline, profile)))


if __name__ == "__main__":
    main()
