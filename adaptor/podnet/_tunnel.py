"""The worker end of CAA's VXLAN tunnel: device, redirects, NOTRACK rules; set up, check, remove.

Setup, as CAA's worker side does it:
- NOTRACK rules for the VM's VXLAN traffic in the worker's netns (`_notrack`);
- a VXLAN device (VNI, remote = the pod VM, dstport, no learning, no local address, no lower
  link) created from the worker's netns, so its UDP socket lives there, and placed in the pod
  netns as `vxlan1`. The kernel does create, move and rename in one RTM_NEWLINK here (link
  created from the host netns with IFLA_NET_NS_FD and the final name); CAA does them in three
  calls, which leaves a stray `ppvxlanN` in the host netns when the daemon dies in between;
- in the pod netns, an ingress qdisc on the pod interface and on `vxlan1`, each with a u32
  match-all filter (protocol all) whose action is `mirred egress redirect` to the other device:
  the pod netns becomes an L2 pipe; the pod interface keeps its address and MAC.

Teardown removes exactly these: filters and ingress qdiscs on both devices, `vxlan1` (only when
it is the one with this VNI), the pod's NOTRACK rules and a peerpod chain left empty.

Every function is blocking and raises PodNetError subclasses only.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from adaptor.podnet import _netns, _notrack
from adaptor.podnet._errors import NetnsGone, PodNetError, TunnelError
from adaptor.podnet._model import VXLAN_DEVICE, PodNetwork

INGRESS = 0xFFFF0000
ETH_P_ALL = 0x0003
FILTER_PRIO = 1
IFF_UP = 0x1
# (thread, worker netns inode) -> the rtnetlink socket that thread keeps there.
_SOCKETS: dict[tuple[int, int], Any] = {}
_SOCKETS_LOCK = threading.Lock()


@dataclass(frozen=True)
class Health:
    """What a check found missing (empty: the tunnel is whole)."""

    missing: tuple[str, ...]

    @property
    def whole(self) -> bool:
        return not self.missing


def _link(ipr: Any, name: str) -> Any | None:
    """The link called `name` (one RTM_GETLINK by name), or None."""
    try:
        links = ipr.link("get", ifname=name)
    except NetlinkError as exc:
        if exc.code in (errno.ENODEV, errno.ENOENT):
            return None
        raise
    return links[0] if links else None


def _vxlan_info(link: Any) -> dict[str, Any]:
    info = link.get_attr("IFLA_LINKINFO")
    if info is None or info.get_attr("IFLA_INFO_KIND") != "vxlan":
        return {}
    data = info.get_attr("IFLA_INFO_DATA")
    if data is None:
        return {}
    return {
        "id": data.get_attr("IFLA_VXLAN_ID"),
        "remote": data.get_attr("IFLA_VXLAN_GROUP"),
        "port": data.get_attr("IFLA_VXLAN_PORT"),
    }


def _has_ingress(ipr: Any, index: int) -> bool:
    return any(q.get_attr("TCA_KIND") == "ingress" for q in ipr.get_qdiscs(index=index))


def _has_redirect(ipr: Any, index: int) -> bool:
    return any(
        f.get_attr("TCA_KIND") == "u32" for f in ipr.get_filters(index=index, parent=INGRESS)
    )


def _redirect(ipr: Any, index: int, target: int, fresh: bool = False) -> None:
    """Ingress qdisc plus the match-all redirect; `fresh`: the device has neither (skip looking)."""
    if fresh or not _has_ingress(ipr, index):
        ipr.tc("add", "ingress", index, "ffff:")
        fresh = True
    if fresh or not _has_redirect(ipr, index):
        ipr.tc(
            "add-filter",
            "u32",
            index,
            parent=INGRESS,
            prio=FILTER_PRIO,
            protocol=ETH_P_ALL,
            keys=["0x0/0x0+0"],
            target=0x10001,
            action={
                "kind": "mirred",
                "direction": "egress",
                "action": "redirect",
                "ifindex": target,
            },
        )


def _unredirect(ipr: Any, index: int) -> None:
    if not _has_ingress(ipr, index):
        return
    for f in ipr.get_filters(index=index, parent=INGRESS):
        if f.get_attr("TCA_KIND") == "u32" and f["info"] >> 16:
            _ignore_gone(ipr.tc, "del-filter", index=index, parent=INGRESS, prio=f["info"] >> 16)
    _ignore_gone(ipr.tc, "del", "ingress", index, "ffff:")


def _ignore_gone(call: Any, *args: Any, **kwargs: Any) -> None:
    try:
        call(*args, **kwargs)
    except NetlinkError as exc:
        if exc.code not in (errno.ENOENT, errno.ENODEV, errno.EINVAL):
            raise


def _indexes(netns: str, *names: str) -> list[int | None]:
    """The ifindex of each named link in `netns` (None: no such link): if_nametoindex(3) from
    inside the netns, one ioctl each, where an RTM_GETLINK reply costs a millisecond to decode."""
    found: list[int | None] = []
    with _netns.entered(netns):
        for name in names:
            try:
                found.append(socket.if_nametoindex(name))
            except OSError:
                found.append(None)
    return found


def netns_key(path: str | None) -> int:
    """A network namespace's identity (its inode), whatever path names it."""
    return os.stat(path or "/proc/self/ns/net").st_ino


