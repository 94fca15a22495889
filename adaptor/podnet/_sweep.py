"""The network sweep: tunnel parts of this daemon's that no sandbox holds, found and removed.

Every part is recorded before it is made, so a part is an orphan only when something outside
the records went wrong (a daemon killed between two writes of an older version, a record lost).
The sweep lists, in the worker's netns and every named netns:

- VXLAN devices of ours: on our UDP port and tagged with our device group (the worker netns's
  inode mixed with our owner id, set in the RTM_NEWLINK that creates them; another daemon's on
  the same node and port carry another group and count as foreign); a device of ours whose VNI
  no lease holds is removed together with the redirects that point at it. An older version's
  devices (the inode alone) are still swept: that version could not share a port with another
  daemon, so they are a predecessor's, whose VNIs our leases hold while its pods run;
- redirects left dangling: an ingress u32 filter of our shape (prio 1, handle 800::800) whose
  `mirred egress redirect` target is gone (the kernel reports ifindex 0 once the target device
  is deleted), with its ingress qdisc when nothing else is left on it;
- NOTRACK elements of the set `peerpod-vms` in the worker's netns whose comment `peerpod [vni:N]`
  names an N that no lease holds and no foreign device (one without our tag, e.g. CAA's) uses
  (that N is taken out of the element: it goes when it names no other), and per-pod NOTRACK rules
  with such a comment (an older version's) in the `peerpod-*` chains.

The caller reads the leases *after* the listing (`find` first, then `remove` with the VNIs to
keep): a lease is taken before the first part of a tunnel exists and released only after the
last is gone, so a part listed whose VNI is unleased afterwards is an orphan. Blocking.
"""

from __future__ import annotations

import errno
import os
import re
import zlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from pyroute2.netlink.exceptions import NetlinkError

from adaptor.podnet import _netns, _nl, _notrack
from adaptor.podnet._errors import PodNetError

_COMMENT = re.compile(r"^peerpod \[vni:(\d+)\]$")


def legacy_tag(host_netns: str | None) -> int:
    """The device group of an older version's VXLAN devices: the worker netns's inode alone."""
    return os.stat(host_netns or "/proc/self/ns/net").st_ino & 0xFFFFFFFF


def device_tag(host_netns: str | None, owner_id: str = "") -> int:
    """The device group our VXLAN devices carry (fits 32 bits): the worker netns's inode mixed
    with the owner id, so two daemons on one node (distinct --owner-id, as their VM collectors
    need anyway) never take each other's devices for their own. Without an owner id: the
    inode alone (an older version's tag)."""
    inode = legacy_tag(host_netns)
    if not owner_id:
        return inode
    tag = (inode ^ zlib.crc32(owner_id.encode())) & 0xFFFFFFFF
    return tag if tag != inode else tag ^ 1


@dataclass(frozen=True)
class VxlanDevice:
    """A VXLAN device of ours."""

    netns: str | None
    index: int
    vni: int


@dataclass(frozen=True)
class Redirect:
    """An ingress redirect: the filter (link, prio) and where it points (0: nowhere)."""

    netns: str | None
    index: int
    prio: int
    target: int


@dataclass(frozen=True)
class Rule:
    """A NOTRACK rule with our comment."""

    chain: str
    handle: int
    vni: int


@dataclass(frozen=True)
class Element:
    """A NOTRACK set element with our comment: its key and the VNIs it names."""

    key: bytes
    vnis: tuple[int, ...]


@dataclass
class Found:
    """What one listing saw."""

    devices: list[VxlanDevice] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    elements: list[Element] = field(default_factory=list)
    foreign: set[int] = field(default_factory=set)


@dataclass
class Removed:
    """What one removal took away (the leftovers a sweep found), and the VNIs of the devices
    it could not (`left`: still in use by the kernel until a later sweep removes them)."""

    devices: int = 0
    redirects: int = 0
    rules: int = 0  # NOTRACK elements (and an older version's per-pod rules)
    left: set[int] = field(default_factory=set)

    @property
    def total(self) -> int:
        return self.devices + self.redirects + self.rules


def namespaces(host_netns: str | None, extra: Iterable[str] = ()) -> list[str | None]:
    """The worker's netns, then each named netns (and `extra`) once, by device and inode."""
    seen: dict[tuple[int, int], str] = {}
    candidates = list(extra)
    for directory in _netns.NETNS_DIRS:
        try:
            candidates += [os.path.join(directory, n) for n in sorted(os.listdir(directory))]
        except OSError:
            continue
    host_key = None
    if host_netns is not None:
        try:
            st = os.stat(host_netns)
            host_key = (st.st_dev, st.st_ino)
        except OSError:
            pass
    for path in candidates:
        try:
            st = os.stat(path)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key != host_key:
            seen.setdefault(key, path)
    return [host_netns, *seen.values()]


