"""A worker node, its pods and their pod VMs, built from network namespaces (test code).

    underlay netns U:  br0 192.168.0.1/16 (the cloud network; the default gateway of all below);
                       its bridged frames skip netfilter (`bridge_netfilter`): a cloud's
                       network runs no host's iptables on what it carries
    worker netns W:    enc0 192.168.0.2/16 (veth to br0), cni0 10.128.0.1/24 (the CNI bridge),
                       one veth per pod and one for the peer, all on cni0
    pod netns P<i>:    eth0 10.128.0.<10+i>/24 (veth to cni0), default via 10.128.0.1
    peer netns Q:      eth0 10.128.0.250/24 on cni0: "another pod" on the same node
    pod VM netns V<i>: eth0 192.168.1.<i>/16 (veth to br0), default via 192.168.0.1
    its podns   X<i>:  the netns the pod VM's forwarder puts the pod interface in (A.3)

`podvm_setup` does, from the apf.json the adaptor wrote, what CAA's agent-protocol-forwarder does
in the pod VM (docs/networking.md, Topology): NOTRACK rules, vxlan0 moved into podns and renamed to
the pod
interface with the pod's MAC, MTU min(mtu, 1450), the pod IP, the kernel's subnet route swapped
for the config's routes (no-gateway ones first, forced to scope link), the neighbours.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyroute2 import netns as pnetns

from adaptor.podnet import _netns, _notrack
from tests.conftest import allow_addresses, forbid_namespaced_addresses

POD_MTU = 1450
# linux/in.h: path MTU discovery on, Don't Fragment set on every datagram.
IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2
UNDERLAY = "192.168.0.0/16"
POD_SUBNET = "10.128.0.0/24"
PROTOCOLS = {"kernel": 2, "boot": 3, "static": 4, "dhcp": 16}
SCOPES = {"universe": 0, "site": 200, "link": 253, "host": 254, "nowhere": 255}
NUD = {"permanent": 0x80, "noarp": 0x40, "reachable": 0x02, "stale": 0x04}
# With br_netfilter loaded, a bridge passes each IPv4/IPv6/ARP frame it forwards through its
# netns's netfilter hooks unless these say 0 (per netns since Linux 5.3; a new netns says 1).
BRIDGE_NF = ("bridge-nf-call-iptables", "bridge-nf-call-ip6tables", "bridge-nf-call-arptables")


def path(name: str) -> str:
    return f"/var/run/netns/{name}"


def link_index(ipr: Any, name: str) -> int:
    return int(ipr.link_lookup(ifname=name)[0])


@dataclass
class Topology:
    """Namespaces of one test; `close()` deletes every one of them."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    names: list[str] = field(default_factory=list)
    pods: int = 0
    vms: int = 0

    def ns(self, role: str) -> str:
        return f"pn{self.tag}{role}"

    def _create(self, role: str) -> str:
        name = self.ns(role)
        pnetns.create(name)
        self.names.append(name)
        with _netns.iproute(path(name)) as ipr:
            ipr.link("set", index=link_index(ipr, "lo"), state="up")
        return name

    def _veth(self, inner_ns: str, inner: str, outer_ns: str, outer: str, mtu: int) -> None:
        """A veth pair: `inner` in inner_ns, `outer` in outer_ns, both up."""
        with _netns.iproute(path(outer_ns)) as ipr:
            ipr.link("add", ifname=outer, kind="veth", peer=inner, mtu=mtu)
            fd = os.open(path(inner_ns), os.O_RDONLY)
            try:
                ipr.link("set", index=link_index(ipr, inner), net_ns_fd=fd)
            finally:
                os.close(fd)
            ipr.link("set", index=link_index(ipr, outer), state="up", mtu=mtu)
        with _netns.iproute(path(inner_ns)) as ipr:
            ipr.link("set", index=link_index(ipr, inner), state="up", mtu=mtu)

    @staticmethod
    def _address(ns: str, dev: str, cidr: str, gateway: str = "") -> None:
        address, prefix = cidr.split("/")
        with _netns.iproute(path(ns)) as ipr:
            ipr.addr("add", index=link_index(ipr, dev), address=address, prefixlen=int(prefix))
            if gateway:
                ipr.route("add", dst="0.0.0.0/0", gateway=gateway)

    @staticmethod
    def _bridge(ns: str, name: str, cidr: str, mtu: int = 1500) -> None:
        with _netns.iproute(path(ns)) as ipr:
            ipr.link("add", ifname=name, kind="bridge", mtu=mtu)
            ipr.link("set", index=link_index(ipr, name), state="up")
        Topology._address(ns, name, cidr)

    @staticmethod
    def _enslave(ns: str, dev: str, bridge: str) -> None:
        with _netns.iproute(path(ns)) as ipr:
            ipr.link("set", index=link_index(ipr, dev), master=link_index(ipr, bridge))

    # --- the pieces ------------------------------------------------------------------------------

    @property
    def worker(self) -> str:
        return path(self.ns("W"))

    @property
    def peer(self) -> str:
        return path(self.ns("Q"))

    def remove(self, ns_path: str) -> None:
        """Delete one namespace now (a pod whose netns the CNI already removed)."""
        name = os.path.basename(ns_path)
        pnetns.remove(name)
        self.names.remove(name)

    def build(self) -> Topology:
        allow_addresses(UNDERLAY, POD_SUBNET)
        underlay, worker, peer = self._create("U"), self._create("W"), self._create("Q")
        self._bridge(underlay, "br0", "192.168.0.1/16")
        bridge_netfilter(path(underlay), False)
        self._veth(worker, "enc0", underlay, "u-w", 1500)
        self._enslave(underlay, "u-w", "br0")
        self._address(worker, "enc0", "192.168.0.2/16", "192.168.0.1")
        self._bridge(worker, "cni0", "10.128.0.1/24", POD_MTU)
        self._veth(peer, "eth0", worker, "w-q", POD_MTU)
        self._enslave(worker, "w-q", "cni0")
        self._address(peer, "eth0", "10.128.0.250/24", "10.128.0.1")
        return self

    def add_pod(self, mac: str = "") -> tuple[str, str]:
        """A pod netns with its veth on cni0: (netns path, pod IP)."""
        self.pods += 1
        i = self.pods
        pod = self._create(f"P{i}")
        self._veth(pod, "eth0", self.ns("W"), f"w-p{i}", POD_MTU)
        self._enslave(self.ns("W"), f"w-p{i}", "cni0")
        ip = f"10.128.0.{10 + i}"
        self._address(pod, "eth0", f"{ip}/24", "10.128.0.1")
        if mac:
            with _netns.iproute(path(pod)) as ipr:
                ipr.link("set", index=link_index(ipr, "eth0"), address=mac)
        return path(pod), ip

    def add_vm(self) -> tuple[str, str, str]:
        """A pod VM: (its netns path, its podns path, its underlay IP)."""
        self.vms += 1
        i = self.vms
        vm, podns = self._create(f"V{i}"), self._create(f"X{i}")
        self._veth(vm, "eth0", self.ns("U"), f"u-v{i}", 1500)
        self._enslave(self.ns("U"), f"u-v{i}", "br0")
        ip = f"192.168.1.{i}"
        self._address(vm, "eth0", f"{ip}/16", "192.168.0.1")
        return path(vm), path(podns), ip

    def close(self) -> None:
        for name in reversed(self.names):
            with contextlib.suppress(OSError):
                pnetns.remove(name)
        self.names.clear()
        forbid_namespaced_addresses()


