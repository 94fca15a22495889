"""The worker end of CAA's VXLAN tunnel: device, redirects, NOTRACK rules; set up, check, remove.

Setup, as CAA's worker side does it:
- NOTRACK for the VM's VXLAN traffic in the worker's netns: the pod's element in the set the
  `peerpod-*` chains look packets up in (`_notrack`);
- a VXLAN device (VNI, remote = the pod VM, dstport, no learning, no local address, no lower
  link) created from the worker's netns, so its UDP socket lives there, and placed in the pod
  netns as `vxlan1`. The kernel does create, move and rename in one RTM_NEWLINK here (link
  created from the host netns with IFLA_NET_NS_FD and the final name); CAA does them in three
  calls, which leaves a stray `ppvxlanN` in the host netns when the daemon dies in between;
- in the pod netns, an ingress qdisc on the pod interface and on `vxlan1`, each with a u32
  match-all filter (protocol all) whose action is `mirred egress redirect` to the other device:
  the pod netns becomes an L2 pipe; the pod interface keeps its address and MAC.

Teardown removes exactly these: filters and ingress qdiscs on both devices, `vxlan1` (only when
it is the one with this VNI), the pod's NOTRACK element and, with the set left empty, the
peerpod chains. It comes in two steps: `cut` (the pod's traffic stopped: what StopVM waits
for) and `delete` (the device, whose deletion the kernel makes wait for an RCU grace period,
then the NOTRACK element).

Setup and teardown speak netlink directly (`_nl`): a fresh setup is three round trips (the
NOTRACK transaction, the device, the four tc messages in one datagram) and about 2 ms of CPU,
where pyroute2's generic encoding and decoding took about 16 ms. `check`, which runs at restart
only, still reads through pyroute2.

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

from adaptor.podnet import _netns, _nl, _notrack
from adaptor.podnet._errors import NetnsGone, PodNetError, TunnelError
from adaptor.podnet._model import VXLAN_DEVICE, PodNetwork

INGRESS = 0xFFFF0000
FILTER_PRIO = 1
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


def _has_redirect(ipr: Any, index: int) -> bool:
    return any(
        f.get_attr("TCA_KIND") == "u32" for f in ipr.get_filters(index=index, parent=INGRESS)
    )


_GONE = (errno.ENOENT, errno.ENODEV, errno.EINVAL)


def _pod_socket(netns: str, *names: str) -> tuple[_nl.Netlink, list[int | None]]:
    """An rtnetlink socket in `netns` and the ifindex of each named link there (None: no such
    link), read with if_nametoindex(3) while inside: one ioctl each."""
    found: list[int | None] = []
    with _netns.entered(netns):
        for name in names:
            try:
                found.append(socket.if_nametoindex(name))
            except OSError:
                found.append(None)
        return _nl.Netlink(_nl.NETLINK_ROUTE), found


def _host_socket(host_netns: str | None) -> _nl.Netlink:
    """This thread's rtnetlink socket in the worker's netns, opened once (`close_sockets`)."""
    key = (threading.get_ident(), netns_key(host_netns))
    with _SOCKETS_LOCK:
        sock = _SOCKETS.get(key)
    if sock is None:
        with _netns.entered(host_netns):
            sock = _nl.Netlink(_nl.NETLINK_ROUTE)
        with _SOCKETS_LOCK:
            _SOCKETS[key] = sock
    return sock


def worker_addresses(host_netns: str | None) -> set[str]:
    """The IPv4 addresses of the worker netns's interfaces, dumped on this thread's kept socket
    there (one round trip; no entry into the netns)."""
    return _nl.local_ipv4(_host_socket(host_netns))


def netns_key(path: str | None) -> int:
    """A network namespace's identity (its inode), whatever path names it."""
    return os.stat(path or "/proc/self/ns/net").st_ino


def close_sockets() -> None:
    """Close the kept sockets (once no thread uses them: the worker threads have ended)."""
    with _SOCKETS_LOCK:
        sockets = list(_SOCKETS.values())
        _SOCKETS.clear()
    for sock in sockets:
        sock.close()
    _notrack.close_sockets()


def _vxlan(pod: _nl.Netlink) -> _nl.Vxlan | None:
    try:
        replies = pod.get(_nl.link_get(VXLAN_DEVICE))
    except OSError as exc:
        if exc.errno in (errno.ENODEV, errno.ENOENT):
            return None
        raise
    return _nl.vxlan_of(replies[0]) if replies else None


