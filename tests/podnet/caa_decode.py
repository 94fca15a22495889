"""CAA's decoder of apf.json's pod-network, written from CAA's apf.json format (docs/networking.md;
test code).

Strict as Go's types make it: every key of tunneler.Config with its JSON type, `podip` and
`worker-node-ip` parse as prefixes, route protocol/scope strings from netops' fixed sets (any other
string is an error), neighbour states likewise. Returns nothing; raises AssertionError.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

TOP = {"pod-network", "pod-namespace", "pod-name"}
TOP_OPTIONAL = {
    "tls-server-key",
    "tls-server-cert",
    "tls-client-ca",
    "tls-min-version",
    "tls-cipher-suites",
    "sc-pp-prv",
    "sc-wn-pub",
}
NETWORK = {
    "podip": str,
    "pod-hw-addr": str,
    "interface": str,
    "worker-node-ip": str,
    "tunnel-type": str,
    "routes": list,
    "neighbors": (list, type(None)),
    "mtu": int,
    "index": int,
    "dedicated": bool,
    "external-net-via-pod-vm": bool,
}
NETWORK_OMITEMPTY = {"vxlan-port": int, "vxlan-id": int}
PROTOCOLS = {"static", "boot", "dhcp", "kernel"}
SCOPES = {"universe", "site", "link", "host", "nowhere"}
STATES = {
    "none",
    "incomplete",
    "reachable",
    "stale",
    "delay",
    "probe",
    "failed",
    "noarp",
    "permanent",
}
MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def decode_apf(apf: dict[str, Any]) -> None:
    assert TOP <= set(apf) <= TOP | TOP_OPTIONAL, set(apf) ^ TOP
    assert isinstance(apf["pod-namespace"], str) and isinstance(apf["pod-name"], str)
    net = apf["pod-network"]
    if net is None:
        return
    assert set(NETWORK) <= set(net) <= set(NETWORK) | set(NETWORK_OMITEMPTY), set(net)
    for key, kind in {**NETWORK, **NETWORK_OMITEMPTY}.items():
        if key in net:
            assert isinstance(net[key], kind), (key, net[key])
            if kind is int:
                assert not isinstance(net[key], bool), key
    ipaddress.IPv4Interface(net["podip"])
    assert "/" in net["podip"] and "/" in net["worker-node-ip"]
    ipaddress.IPv4Interface(net["worker-node-ip"])
    assert MAC.match(net["pod-hw-addr"]), net["pod-hw-addr"]
    assert net["tunnel-type"] == "vxlan"
    assert 0 < net.get("vxlan-id", 1) <= 0xFFFFFF and 0 < net.get("vxlan-port", 1) < 65536
    for route in net["routes"]:
        assert {"dst", "gw"} <= set(route) <= {"dst", "gw", "dev", "protocol", "scope"}, route
        ipaddress.IPv4Network(route["dst"])
        assert "/" in route["dst"]
        if route["gw"]:
            ipaddress.IPv4Address(route["gw"])
        assert route.get("dev", "x") != "", "empty dev is omitted"
        if "protocol" in route:
            assert route["protocol"] in PROTOCOLS, route
        if "scope" in route:
            assert route["scope"] in SCOPES and route["scope"] != "universe", route
    for neighbor in net["neighbors"] or ():
        assert set(neighbor) == {"ip", "hw-addr", "dev", "state"}, neighbor
        ipaddress.IPv4Address(neighbor["ip"])
        assert neighbor["state"] in STATES
