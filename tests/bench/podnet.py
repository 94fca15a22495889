"""Pod network benchmark (needs root): tunnel setup and teardown per pod, and TCP throughput.

Builds the test topology (tests/podnet/topology.py: a worker netns with a CNI bridge, pod netns,
pod VM netns), then:
- setup and teardown time per pod, p50/p99 over N pods, one pod at a time (PodNet.setup and
  .teardown as StartVM and StopVM call them: NOTRACK rules, VXLAN device, two tc redirects);
  inspect (CreateVM's share) is printed too;
  their CPU time is printed too: on a loaded machine wall time is mostly waiting for a core;
- TCP throughput (one stream) from the peer on the worker's bridge: to a pod's IP inside its pod
  VM netns through the tunnel (pod VM side built from apf.json), and to a pod without a tunnel
  over its plain veth on the same bridge with the same MTU; alternated, median of three each,
  in the same run. The ratio is tunnel / veth. Goals: setup p99 <= 50 ms, ratio >= 0.8.

    sudo python tests/bench/podnet.py [--pods 50] [--seconds 2]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import threading
import time

from adaptor.podnet import PodNet, PodNetSettings, Tunnel
from adaptor.state import StateStore
from tests.podnet.topology import Topology, podvm_setup, sock

CHUNK = 256 * 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def throughput_gbps(server_ns: str, server_ip: str, client_ns: str, seconds: float) -> float:
    """Bytes a single TCP stream carries from client to server in `seconds`, as Gbit/s."""
    received = [0]
    with sock(server_ns) as listener, sock(client_ns) as client:
        listener.bind((server_ip, 0))
        listener.listen(1)

        def sink() -> None:
            conn, _ = listener.accept()
            buffer = bytearray(CHUNK)
            with conn:
                while True:
                    n = conn.recv_into(buffer)
                    if not n:
                        return
                    received[0] += n

        thread = threading.Thread(target=sink)
        thread.start()
        client.connect((server_ip, listener.getsockname()[1]))
        payload = b"\0" * CHUNK
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            client.sendall(payload)
        client.shutdown(2)
        thread.join()
        elapsed = time.monotonic() - start
    return received[0] * 8 / elapsed / 1e9


def apf(tunnel: Tunnel) -> dict[str, object]:
    text = json.dumps(
        {"pod-network": tunnel.network.to_json(), "pod-namespace": "b", "pod-name": "p"}
    )
    decoded: dict[str, object] = json.loads(text)
    return decoded


async def main(pods: int, seconds: float) -> None:
    topo = Topology()
    try:
        await asyncio.to_thread(topo.build)
        pod_list = [await asyncio.to_thread(topo.add_pod) for _ in range(pods)]
        vm_list = [await asyncio.to_thread(topo.add_vm) for _ in range(pods)]
        with tempfile.TemporaryDirectory() as state:
            store = await StateStore.open(state)
            podnet = PodNet(PodNetSettings(), store, host_netns=topo.worker)
            try:
                inspect_ms, setup_ms, teardown_ms = [], [], []
                setup_cpu_ms, teardown_cpu_ms = [], []
                tunnels = []
                for i, (pod, _ip) in enumerate(pod_list):
                    t0 = time.perf_counter()
                    inspected = await podnet.inspect(f"sb{i}", pod)
                    t1, c1 = time.perf_counter(), time.process_time()
                    assert inspected is not None
                    tunnels.append(await podnet.setup(inspected, (vm_list[i][2],)))
                    t2 = time.perf_counter()
                    setup_cpu_ms.append((time.process_time() - c1) * 1000)
                    inspect_ms.append((t1 - t0) * 1000)
                    setup_ms.append((t2 - t1) * 1000)
                # Throughput: the peer to pod 0's IP through its tunnel, and to a pod that has no
                # tunnel over its plain veth (same bridge, same MTU), alternating, medians of 3.
                vm0, podns0, _ = vm_list[0]
                await asyncio.to_thread(podvm_setup, vm0, podns0, apf(tunnels[0]))
                plain, plain_ip = await asyncio.to_thread(topo.add_pod)
                veth_runs, tunnel_runs = [], []
                for _ in range(3):
                    veth_runs.append(
                        await asyncio.to_thread(
                            throughput_gbps, plain, plain_ip, topo.peer, seconds
                        )
                    )
                    tunnel_runs.append(
                        await asyncio.to_thread(
                            throughput_gbps, podns0, pod_list[0][1], topo.peer, seconds
                        )
                    )
                veth, tunnel = statistics.median(veth_runs), statistics.median(tunnel_runs)
                for tunnel_ in tunnels:
                    t0, c0 = time.perf_counter(), time.process_time()
                    await podnet.teardown(tunnel_)
                    teardown_ms.append((time.perf_counter() - t0) * 1000)
                    teardown_cpu_ms.append((time.process_time() - c0) * 1000)
            finally:
                await podnet.close()
                await store.close()
    finally:
        await asyncio.to_thread(topo.close)
    load = os.getloadavg()
    print(f"pods: {pods}  cpus: {os.cpu_count()}  load avg: {load[0]:.2f} {load[1]:.2f}")
    for name, values in (
        ("inspect (CreateVM)", inspect_ms),
        ("setup (StartVM)", setup_ms),
        ("teardown (StopVM)", teardown_ms),
        ("setup, CPU time", setup_cpu_ms),
        ("teardown, CPU time", teardown_cpu_ms),
    ):
        print(
            f"{name:20s} p50 {statistics.median(values):6.2f} ms   "
            f"p99 {percentile(values, 0.99):6.2f} ms   max {max(values):6.2f} ms"
        )
    print(f"TCP peer -> pod IP, plain veth:  {veth:6.2f} Gbit/s")
    print(f"TCP peer -> pod IP, VXLAN tunnel: {tunnel:6.2f} Gbit/s")
    print(f"ratio tunnel/veth: {tunnel / veth:.2f} (goal >= 0.8); setup p99 goal <= 50 ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("podnet benchmark: needs root for network namespaces")
    asyncio.run(main(args.pods, args.seconds))
