"""Reading a pod netns and the worker's host interface into CAA's pod-network config.

Blocking netlink; the async layer runs these on its worker threads. Nothing here changes kernel
state, so a bad netns fails with nothing to undo.
"""

from __future__ import annotations

import errno
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from adaptor.podnet import _netns, _nl
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


def _view(netns: str | None) -> _nl.NetView:
    """Links, IPv4 addresses, routes and neighbours of a netns: four dumps on a socket made
    there, parsed here (pyroute2 spends about a millisecond decoding each link)."""
    with _netns.entered(netns):
        sock = _nl.Netlink(_nl.NETLINK_ROUTE)
    with sock:
        return _nl.read_view(sock)


def _worker_view(host_netns: str | None, configured: str) -> _nl.NetView:
    """The worker's addresses and routes, and only the links they need (it has one per pod):
    those of the default routes and the configured one."""
    with _netns.entered(host_netns):
        sock = _nl.Netlink(_nl.NETLINK_ROUTE)
    with sock:
        view = _nl.read_view(sock, whole=False)
        for index in _default_route_links(view):
            link = _nl.link_by_index(sock, index)
            if link is not None:
                view.links[index] = link
        if configured:
            try:
                replies = sock.get(_nl.link_get(configured))
            except OSError as exc:
                if exc.errno not in (errno.ENODEV, errno.ENOENT):
                    raise
                replies = []
            for payload in replies:
                link = _nl.link_of(payload)
                view.links[link.index] = link
        return view


def _main_routes(view: _nl.NetView) -> list[_nl.RouteFacts]:
    return [r for r in view.routes if r.table == RT_TABLE_MAIN]


def _default_route_links(view: _nl.NetView) -> list[int]:
    """Interfaces of the IPv4 default routes of the main table, in the kernel's order."""
    return [
        r.oif
        for r in _main_routes(view)
        if r.dst_len == 0 and r.type == RTN_UNICAST and r.oif is not None
    ]


def _primary(view: _nl.NetView, where: str) -> tuple[int, str]:
    """CAA's primary interface: the first default route's, preferring the lowest-numbered of
    interfaces that share a name stem (eth0 over eth1)."""
    links = _default_route_links(view)
    if not links:
        raise BadNetns(f"{where} has no IPv4 default route, so no primary interface")
    names = {index: _link_name(view, index) for index in links}
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


def _link_name(view: _nl.NetView, index: int) -> str:
    link = view.links.get(index)
    return link.name if link is not None else f"if{index}"


def _ipv4_addresses(view: _nl.NetView, index: int) -> list[str]:
    return [f"{address}/{prefix}" for i, address, prefix in view.addresses if i == index]


def host_interface(configured: str = "", host_netns: str | None = None) -> HostInterface:
    """The worker netns' interface the tunnel runs over (`host_netns` None: this thread's own):
    the primary one, or `configured` (CAA's -host-interface; `dedicated` when not the primary)."""
    try:
        view = _worker_view(host_netns, configured)
    except OSError as exc:
        raise PodNetError(f"cannot read the worker's network namespace: {exc}") from None
    try:
        primary_index, primary = _primary(view, "the worker's network namespace")
    except BadNetns as exc:
        if not configured:
            raise PodNetError(str(exc)) from None
        primary_index, primary = -1, ""
    name, index = primary, primary_index
    if configured and configured != primary:
        found = [i for i, link in view.links.items() if link.name == configured]
        if not found:
            raise PodNetError(f"host interface {configured} does not exist")
        name, index = configured, found[0]
    addresses = _ipv4_addresses(view, index)
    if not addresses:
        raise PodNetError(f"host interface {name} has no IPv4 address")
    return HostInterface(name, addresses[0], dedicated=bool(configured) and configured != primary)


def _routes(view: _nl.NetView) -> list[Route]:
    listed = []
    for route in _main_routes(view):
        if route.type != RTN_UNICAST or route.protocol not in ROUTE_PROTOCOLS:
            continue
        key = (
            route.table,
            ipaddress.IPv4Address(route.dst).packed,
            route.dst_len,
            route.priority,
        )
        listed.append(
            (
                key,
                Route(
                    dst=f"{route.dst}/{route.dst_len}",
                    gw=route.gateway,
                    dev=_link_name(view, route.oif) if route.oif is not None else "",
                    protocol=ROUTE_PROTOCOLS[route.protocol],
                    scope=ROUTE_SCOPES.get(route.scope, "") if route.scope else "",
                ),
            )
        )
    return [route for _key, route in sorted(listed, key=lambda item: item[0])]


def inspect(
    netns: str,
    configured: str = "",
    *,
    vxlan_port: int,
    pod_subnet_cidrs: Sequence[str] = (),
    external_net_via_pod_vm: bool = False,
    netns_dirs: Sequence[str] = _netns.NETNS_DIRS,
    host_netns: str | None = None,
) -> PodNetwork:
    """CAA's Inspect, CreateVM's whole read in one call (one hand-off to a worker thread): the
    worker's host interface (`host_interface`), then the pod interface (single IPv4 address,
    MAC, MTU), its routes and permanent neighbours, plus an extra route via the pod's gateway
    per --pod-subnet-cidrs. `netns` must be a pod's: directly in `netns_dirs`, not the worker's
    (`host_netns`). VNI and index are left 0 for the caller to fill in once its lease is taken."""
    host = host_interface(configured, host_netns)
    _netns.check_pod_netns(netns, netns_dirs, host_netns)
    try:
        view = _view(netns)
    except OSError as exc:
        raise PodNetError(f"cannot read pod network namespace {netns}: {exc}") from None
    index_, name = _primary(view, f"pod network namespace {netns}")
    addresses = _ipv4_addresses(view, index_)
    if len(addresses) != 1:
        found = ", ".join(addresses) or "none"
        raise BadNetns(
            f"pod interface {name} in {netns} must have exactly one IPv4 address (found {found})"
        )
    link = view.links[index_]
    routes = _routes(view)
    gateway = next((r.gw for r in routes if r.dst == "0.0.0.0/0" and r.gw), "")
    neighbors = tuple(
        Neighbor(ip=address, hw_addr=mac, dev=name, state="permanent")
        for i, address, mac, state in view.neighbours
        if i == index_ and state & NUD_PERMANENT
    )
    extra = tuple(Route(dst=cidr, gw=gateway, dev=name) for cidr in pod_subnet_cidrs)
    return PodNetwork(
        pod_ip=addresses[0],
        pod_hw_addr=link.mac,
        interface=name,
        worker_node_ip=host.address,
        routes=(*routes, *extra),
        neighbors=neighbors,
        mtu=link.mtu,
        index=0,
        vxlan_port=vxlan_port,
        vxlan_id=0,
        dedicated=host.dedicated,
        external_net_via_pod_vm=external_net_via_pod_vm,
    )