def _host_iproute(host_netns: str | None) -> Any:
    """This thread's rtnetlink socket in the worker's netns, opened once (`close_sockets`)."""
    key = (threading.get_ident(), netns_key(host_netns))
    with _SOCKETS_LOCK:
        ipr = _SOCKETS.get(key)
    if ipr is None:
        ipr = _netns.iproute(host_netns)
        with _SOCKETS_LOCK:
            _SOCKETS[key] = ipr
    return ipr


def close_sockets() -> None:
    """Close the kept sockets (once no thread uses them: the worker threads have ended)."""
    with _SOCKETS_LOCK:
        sockets = list(_SOCKETS.values())
        _SOCKETS.clear()
    for ipr in sockets:
        ipr.close()
    _notrack.close_sockets()


def setup(
    host_netns: str | None,
    netns: str,
    network: PodNetwork,
    remote: str,
    tag: int = 0,
    fresh: bool = False,
) -> None:
    """Build the worker end; parts already in place are kept (a repeated call completes it).
    `tag`: the device group that marks the VXLAN device as this daemon's (`_sweep`); `fresh`:
    no part was made yet (StartVM), so the NOTRACK rules are added without looking first."""
    _notrack.add(host_netns, network.vxlan_id, remote, network.vxlan_port, fresh=fresh)
    try:
        eth_index, vxlan_index = _indexes(netns, network.interface, VXLAN_DEVICE)
        if eth_index is None:
            raise PodNetError(f"pod interface {network.interface} is gone from {netns}")
        with _netns.iproute(netns) as pod:
            if vxlan_index is not None:
                vxlan = _link(pod, VXLAN_DEVICE)
                if vxlan is not None and not _same_tunnel(vxlan, network, remote):
                    raise TunnelError(
                        f"{netns} already has a {VXLAN_DEVICE} that is not this pod's tunnel "
                        f"(VNI {network.vxlan_id})"
                    )
                pod.link("set", index=vxlan_index, state="up")
            else:
                # A redirect left on the pod interface points at the device that is gone.
                _unredirect(pod, eth_index)
                _create_vxlan(host_netns, netns, network, remote, tag)
                (vxlan_index,) = _indexes(netns, VXLAN_DEVICE)
                if vxlan_index is None:
                    raise TunnelError(f"{VXLAN_DEVICE} did not appear in {netns}")
                fresh = True
            _redirect(pod, eth_index, vxlan_index, fresh)
            _redirect(pod, vxlan_index, eth_index, fresh)
    except NetlinkError as exc:
        raise TunnelError(f"tunnel VNI {network.vxlan_id} in {netns}: {exc}") from None


