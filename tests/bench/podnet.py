"""Pod network benchmark (needs root): tunnel setup and teardown per pod against a baseline in
the same run, TCP throughput against a plain veth, and what races leave behind.

Builds the test topology (tests/podnet/topology.py: a worker netns with a CNI bridge, pod netns,
pod VM netns), then:
- CreateVM's netns inspection, and setup and teardown per pod (PodNet.inspect, .setup and
  .teardown as CreateVM, StartVM and StopVM call them), p50/p99 over N pods one at a time, wall
  and CPU time; alternating with each of them, the same tunnel on another pod built and removed
  through pyroute2's generic calls (tests/bench/podnet_pyroute2.py, the code before it packed
  its own messages): the baseline, and the ratio new/baseline of each figure. `teardown` is
  what StopVM waits for before it deletes the VM: the pod's traffic cut off; `vxlan1`'s
  deletion, which the kernel holds for an RCU grace period, and then the NOTRACK element's go on
  meanwhile, and StopVM waits for their end only after the VM's delete (PodNet.deleted). The line
  `teardown, gone` is the time from the teardown's start until the device and rules are gone:
  what StopVM would wait for if the VM's delete took no time (the baseline removes everything
  at once);
- TCP throughput (one stream) from the peer on the worker's bridge: to a pod's IP inside its pod
  VM netns through the tunnel (pod VM side built from apf.json), and to a pod without a tunnel
  over its plain veth on the same bridge with the same MTU; alternated (--tcp-rounds), medians.
  The ratio is tunnel / veth; the offloads of vxlan1 are printed with it. A third stream, from
  the worker to the pod VM over the underlay without a tunnel (the same veths and bridge the
  tunnel crosses), splits the gap: the test topology's longer path, and what encapsulation,
  decapsulation and the redirects cost on top;
- leftovers: VXLAN devices, ingress qdiscs, redirects, NOTRACK elements, records and VNI leases
  after the pods above are torn down, and after --race sandboxes were started and stopped
  concurrently through the sandbox manager (StopVM 0-300 ms after StartVM).

Goals: setup p99 <= 10 ms with CPU <= 5 ms, inspection p99 <= 10 ms, teardown p99 <= 20 ms,
TCP ratio >= 0.9, every leftover count 0 (counted once every deletion has ended).

    sudo python tests/bench/podnet.py [--pods 50] [--seconds 2] [--race 200] [--tcp-rounds 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable

from adaptor.podnet import VNI_POOL, PodNet, PodNetSettings, Tunnel
from adaptor.state import StateStore
from tests.bench import podnet_pyroute2 as baseline
from tests.podnet.leftovers import kernel_leftovers
from tests.podnet.topology import Topology, podvm_setup, sock

CHUNK = 256 * 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _ksoftirqd_seconds() -> float:
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if "(ksoftirqd/" in text:
            fields = text.rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def stream(server_ns: str, server_ip: str, client_ns: str, seconds: float) -> tuple[float, float]:
    """One TCP stream client -> server for `seconds`: (Gbit/s, CPU seconds per GB)."""
    received = [0]
    with sock(server_ns) as listener, sock(client_ns) as client:
        listener.bind((server_ip, 0))
        listener.listen(1)

        def sink() -> None:
            conn, _ = listener.accept()
            buffer = bytearray(CHUNK)
            with conn:
                while n := conn.recv_into(buffer):
                    received[0] += n

        thread = threading.Thread(target=sink)
        thread.start()
        client.connect((server_ip, listener.getsockname()[1]))
        payload = b"\0" * CHUNK
        soft, cpu, start = _ksoftirqd_seconds(), time.process_time(), time.monotonic()
        while time.monotonic() - start < seconds:
            client.sendall(payload)
        client.shutdown(2)
        thread.join()
        elapsed = time.monotonic() - start
        spent = time.process_time() - cpu + _ksoftirqd_seconds() - soft
    return received[0] * 8 / elapsed / 1e9, spent / (received[0] / 1e9)


def apf(tunnel: Tunnel) -> dict[str, object]:
    text = json.dumps(
        {"pod-network": tunnel.network.to_dict(), "pod-namespace": "b", "pod-name": "p"}
    )
    decoded: dict[str, object] = json.loads(text)
    return decoded


def offloads(netns: str, device: str) -> str:
    """The offloads that decide throughput, as ethtool -k shows them (or why not)."""
    wanted = ("tx-checksumming", "generic-segmentation-offload", "generic-receive-offload")
    name = os.path.basename(netns)
    try:
        out = subprocess.run(
            ["ip", "netns", "exec", name, "ethtool", "-k", device],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"(ethtool -k unavailable: {exc})"
    found = [line.strip() for line in out.splitlines() if line.split(":")[0] in wanted]
    return "; ".join(found)


class Timed:
    """Wall and CPU milliseconds of each call."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    async def run(self, call: Callable[[], object]) -> object:
        t0, c0 = time.perf_counter(), time.process_time()
        result = call()
        if asyncio.iscoroutine(result):
            result = await result
        self.wall.append((time.perf_counter() - t0) * 1000)
        self.cpu.append((time.process_time() - c0) * 1000)
        return result