def bridge_netfilter(ns: str, on: bool) -> bool | None:
    """Set whether the bridges in `ns` pass what they forward through netfilter (the cloud
    network of the underlay must not: it would charge the tunnel's path with hooks no real one
    has); returns what it was, None where br_netfilter is not loaded (nothing to set)."""
    with _netns.entered(ns):
        try:
            with open(f"/proc/sys/net/bridge/{BRIDGE_NF[0]}") as f:
                was = f.read().strip() == "1"
        except FileNotFoundError:
            return None
        for name in BRIDGE_NF:
            with open(f"/proc/sys/net/bridge/{name}", "w") as f:
                f.write("1" if on else "0")
    return was


# --- the pod VM side (CAA's forwarder, A.3) ---------------------------------------------------


def podvm_setup(vm: str, podns: str, apf: dict[str, Any]) -> None:
    """What the pod VM's agent-protocol-forwarder does with apf.json's pod-network."""
    net = apf["pod-network"]
    worker = str(ipaddress.IPv4Interface(net["worker-node-ip"]).ip)
    vni, port, name = net["vxlan-id"], net["vxlan-port"], net["interface"]
    _notrack.add(vm, vni, worker, port)
    pod_if = ipaddress.IPv4Interface(net["podip"])
    with _netns.iproute(vm) as ipr:
        ipr.link(
            "add",
            ifname="vxlan0",
            kind="vxlan",
            vxlan_id=vni,
            vxlan_group=worker,
            vxlan_port=port,
            vxlan_learning=0,
        )
        fd = os.open(podns, os.O_RDONLY)
        try:
            ipr.link("set", index=link_index(ipr, "vxlan0"), net_ns_fd=fd)
        finally:
            os.close(fd)
    with _netns.iproute(podns) as ipr:
        index = link_index(ipr, "vxlan0")
        ipr.link("set", index=index, ifname=name)
        ipr.link("set", index=index, address=net["pod-hw-addr"], mtu=min(net["mtu"], 1450))
        ipr.addr("add", index=index, address=str(pod_if.ip), prefixlen=pod_if.network.prefixlen)
        ipr.link("set", index=index, state="up")
        if pod_if.network.prefixlen != 32:
            ipr.route("del", dst=str(pod_if.network), oif=index, proto=2, scope=253)
        routes = sorted(net["routes"], key=lambda r: bool(r["gw"]))
        for route in routes:
            spec: dict[str, Any] = {"dst": route["dst"], "oif": index}
            if route["gw"]:
                spec["gateway"] = route["gw"]
            else:
                spec["scope"] = SCOPES["link"]
            if route.get("protocol"):
                spec["proto"] = PROTOCOLS[route["protocol"]]
            ipr.route("add", **spec)
        for neighbor in net["neighbors"] or ():
            ipr.neigh(
                "add",
                dst=neighbor["ip"],
                lladdr=neighbor["hw-addr"],
                ifindex=index,
                state=NUD[neighbor["state"]],
            )