def _check(step: str, results: list[int], allowed: tuple[int, ...] = ()) -> None:
    for code in results:
        if code and code not in allowed:
            raise OSError(code, f"{step}: {os.strerror(code)}")


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
    no part was made yet (StartVM), so the NOTRACK rules are added without looking first.

    Three netlink round trips when fresh: the NOTRACK batch, the device, the four tc messages."""
    _notrack.add(host_netns, network.vxlan_id, remote, network.vxlan_port, fresh=fresh)
    try:
        pod, (eth, vxlan) = _pod_socket(netns, network.interface, VXLAN_DEVICE)
        with pod:
            if eth is None:
                raise PodNetError(f"pod interface {network.interface} is gone from {netns}")
            batch: list[_nl.Message] = []
            if vxlan is not None:
                found = _vxlan(pod)
                if found is None or not (
                    found.vni == network.vxlan_id
                    and found.remote == remote
                    and found.port == network.vxlan_port
                ):
                    raise TunnelError(
                        f"{netns} already has a {VXLAN_DEVICE} that is not this pod's tunnel "
                        f"(VNI {network.vxlan_id})"
                    )
                batch.append(_nl.link_up(vxlan))
            else:
                _create_vxlan(host_netns, netns, network, remote, tag)
                # Its index, asked on the pod netns's socket (no second entry into the netns).
                made = _vxlan(pod)
                if made is None:
                    raise TunnelError(f"{VXLAN_DEVICE} did not appear in {netns}")
                vxlan = made.index
                # A redirect left on the pod interface points at the device that is gone.
                _check("removing a stale redirect", pod.transact([_nl.ingress_delete(eth)]), _GONE)
            batch += [
                _nl.ingress_add(eth),
                _nl.redirect_add(eth, vxlan, FILTER_PRIO),
                _nl.ingress_add(vxlan),
                _nl.redirect_add(vxlan, eth, FILTER_PRIO),
            ]
            _check("redirects", pod.transact(batch), (errno.EEXIST,))
    except OSError as exc:
        raise TunnelError(f"tunnel VNI {network.vxlan_id} in {netns}: {exc}") from None


def _create_vxlan(
    host_netns: str | None, netns: str, network: PodNetwork, remote: str, tag: int
) -> None:
    """Created up and tagged in one RTM_NEWLINK: no moment exists where it is untagged."""
    target = _netns.open_netns(netns)
    try:
        host = _host_socket(host_netns)
        message = _nl.vxlan_create(
            VXLAN_DEVICE, network.vxlan_id, remote, network.vxlan_port, target, tag
        )
        (code,) = host.transact([message])
    finally:
        os.close(target)
    if code == errno.EEXIST:
        raise TunnelError(
            f"VNI {network.vxlan_id} on UDP port {network.vxlan_port} is already used by "
            "another VXLAN device in the worker's network namespace"
        )
    _check(f"creating {VXLAN_DEVICE}", [code])


def _same_tunnel(link: Any, network: PodNetwork, remote: str) -> bool:
    info = _vxlan_info(link)
    return bool(
        info.get("id") == network.vxlan_id
        and info.get("remote") == remote
        and info.get("port") == network.vxlan_port
    )


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
    if not _notrack.present(host_netns, network.vxlan_id, remote, network.vxlan_port):
        missing.append("NOTRACK rules")
    return Health(tuple(missing))


@dataclass
class Doomed:
    """What `cut` leaves of a tunnel for `delete`: the pod's `vxlan1`, cut off (the rtnetlink
    socket open in its pod netns, which `delete` closes, and its index there; None when there
    is none of this tunnel), and the NOTRACK rules."""

    sock: _nl.Netlink | None
    index: int
    host_netns: str | None
    vni: int
    remote: str
    port: int = 0

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


def cut(host_netns: str | None, netns: str, network: PodNetwork, remote: str) -> Doomed:
    """StopVM's part of the removal: the pod's traffic cut, in one round trip in the pod netns
    (the pod interface's ingress qdisc goes with its redirect, `vxlan1` is set down, which
    unhooks it from the tunnel's UDP socket). The rest is left for `delete`: the kernel's
    deletion of a device waits for an RCU grace period (rcu_barrier in netdev_run_todo), tens
    of milliseconds on a busy node, and the NOTRACK rules, which carry no traffic, go after it
    (an nf_tables transaction can wait for the cleanup of the one before it)."""
    doomed = Doomed(None, 0, host_netns, network.vxlan_id, remote, network.vxlan_port)
    if not _netns.netns_exists(netns):
        return doomed  # the pod netns, gone, took its part with it
    try:
        pod, (eth, vxlan) = _pod_socket(netns, network.interface, VXLAN_DEVICE)
        try:
            found = _vxlan(pod) if vxlan is not None else None
            ours = found is not None and found.vni == network.vxlan_id
            batch: list[_nl.Message] = []
            # A vxlan1 of another tunnel owns the redirect on the pod interface: leave both.
            if eth is not None and (vxlan is None or ours):
                batch.append(_nl.ingress_delete(eth))
            if found is not None and ours:
                batch.append(_nl.link_down(found.index))
            _check("cutting the pod off", pod.transact(batch), _GONE)
            if found is not None and ours:
                doomed.sock, doomed.index = pod, found.index
        finally:
            if doomed.sock is None:
                pod.close()
    except OSError as exc:
        raise TunnelError(f"removing the tunnel from {netns}: {exc}") from None
    return doomed


def delete(doomed: Doomed) -> None:
    """Delete the `vxlan1` that `cut` left (its ingress qdisc and redirect go with it), then
    the pod's NOTRACK rules."""
    if doomed.sock is not None:
        with doomed.sock as pod:
            try:
                results = pod.transact([_nl.link_delete(doomed.index)])
                _check(f"deleting {VXLAN_DEVICE}", results, _GONE)
            except OSError as exc:
                raise TunnelError(str(exc)) from None  # it names the step
    _notrack.remove(doomed.host_netns, doomed.vni, doomed.remote, doomed.port)


def teardown(host_netns: str | None, netns: str, network: PodNetwork, remote: str) -> None:
    """Remove what setup made, all of it before returning (`cut`, then `delete`); a pod netns
    that is already gone took its part with it."""
    delete(cut(host_netns, netns, network, remote))


def resolve_ipv4(host: str) -> str:
    """The pod VM's IPv4 address (the static provider's endpoints may be names). Blocking."""
    try:
        return str(socket.inet_ntoa(socket.inet_aton(host))) if is_dotted(host) else _lookup(host)
    except OSError as exc:
        raise PodNetError(f"pod VM address {host!r} has no IPv4 address: {exc}") from None


def is_dotted(host: str) -> bool:
    """Whether `host` is written as an IPv4 address (resolving it blocks on nothing)."""
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() for p in parts)


def _lookup(host: str) -> str:
    infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_DGRAM)
    if not infos:
        raise OSError(f"no IPv4 address for {host}")
    return str(infos[0][4][0])