async def lifecycle(pods: int, seconds: float, rounds: int) -> dict[str, object]:
    topo = Topology()
    figures: dict[str, object] = {}
    try:
        await asyncio.to_thread(topo.build)
        pod_list = [await asyncio.to_thread(topo.add_pod) for _ in range(2 * pods)]
        vm_list = [await asyncio.to_thread(topo.add_vm) for _ in range(2 * pods)]
        with tempfile.TemporaryDirectory() as state:
            store = await StateStore.open(state)
            podnet = PodNet(PodNetSettings(), store, host_netns=topo.worker)
            try:
                inspect, setup, teardown, gone = Timed(), Timed(), Timed(), Timed()
                base_setup, base_teardown = Timed(), Timed()
                ours, theirs = await _start_both_ways(
                    topo, podnet, pod_list, vm_list, pods, (inspect, setup, base_setup)
                )
                figures |= await _throughput(topo, pod_list, vm_list, ours[0], seconds, rounds)
                figures["offloads"] = await asyncio.to_thread(offloads, pod_list[0][0], "vxlan1")
                await _stop_both_ways(topo, podnet, ours, theirs, (teardown, gone, base_teardown))
                counts = await asyncio.to_thread(
                    kernel_leftovers, topo.worker, [p for p, _ip in pod_list]
                )
                counts["VNI leases"] = len(await store.leases(VNI_POOL))
                figures["leftovers"] = counts
            finally:
                await podnet.close()
                await store.close()
        figures["timed"] = {
            "inspect (CreateVM)": (inspect, None),
            "setup (StartVM)": (setup, base_setup),
            "teardown (StopVM)": (teardown, base_teardown),
            "teardown, gone": (gone, base_teardown),
        }
    finally:
        await asyncio.to_thread(topo.close)
    return figures


async def _start_both_ways(
    topo: Topology,
    podnet: PodNet,
    pod_list: list[tuple[str, str]],
    vm_list: list[tuple[str, str, str]],
    pods: int,
    timers: tuple[Timed, Timed, Timed],
) -> tuple[list[Tunnel], list[Tunnel]]:
    """`pods` tunnels set up by PodNet and as many by the baseline, alternating, each timed."""
    inspect, setup, base_setup = timers
    ours, theirs = [], []
    for i in range(pods):
        new, old = 2 * i, 2 * i + 1
        inspected = await inspect.run(lambda n=new: podnet.inspect(f"sb{n}", pod_list[n][0]))
        assert isinstance(inspected, Tunnel)
        ready = await setup.run(lambda t=inspected, n=new: podnet.setup(t, (vm_list[n][2],)))
        assert isinstance(ready, Tunnel)
        ours.append(ready)
        other = await podnet.inspect(f"sb{old}", pod_list[old][0])
        assert other is not None
        remote = vm_list[old][2]
        await base_setup.run(
            lambda t=other, r=remote: asyncio.to_thread(
                baseline.setup, topo.worker, t.netns, t.network, r
            )
        )
        theirs.append(other.evolve(remote=remote))
    return ours, theirs


async def _throughput(
    topo: Topology,
    pod_list: list[tuple[str, str]],
    vm_list: list[tuple[str, str, str]],
    first: Tunnel,
    seconds: float,
    rounds: int,
) -> dict[str, object]:
    """Throughput: the peer to pod 0's IP through its tunnel, and to a pod that has no tunnel
    over its plain veth (same bridge, same MTU), and the underlay, alternating, medians."""
    vm0, podns0, vm0_ip = vm_list[0]
    await asyncio.to_thread(podvm_setup, vm0, podns0, apf(first))
    plain, plain_ip = await asyncio.to_thread(topo.add_pod)
    veth_runs, tunnel_runs, underlay_runs = [], [], []
    for _ in range(rounds):
        underlay_runs.append(
            (await asyncio.to_thread(stream, vm0, vm0_ip, topo.worker, seconds))[0]
        )
        veth_runs.append((await asyncio.to_thread(stream, plain, plain_ip, topo.peer, seconds))[0])
        tunnel_runs.append(
            (await asyncio.to_thread(stream, podns0, pod_list[0][1], topo.peer, seconds))[0]
        )
    return {
        "veth": statistics.median(veth_runs),
        "tunnel": statistics.median(tunnel_runs),
        "underlay": statistics.median(underlay_runs),
    }


