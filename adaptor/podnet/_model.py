"""The pod network as data: CAA's `pod-network` JSON, and what this node keeps about a tunnel.

`PodNetwork` is exactly CAA's `tunneler.Config` (keys, spellings, omitempty rules), because a CAA
pod VM image decodes it unchanged. `Tunnel` wraps it with what the worker side needs to undo
and repair its work after a restart (the pod netns path, the VM's address, the state), and is
stored with the sandbox record as JSON.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from adaptor.podnet._errors import PodNetError

TUNNEL_TYPE = "vxlan"
# The name of the VXLAN device in the pod netns, and the MTU cap the pod VM applies (CAA).
VXLAN_DEVICE = "vxlan1"
POD_VM_MAX_MTU = 1450
MAX_VNI = (1 << 24) - 1

# rtnetlink numbers <-> the strings CAA's netops encodes (any other value is a decode error).
ROUTE_PROTOCOLS = {2: "kernel", 3: "boot", 4: "static", 16: "dhcp"}
ROUTE_SCOPES = {0: "universe", 200: "site", 253: "link", 254: "host", 255: "nowhere"}


@dataclass(frozen=True)
class Route:
    """One route of the pod netns; protocol and scope are CAA's strings ('' = omitted)."""

    dst: str
    gw: str = ""
    dev: str = ""
    protocol: str = ""
    scope: str = ""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"dst": self.dst, "gw": self.gw}
        if self.dev:
            data["dev"] = self.dev
        if self.protocol:
            data["protocol"] = self.protocol
        if self.scope and self.scope != "universe":
            data["scope"] = self.scope
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Route:
        protocol = str(data.get("protocol", ""))
        scope = str(data.get("scope", ""))
        if protocol and protocol not in ROUTE_PROTOCOLS.values():
            raise PodNetError(f"route protocol {protocol!r} is not one CAA accepts")
        if scope and scope not in ROUTE_SCOPES.values():
            raise PodNetError(f"route scope {scope!r} is not one CAA accepts")
        return cls(
            str(data["dst"]), str(data.get("gw", "")), str(data.get("dev", "")), protocol, scope
        )


@dataclass(frozen=True)
class Neighbor:
    """A permanent ARP entry of the pod interface."""

    ip: str
    hw_addr: str
    dev: str
    state: str = "permanent"

    def to_dict(self) -> dict[str, Any]:
        return {"ip": self.ip, "hw-addr": self.hw_addr, "dev": self.dev, "state": self.state}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Neighbor:
        return cls(str(data["ip"]), str(data["hw-addr"]), str(data["dev"]), str(data["state"]))


@dataclass(frozen=True)
class PodNetwork:
    """CAA's `pod-network` object: what the pod VM rebuilds on its side of the tunnel."""

    pod_ip: str
    pod_hw_addr: str
    interface: str
    worker_node_ip: str
    routes: tuple[Route, ...]
    neighbors: tuple[Neighbor, ...]
    mtu: int
    index: int
    vxlan_port: int
    vxlan_id: int
    dedicated: bool = False
    external_net_via_pod_vm: bool = False

    def to_dict(self) -> dict[str, Any]:
        """CAA's keys, in CAA's order; neighbours are `null` when there are none (Go nil slice)."""
        data: dict[str, Any] = {
            "podip": self.pod_ip,
            "pod-hw-addr": self.pod_hw_addr,
            "interface": self.interface,
            "worker-node-ip": self.worker_node_ip,
            "tunnel-type": TUNNEL_TYPE,
            "routes": [r.to_dict() for r in self.routes],
            "neighbors": [n.to_dict() for n in self.neighbors] if self.neighbors else None,
            "mtu": self.mtu,
            "index": self.index,
        }
        if self.vxlan_port:
            data["vxlan-port"] = self.vxlan_port
        if self.vxlan_id:
            data["vxlan-id"] = self.vxlan_id
        data["dedicated"] = self.dedicated
        data["external-net-via-pod-vm"] = self.external_net_via_pod_vm
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PodNetwork:
        return cls(
            pod_ip=str(data["podip"]),
            pod_hw_addr=str(data["pod-hw-addr"]),
            interface=str(data["interface"]),
            worker_node_ip=str(data["worker-node-ip"]),
            routes=tuple(Route.from_dict(r) for r in data.get("routes") or ()),
            neighbors=tuple(Neighbor.from_dict(n) for n in data.get("neighbors") or ()),
            mtu=int(data["mtu"]),
            index=int(data.get("index", 0)),
            vxlan_port=int(data.get("vxlan-port", 0)),
            vxlan_id=int(data.get("vxlan-id", 0)),
            dedicated=bool(data.get("dedicated", False)),
            external_net_via_pod_vm=bool(data.get("external-net-via-pod-vm", False)),
        )


class TunnelState(enum.StrEnum):
    """Where a sandbox's tunnel is.

    inspected      CreateVM read the pod netns and holds a VNI; nothing exists in the kernel yet
    setting-up     StartVM knows the VM's address and may have made parts: written before the
                   first part is made, so a teardown after any interruption knows what to remove
    ready          the VXLAN device, redirects and NOTRACK element exist
    failed         setup or repair failed (`error` says why)
    teardown       StopVM could not remove everything; retried by the next StopVM or restart
    """

    INSPECTED = "inspected"
    SETTING_UP = "setting-up"
    READY = "ready"
    FAILED = "failed"
    TEARDOWN = "teardown"


@dataclass(frozen=True)
class Tunnel:
    """A sandbox's pod network and the worker-side state needed to undo or repair it."""

    netns: str
    network: PodNetwork
    remote: str = ""
    state: TunnelState = TunnelState.INSPECTED
    error: str = ""

    @property
    def vni(self) -> int:
        return self.network.vxlan_id

    def evolve(self, **changes: Any) -> Tunnel:
        return replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": 1,
                "netns": self.netns,
                "network": self.network.to_dict(),
                "remote": self.remote,
                "state": self.state.value,
                "error": self.error,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Tunnel:
        try:
            data = json.loads(text)
            return cls(
                netns=str(data["netns"]),
                network=PodNetwork.from_dict(data["network"]),
                remote=str(data.get("remote", "")),
                state=TunnelState(data.get("state", "inspected")),
                error=str(data.get("error", "")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise PodNetError(f"stored pod network is unreadable: {exc}") from None

    def status(self) -> dict[str, Any]:
        """The status API's view: pod IP, VNI, worker IP, the VM end, the state."""
        return {
            "pod_ip": self.network.pod_ip,
            "interface": self.network.interface,
            "vni": self.vni,
            "vxlan_port": self.network.vxlan_port,
            "worker_ip": self.network.worker_node_ip,
            "remote": self.remote,
            "netns": self.netns,
            "state": self.state.value,
            "error": self.error,
        }
