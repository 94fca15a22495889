"""TCP through the pod tunnel, split by what its path crosses (needs root).

The pod tunnel's ratio in tests/bench/podnet.py compares a stream through the tunnel with one
over a plain veth. On this machine every hop of both runs on the same CPUs, so a stream's
throughput is set by the CPU time its bytes cost on their way; the tunnel's path is the plain
veth's (peer -> cni0 -> pod veth) plus the underlay's (worker -> enc0 -> br0 -> pod VM) plus
encapsulation, the redirects and decapsulation. This benchmark shows each part. Streams, each
one TCP stream for --seconds, alternated --rounds times, medians:

- veth: the peer to a pod without a tunnel (one bridge, two veths);
- underlay: the worker to the pod VM, no tunnel: the path the tunnel's UDP takes;
- tunnel: the peer to the pod's IP in its pod VM, with the NOTRACK elements of --others more
  pods in the worker's set `peerpod-vms`, as on a node with that many pod VMs (the figure
  podnet.py gives);
- tunnel, own NOTRACK element only: the same with the other pods' elements removed; each packet
  the tunnel sends or receives in the worker's netns meets one rule in each peerpod chain, a
  lookup in the set: the two lines should not differ (CAA's layout, one rule per pod in each
  chain, cost 4-10% more CPU per byte with 100 pods than with one);
- tunnel, underlay bridge through netfilter: with the underlay's bridge passing what it forwards
  through its netns's netfilter hooks (br_netfilter), as the test topology did before it stopped:
  no cloud network runs a host's iptables on the packets it carries.

For each: Gbit/s, and the CPU seconds each GB cost (this process, where the path runs, plus
ksoftirqd): the figure other load on the machine moves least. Also the outer packets the
worker's enc0 sent during the tunnel runs, their count and mean size: GSO packets whole from
the peer's TCP to the pod VM's, nothing segmented on the way, so nothing for GRO to merge.

What the tunnel's path costs, and what of it is the tunnel's own settings:
- Nothing is segmented or checksummed in software: the peer's TSO packets (about 59 KB) cross
  the redirect, `vxlan1` (GSO partial for UDP tunnels is not needed: the worker's underlay
  device takes tx-udp_tnl-segmentation), the underlay and the pod VM's `vxlan0` whole, as
  CHECKSUM_PARTIAL; the outer UDP checksum (the kernel's default, udpcsum) is then one
  pseudo-header sum per 59 KB packet. GRO on `vxlan1`, on the veths or rx-udp-gro-forwarding
  changes nothing here: it merges wire-sized packets, and none appear (on a real node the NIC's
  GRO does that merging before the tunnel).
- The MTU is not what costs: the pod's interfaces have the CNI's 1450 at both ends, the
  segments are the veth stream's (MSS 1410), and the outer packets fit the underlay's 1500
  (`vxlan1` keeps the kernel's 1500, which no frame reaches: the pod's veth admits none larger).
- The redirects are `mirred egress redirect` from ingress with the STOLEN verdict, which the
  kernel hands over without cloning; encapsulation copies only the headers TCP still shares
  with its retransmit queue (pskb_expand_head).
- What is left is per packet and belongs to the kernel: the tunnel's packets and their ACKs
  cross a second veth pair and bridge (the underlay), two more IP stacks (the worker's UDP
  socket, the pod VM's), encapsulation and decapsulation, where the plain veth crosses one
  bridge. Here all of it runs on the sending CPU; on a node, the pod VM's half runs on the pod
  VM's CPUs and the underlay is the cloud's network.
- Of the tunnel's own, nothing grows with the node: the NOTRACK chains hold one rule each, a
  lookup in a hashed set with an element per pod (CAA's layout has a rule per pod in each chain,
  which every packet compares against; the line without the other pods' elements shows what
  they cost).

    sudo python tests/bench/podnet_tcp.py [--seconds 1] [--rounds 5] [--others 99]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse
import asyncio
import os
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

from adaptor.podnet import PodNet, PodNetSettings, _netns, _notrack
from adaptor.state import StateStore
from tests.bench.podnet import apf, offloads, stream
from tests.podnet.topology import Topology, bridge_netfilter, path, podvm_setup

OTHERS_BASE = 777000


def enc0_tx(worker: str) -> tuple[int, int]:
    """(packets, bytes) the worker's underlay interface has sent."""
    with _netns.iproute(worker) as ipr:
        stats = ipr.link("get", ifname="enc0")[0].get_attr("IFLA_STATS64")
    return int(stats["tx_packets"]), int(stats["tx_bytes"])