async def _stop_both_ways(
    topo: Topology,
    podnet: PodNet,
    ours: list[Tunnel],
    theirs: list[Tunnel],
    timers: tuple[Timed, Timed, Timed],
) -> None:
    """Every tunnel torn down, ours by PodNet and the baseline's by it, each timed; ours also
    until its device is gone."""
    teardown, gone, base_teardown = timers

    async def until_gone(tunnel: Tunnel) -> None:
        await teardown.run(lambda: podnet.teardown(tunnel))
        await podnet.deleted(tunnel.vni)

    for mine, other in zip(ours, theirs, strict=True):
        await gone.run(lambda t=mine: until_gone(t))
        await base_teardown.run(
            lambda t=other: asyncio.to_thread(
                baseline.teardown, topo.worker, t.netns, t.network, t.remote
            )
        )
        await podnet.release_vni(mine.vni)
        await podnet.release_vni(other.vni)


async def race(count: int) -> dict[str, int]:
    """`count` sandboxes created, started and stopped at once through the sandbox manager."""
    from tests.podnet.test_manager import close, manager
    from tests.podnet.test_races import SlowPool, left, start_then_stop

    topo = Topology()
    try:
        await asyncio.to_thread(topo.build)
        pods = [(await asyncio.to_thread(topo.add_pod))[0] for _ in range(count)]
        vms = [await asyncio.to_thread(topo.add_vm) for _ in range(count)]
        with tempfile.TemporaryDirectory() as root:
            store = await StateStore.open(Path(root) / "state")
            pool = SlowPool()
            m = manager(Path(root), store, pool, topo.worker)
            rng = random.Random(count)
            try:
                for i in range(count):
                    pool.addresses[f"sb{i}"] = vms[i][2]
                await asyncio.gather(
                    *(
                        start_then_stop(m, f"sb{i}", pods[i], rng.uniform(0, 0.3))
                        for i in range(count)
                    )
                )
                return await left(store, topo, pods)
            finally:
                await close(m)
                await store.close()
    finally:
        await asyncio.to_thread(topo.close)


def report(pods: int, figures: dict[str, object], raced: dict[str, int] | None, n: int) -> None:
    load = os.getloadavg()
    print(f"pods: {pods} (and {pods} baseline)  cpus: {os.cpu_count()}  load avg: {load[0]:.2f}")
    timed = figures["timed"]
    assert isinstance(timed, dict)
    for name, (new, old) in timed.items():
        for kind, values, base in (
            ("wall", new.wall, old.wall if old else None),
            ("CPU ", new.cpu, old.cpu if old else None),
        ):
            line = (
                f"{name:20s} {kind} p50 {statistics.median(values):6.2f} ms  "
                f"p99 {percentile(values, 0.99):6.2f} ms"
            )
            if base:
                line += (
                    f"   baseline p50 {statistics.median(base):6.2f} p99 "
                    f"{percentile(base, 0.99):6.2f} ms   ratio p50 "
                    f"{statistics.median(values) / statistics.median(base):.2f} p99 "
                    f"{percentile(values, 0.99) / percentile(base, 0.99):.2f}"
                )
            print(line)
    veth, tunnel = figures["veth"], figures["tunnel"]
    assert isinstance(veth, float) and isinstance(tunnel, float)
    print(f"TCP peer -> pod IP, plain veth:   {veth:6.2f} Gbit/s")
    print(f"TCP peer -> pod IP, VXLAN tunnel: {tunnel:6.2f} Gbit/s")
    underlay = figures["underlay"]
    assert isinstance(underlay, float)
    print(
        f"TCP worker -> pod VM, underlay:   {underlay:6.2f} Gbit/s (the tunnel's path, no tunnel)"
    )
    print(f"ratio tunnel/veth: {tunnel / veth:.2f}   vxlan1 offloads: {figures['offloads']}")
    print(
        f"of which the underlay's longer path: underlay/veth {underlay / veth:.2f}; "
        f"encapsulation and redirects: tunnel/underlay {tunnel / underlay:.2f}"
    )
    print(f"leftovers after {pods} + {pods} pods: {figures['leftovers']}")
    if raced is not None:
        print(f"leftovers after {n} concurrent start/stop races: {raced}")
    print(
        "goals: setup p99 <= 10 ms, CPU <= 5 ms; inspect p99 <= 10 ms; teardown p99 <= 20 ms; "
        "TCP ratio >= 0.9; every leftover 0"
    )


async def main(pods: int, seconds: float, racing: int, rounds: int) -> None:
    figures = await lifecycle(pods, seconds, rounds)
    raced = await race(racing) if racing else None
    report(pods, figures, raced, racing)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--race", type=int, default=200)
    parser.add_argument("--tcp-rounds", type=int, default=3, help="alternations veth/tunnel")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("podnet benchmark: needs root for network namespaces")
    asyncio.run(main(args.pods, args.seconds, args.race, args.tcp_rounds))