# --- traffic ----------------------------------------------------------------------------------


@contextlib.contextmanager
def sock(ns: str, kind: int = socket.SOCK_STREAM) -> Iterator[socket.socket]:
    """A socket created inside `ns` (it stays there whichever thread uses it)."""
    with _netns.entered(ns):
        s = socket.socket(socket.AF_INET, kind)
    try:
        s.settimeout(10)
        yield s
    finally:
        s.close()


def tcp_roundtrip(server_ns: str, server_ip: str, client_ns: str, payload: bytes) -> bytes:
    """The client sends `payload` to a server in `server_ns`, which echoes it back."""
    import threading

    with sock(server_ns) as listener, sock(client_ns) as client:
        listener.bind((server_ip, 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                data = b""
                while len(data) < len(payload):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                conn.sendall(data)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        client.connect((server_ip, port))
        client.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = client.recv(65536)
            if not chunk:
                break
            got += chunk
        thread.join(10)
        return got


def udp_roundtrip(
    server_ns: str, server_ip: str, client_ns: str, payload: bytes, df: bool = False
) -> bytes:
    """One datagram there and back; with `df` the Don't Fragment bit is set both ways."""
    with sock(server_ns, socket.SOCK_DGRAM) as server, sock(client_ns, socket.SOCK_DGRAM) as client:
        for s in (server, client):
            if df:
                s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        server.bind((server_ip, 0))
        client.sendto(payload, (server_ip, server.getsockname()[1]))
        data, address = server.recvfrom(65536)
        server.sendto(data, address)
        back, _ = client.recvfrom(65536)
        return back