def _same_tunnel(link: Any, network: PodNetwork, remote: str) -> bool:
    info = _vxlan_info(link)
    return bool(
        info.get("id") == network.vxlan_id
        and info.get("remote") == remote
        and info.get("port") == network.vxlan_port
    )


def _create_vxlan(
    host_netns: str | None, netns: str, network: PodNetwork, remote: str, tag: int
) -> None:
    """Created up and tagged in one RTM_NEWLINK: no moment exists where it is untagged."""
    target = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            host = _host_iproute(host_netns)
        except OSError as exc:
            raise TunnelError(f"cannot open netlink in the worker's netns: {exc}") from None
        host.link(
            "add",
            ifname=VXLAN_DEVICE,
            kind="vxlan",
            vxlan_id=network.vxlan_id,
            vxlan_group=remote,
            vxlan_port=network.vxlan_port,
            vxlan_learning=0,
            vxlan_proxy=0,
            vxlan_ttl=0,
            vxlan_tos=0,
            net_ns_fd=target,
            group=tag,
            flags=IFF_UP,
            change=IFF_UP,
        )
    except NetlinkError as exc:
        if exc.code == errno.EEXIST:
            raise TunnelError(
                f"VNI {network.vxlan_id} on UDP port {network.vxlan_port} is already used by "
                "another VXLAN device in the worker's network namespace"
            ) from None
        raise
    finally:
        os.close(target)


def check(host_netns: str | None, netns: str, network: PodNetwork, remote: str) -> Health:
    """What of the worker end is missing; NetnsGone when the pod netns itself is."""
    if not _netns.netns_exists(netns):
        raise NetnsGone(f"pod network namespace {netns} is gone")
    missing: list[str] = []
    try:
        with _netns.iproute(netns) as pod:
            eth = _link(pod, network.interface)
            vxlan = _link(pod, VXLAN_DEVICE)
            if vxlan is None or not _same_tunnel(vxlan, network, remote):
                missing.append(VXLAN_DEVICE)
            for name, link in ((network.interface, eth), (VXLAN_DEVICE, vxlan)):
                if link is None or not _has_redirect(pod, link["index"]):
                    missing.append(f"redirect on {name}")
    except NetlinkError as exc:
        raise TunnelError(f"checking the tunnel in {netns}: {exc}") from None
    if not _notrack.present(host_netns, network.vxlan_id, remote):
        missing.append("NOTRACK rules")
    return Health(tuple(missing))


def teardown(host_netns: str | None, netns: str, network: PodNetwork, remote: str) -> None:
    """Remove what setup made; a pod netns that is already gone took its part with it."""
    if _netns.netns_exists(netns):
        try:
            with _netns.iproute(netns) as pod:
                eth = _link(pod, network.interface)
                vxlan = _link(pod, VXLAN_DEVICE)
                ours = vxlan is not None and _vxlan_info(vxlan).get("id") == network.vxlan_id
                # A vxlan1 of another tunnel owns the redirect on the pod interface: leave both.
                if eth is not None and (vxlan is None or ours):
                    _unredirect(pod, eth["index"])
                if vxlan is not None and ours:
                    _unredirect(pod, vxlan["index"])
                    _ignore_gone(pod.link, "del", index=vxlan["index"])
        except NetlinkError as exc:
            raise TunnelError(f"removing the tunnel from {netns}: {exc}") from None
    _notrack.remove(host_netns, network.vxlan_id, remote)


def resolve_ipv4(host: str) -> str:
    """The pod VM's IPv4 address (the static provider's endpoints may be names). Blocking."""
    try:
        return str(socket.inet_ntoa(socket.inet_aton(host))) if _dotted(host) else _lookup(host)
    except OSError as exc:
        raise PodNetError(f"pod VM address {host!r} has no IPv4 address: {exc}") from None


def _dotted(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() for p in parts)


def _lookup(host: str) -> str:
    infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_DGRAM)
    if not infos:
        raise OSError(f"no IPv4 address for {host}")
    return str(infos[0][4][0])