@dataclass
class Rig:
    """The streams' ends, and the switches of the variants."""

    topo: Topology
    others: int
    pod: str = ""
    ends: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    def other_rules(self, present: bool) -> None:
        """The NOTRACK elements of `others` pods whose VMs are 192.168.2.x/3.x... (nothing
        else of their tunnels)."""
        for i in range(self.others):
            vm = f"192.168.{2 + i // 250}.{1 + i % 250}"
            if present:
                _notrack.add(self.topo.worker, OTHERS_BASE + i, vm, 4789, fresh=True)
            else:
                _notrack.remove(self.topo.worker, OTHERS_BASE + i, vm, 4789)

    def underlay_netfilter(self, on: bool) -> None:
        bridge_netfilter(path(self.topo.ns("U")), on)


def variants(rig: Rig) -> list[tuple[str, str, Callable[[], None], Callable[[], None]]]:
    """(name, stream, switch on, switch off) in the order each round runs them."""

    def nothing() -> None:
        return None

    return [
        ("veth", "veth", nothing, nothing),
        ("underlay", "underlay", nothing, nothing),
        ("tunnel", "tunnel", nothing, nothing),
        (
            "tunnel, own NOTRACK element only",
            "tunnel",
            lambda: rig.other_rules(False),
            lambda: rig.other_rules(True),
        ),
        (
            "tunnel, underlay bridge through netfilter",
            "tunnel",
            lambda: rig.underlay_netfilter(True),
            lambda: rig.underlay_netfilter(False),
        ),
    ]


def measure(rig: Rig, seconds: float, rounds: int) -> dict[str, list[tuple[float, float]]]:
    runs: dict[str, list[tuple[float, float]]] = {}
    sent = [0, 0]
    for _ in range(rounds):
        for name, which, on, off in variants(rig):
            on()
            try:
                before = enc0_tx(rig.topo.worker)
                runs.setdefault(name, []).append(stream(*rig.ends[which], seconds))
                if name == "tunnel":
                    after = enc0_tx(rig.topo.worker)
                    sent = [sent[0] + after[0] - before[0], sent[1] + after[1] - before[1]]
            finally:
                off()
    runs["enc0"] = [(float(sent[0]), float(sent[1]))]
    return runs


async def build(topo: Topology, others: int) -> Rig:
    """Topology, one tunnel (its pod VM side from apf.json), a plain pod, the others' rules."""
    await asyncio.to_thread(topo.build)
    pod, pod_ip = await asyncio.to_thread(topo.add_pod)
    vm, podns, vm_ip = await asyncio.to_thread(topo.add_vm)
    plain, plain_ip = await asyncio.to_thread(topo.add_pod)
    rig = Rig(topo, others, pod)
    rig.ends = {
        "veth": (plain, plain_ip, topo.peer),
        "underlay": (vm, vm_ip, topo.worker),
        "tunnel": (podns, pod_ip, topo.peer),
    }
    with tempfile.TemporaryDirectory() as state:
        store = await StateStore.open(state)
        podnet = PodNet(PodNetSettings(), store, host_netns=topo.worker)
        try:
            tunnel = await podnet.inspect("sb0", pod)
            assert tunnel is not None
            tunnel = await podnet.setup(tunnel, (vm_ip,))
            await asyncio.to_thread(podvm_setup, vm, podns, apf(tunnel))
        finally:
            await podnet.close()
            await store.close()
    await asyncio.to_thread(rig.other_rules, True)
    return rig


def report(runs: dict[str, list[tuple[float, float]]], vxlan: str) -> None:
    packets, sent = runs.pop("enc0")[0]
    median = {n: tuple(statistics.median(r[i] for r in v) for i in (0, 1)) for n, v in runs.items()}
    veth_gbps, veth_cpu = median["veth"]
    print(f"cpus: {os.cpu_count()}  load avg: {os.getloadavg()[0]:.2f}")
    for name, (gbps, cpu) in median.items():
        print(
            f"{name:42s} {gbps:6.2f} Gbit/s  {cpu:.3f} CPU s/GB   vs veth: "
            f"throughput {gbps / veth_gbps:.2f}, CPU cost {cpu / veth_cpu:.2f}"
            f"   runs {[round(r[0], 1) for r in runs[name]]}"
        )
    mean = sent / packets if packets else 0.0
    print(f"tunnel runs: enc0 sent {packets:.0f} packets, mean {mean:.0f} bytes (GSO kept whole)")
    print(f"vxlan1 offloads: {vxlan}")


async def main(seconds: float, rounds: int, others: int) -> None:
    topo = Topology()
    try:
        rig = await build(topo, others)
        try:
            runs = await asyncio.to_thread(measure, rig, seconds, rounds)
            vxlan = await asyncio.to_thread(offloads, rig.pod, "vxlan1")
        finally:
            await asyncio.to_thread(rig.other_rules, False)
    finally:
        await asyncio.to_thread(topo.close)
        await asyncio.to_thread(_notrack.close_sockets)
    report(runs, vxlan)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--others", type=int, default=99, help="other pods' NOTRACK elements")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("podnet TCP benchmark: needs root for network namespaces")
    asyncio.run(main(args.seconds, args.rounds, args.others))
