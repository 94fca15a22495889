"""Reading a pod netns and the worker's host interface into CAA's pod-network config.

Blocking netlink; the async layer runs these on its worker threads. Nothing here changes kernel
state, so a bad netns fails with nothing to undo.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from adaptor.podnet import _netns
from adaptor.podnet._errors import BadNetns, PodNetError
from adaptor.podnet._model import (
    ROUTE_PROTOCOLS,
    ROUTE_SCOPES,
    Neighbor,
    PodNetwork,
    Route,
)

RT_TABLE_MAIN = 254
RTN_UNICAST = 1
NUD_PERMANENT = 0x80
_STEM = re.compile(r"^(.*?)(\d+)$")


@dataclass(frozen=True)
class HostInterface:
    """The worker's interface the tunnel runs over, and its first IPv4 address/prefix."""

    name: str
    address: str
    dedicated: bool


def _attr(msg: Any, name: str, default: Any = None) -> Any:
    value = msg.get_attr(name)
    return default if value is None else value


def _default_route_links(ipr: Any) -> list[int]:
    """Interfaces of the IPv4 default routes of the main table, in the kernel's order."""
    links: list[int] = []
    for route in ipr.get_routes(family=socket.AF_INET, table=RT_TABLE_MAIN):
        if route["dst_len"] == 0 and route["type"] == RTN_UNICAST:
            oif = _attr(route, "RTA_OIF")
            if oif is None:
                multipath = _attr(route, "RTA_MULTIPATH", [])
                oif = multipath[0]["oif"] if multipath else None
            if oif is not None:
                links.append(int(oif))
    return links


def _primary(ipr: Any, where: str) -> tuple[int, str]:
    """CAA's primary interface: the first default route's, preferring the lowest-numbered of
    interfaces that share a name stem (eth0 over eth1)."""
    links = _default_route_links(ipr)
    if not links:
        raise BadNetns(f"{where} has no IPv4 default route, so no primary interface")
    names = {index: _link_name(ipr, index) for index in links}
    first = names[links[0]]
    match = _STEM.match(first)
    if match:
        stem = match.group(1)
        same = []
        for index, name in names.items():
            other = _STEM.match(name)
            if other and other.group(1) == stem:
                same.append((int(other.group(2)), index, name))
        _number, index, name = min(same)
        return index, name
    return links[0], first


def _link_name(ipr: Any, index: int) -> str:
    links = ipr.get_links(index)
    return str(_attr(links[0], "IFLA_IFNAME", f"if{index}")) if links else f"if{index}"


def _ipv4_addresses(ipr: Any, index: int) -> list[str]:
    return [
        f"{_attr(a, 'IFA_ADDRESS')}/{a['prefixlen']}"
        for a in ipr.get_addr(family=socket.AF_INET, index=index)
    ]


def host_interface(configured: str = "", host_netns: str | None = None) -> HostInterface:
    """The worker netns' interface the tunnel runs over (`host_netns` None: this thread's own):
    the primary one, or `configured` (CAA's -host-interface; `dedicated` when not the primary)."""
    with _netns.iproute(host_netns) as ipr:
        try:
            primary_index, primary = _primary(ipr, "the worker's network namespace")
        except BadNetns as exc:
            if not configured:
                raise PodNetError(str(exc)) from None
            primary_index, primary = -1, ""
        name, index = primary, primary_index
        if configured and configured != primary:
            found = ipr.link_lookup(ifname=configured)
            if not found:
                raise PodNetError(f"host interface {configured} does not exist")
            name, index = configured, int(found[0])
        addresses = _ipv4_addresses(ipr, index)
    if not addresses:
        raise PodNetError(f"host interface {name} has no IPv4 address")
    return HostInterface(name, addresses[0], dedicated=bool(configured) and configured != primary)


def _routes(ipr: Any, names: dict[int, str]) -> list[Route]:
    listed = []
    for route in ipr.get_routes(family=socket.AF_INET, table=RT_TABLE_MAIN):
        if route["type"] != RTN_UNICAST or route["proto"] not in ROUTE_PROTOCOLS:
            continue
        dst = _attr(route, "RTA_DST", "0.0.0.0")
        priority = int(_attr(route, "RTA_PRIORITY", 0))
        key = (
            int(_attr(route, "RTA_TABLE", RT_TABLE_MAIN)),
            ipaddress.IPv4Address(dst).packed,
            route["dst_len"],
            priority,
        )
        oif = _attr(route, "RTA_OIF")
        listed.append(
            (
                key,
                Route(
                    dst=f"{dst}/{route['dst_len']}",
                    gw=str(_attr(route, "RTA_GATEWAY", "")),
                    dev=names.get(int(oif), "") if oif is not None else "",
                    protocol=ROUTE_PROTOCOLS[route["proto"]],
                    scope=ROUTE_SCOPES.get(route["scope"], "") if route["scope"] else "",
                ),
            )
        )
    return [route for _key, route in sorted(listed, key=lambda item: item[0])]


def inspect_pod(
    netns: str,
    host: HostInterface,
    *,
    vni: int,
    index: int,
    vxlan_port: int,
    pod_subnet_cidrs: Sequence[str] = (),
    external_net_via_pod_vm: bool = False,
    netns_dirs: Sequence[str] = _netns.NETNS_DIRS,
    host_netns: str | None = None,
) -> PodNetwork:
    """CAA's Inspect: the pod interface (single IPv4 address, MAC, MTU), its routes and
    permanent neighbours, plus an extra route via the pod's gateway per --pod-subnet-cidrs.
    `netns` must be a pod's: directly in `netns_dirs`, not the worker's (`host_netns`)."""
    _netns.check_pod_netns(netns, netns_dirs, host_netns)
    try:
        with _netns.iproute(netns) as ipr:
            index_, name = _primary(ipr, f"pod network namespace {netns}")
            addresses = _ipv4_addresses(ipr, index_)
            if len(addresses) != 1:
                found = ", ".join(addresses) or "none"
                raise BadNetns(
                    f"pod interface {name} in {netns} must have exactly one IPv4 address "
                    f"(found {found})"
                )
            link = ipr.get_links(index_)[0]
            names = {int(li["index"]): str(_attr(li, "IFLA_IFNAME", "")) for li in ipr.get_links()}
            routes = _routes(ipr, names)
            gateway = next((r.gw for r in routes if r.dst == "0.0.0.0/0" and r.gw), "")
            neighbors = tuple(
                Neighbor(
                    ip=str(_attr(n, "NDA_DST")),
                    hw_addr=str(_attr(n, "NDA_LLADDR", "")),
                    dev=name,
                    state="permanent",
                )
                for n in ipr.get_neighbours(family=socket.AF_INET, ifindex=index_)
                if n["state"] & NUD_PERMANENT
            )
    except NetlinkError as exc:
        raise PodNetError(f"cannot read pod network namespace {netns}: {exc}") from None
    extra = tuple(Route(dst=cidr, gw=gateway, dev=name) for cidr in pod_subnet_cidrs)
    return PodNetwork(
        pod_ip=addresses[0],
        pod_hw_addr=str(_attr(link, "IFLA_ADDRESS", "")),
        interface=name,
        worker_node_ip=host.address,
        routes=(*routes, *extra),
        neighbors=neighbors,
        mtu=int(_attr(link, "IFLA_MTU", 1500)),
        index=index,
        vxlan_port=vxlan_port,
        vxlan_id=vni,
        dedicated=host.dedicated,
        external_net_via_pod_vm=external_net_via_pod_vm,
    )