def _list_netns(ns: str | None, port: int, tags: Collection[int], found: Found) -> None:
    """One netns: its links, its ingress qdiscs and their redirects (raw dumps, parsed here:
    a node may hold a thousand pod namespaces); devices of a group in `tags` are ours."""
    with _netns.entered(ns):
        sock = _nl.Netlink(_nl.NETLINK_ROUTE)
    with sock:
        for payload in sock.get(_nl.links_get()):
            vxlan = _nl.vxlan_of(payload)
            if vxlan is None or vxlan.port != port:
                continue
            if vxlan.group in tags:
                found.devices.append(VxlanDevice(ns, vxlan.index, vxlan.vni))
            else:
                found.foreign.add(vxlan.vni)
        ingress = sorted(
            index
            for index, kind in map(_nl.tc_kind, sock.get(_nl.qdiscs_get()))
            if kind == "ingress"
        )
        for index in ingress:
            for payload in sock.get(_nl.ingress_filters_get(index)):
                redirect = _nl.redirect_of(payload)
                if redirect is not None and _nl.is_ours(payload):
                    found.redirects.append(Redirect(ns, index, *redirect))


def find(
    host_netns: str | None,
    port: int,
    tag: int,
    extra: Iterable[str] = (),
    legacy: bool = True,
) -> Found:
    """List every part that may be ours (namespaces that cannot be read are skipped): devices
    of our `tag`, and with `legacy` those of an older version's (`legacy_tag`), which it made
    before devices carried an owner."""
    found = Found()
    tags = {tag, legacy_tag(host_netns)} if legacy else {tag}
    for ns in namespaces(host_netns, extra):
        try:
            _list_netns(ns, port, tags, found)
        except (PodNetError, NetlinkError, OSError):
            continue
    with _netns.nftables(host_netns) as nft:
        for _base, _hook, ours, _which in _notrack.CHAINS:
            for rule in _notrack.rules_in(nft, ours):
                match = _COMMENT.match(str(rule.get_attr("NFTA_RULE_USERDATA") or ""))
                if match:
                    handle = int(rule.get_attr("NFTA_RULE_HANDLE"))
                    found.rules.append(Rule(ours, handle, int(match.group(1))))
    for key, text in _notrack.elements(host_netns):
        vnis = _notrack.owners(text)
        if vnis:
            found.elements.append(Element(key, tuple(vnis)))
    return found


_GONE = (errno.ENOENT, errno.ENODEV, errno.EINVAL)


def _remove_in(ns: str | None, redirects: list[Redirect], devices: dict[int, int]) -> Removed:
    """In one netns: the doomed redirects (an ingress qdisc left without any goes too), then
    the doomed devices (index -> VNI; their own qdiscs go with them)."""
    removed = Removed()
    with _netns.entered(ns):
        sock = _nl.Netlink(_nl.NETLINK_ROUTE)
    with sock:
        results = sock.transact([_nl.filter_delete(r.index, r.prio) for r in redirects])
        removed.redirects = sum(1 for code in results if not code)
        for index in sorted({r.index for r in redirects}):
            left = [_nl.redirect_of(p) for p in sock.get(_nl.ingress_filters_get(index))]
            if not any(left):
                sock.transact([_nl.ingress_delete(index)])
        indexes = sorted(devices)
        results = sock.transact([_nl.link_delete(index) for index in indexes])
        removed.devices = sum(1 for code in results if not code)
        refused = zip(indexes, results, strict=True)
        removed.left = {devices[i] for i, code in refused if code not in (0, *_GONE)}
    return removed


def remove(host_netns: str | None, found: Found, keep: Collection[int]) -> Removed:
    """Remove the parts of `found` that belong to no VNI in `keep`."""
    removed = Removed()
    doomed: dict[str | None, dict[int, int]] = {}
    for device in found.devices:
        if device.vni not in keep:
            doomed.setdefault(device.netns, {})[device.index] = device.vni
    # Only a redirect at a doomed device, or one the kernel reports pointing nowhere: a target
    # missing from the listing may be a device made since.
    redirects: dict[str | None, list[Redirect]] = {}
    for r in found.redirects:
        targets = doomed.get(r.netns, {})
        if r.index not in targets and (r.target in targets or r.target == 0):
            redirects.setdefault(r.netns, []).append(r)
    for ns in set(doomed) | set(redirects):
        try:
            done = _remove_in(ns, redirects.get(ns, []), doomed.get(ns, {}))
        except (PodNetError, OSError):
            removed.left |= set(doomed.get(ns, {}).values())
            continue
        removed.devices += done.devices
        removed.redirects += done.redirects
        removed.left |= done.left

    def orphan(vni: int) -> bool:
        return vni not in keep and vni not in found.foreign

    rules = [r for r in found.rules if orphan(r.vni)]
    if rules:
        removed.rules = _notrack.remove_handles(host_netns, [(r.chain, r.handle) for r in rules])
    elements = {e.key: [v for v in e.vnis if orphan(v)] for e in found.elements}
    elements = {key: vnis for key, vnis in elements.items() if vnis}
    if elements:
        removed.rules += _notrack.remove_owned(host_netns, elements)
    return removed
