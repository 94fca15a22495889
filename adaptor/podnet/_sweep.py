"""The network sweep: tunnel parts of this daemon's that no sandbox holds, found and removed.

Every part is recorded before it is made, so a part is an orphan only when something outside
the records went wrong (a daemon killed between two writes of an older version, a record lost).
The sweep lists, in the worker's netns and every named netns:

- VXLAN devices of ours: on our UDP port and tagged with our device group (the worker netns's
  inode, set in the RTM_NEWLINK that creates them); a device of ours whose VNI no lease holds is
  removed together with the redirects that point at it;
- redirects left dangling: an ingress u32 filter whose `mirred egress redirect` target is gone
  (the kernel reports ifindex 0 once the target device is deleted), with its ingress qdisc;
- NOTRACK rules in the worker's netns carrying the comment `peerpod [vni:N]` for an N that no
  lease holds and no foreign device (one without our tag, e.g. CAA's) uses.

The caller reads the leases *after* the listing (`find` first, then `remove` with the VNIs to
keep): a lease is taken before the first part of a tunnel exists and released only after the
last is gone, so a part listed whose VNI is unleased afterwards is an orphan. Blocking.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from adaptor.podnet import _netns, _notrack
from adaptor.podnet._errors import PodNetError

INGRESS = 0xFFFF0000
TCA_EGRESS_REDIR = 1
_COMMENT = re.compile(r"^peerpod \[vni:(\d+)\]$")


def device_tag(host_netns: str | None) -> int:
    """The device group our VXLAN devices carry: the worker netns's inode (fits 32 bits)."""
    return os.stat(host_netns or "/proc/self/ns/net").st_ino & 0xFFFFFFFF


@dataclass(frozen=True)
class Device:
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


@dataclass
class Found:
    """What one listing saw."""

    devices: list[Device] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    foreign: set[int] = field(default_factory=set)


@dataclass
class Removed:
    """What one removal took away (the leftovers a sweep found)."""

    devices: int = 0
    redirects: int = 0
    rules: int = 0

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


def _vxlan(link: Any) -> tuple[int, int] | None:
    """(VNI, port) of a VXLAN link, else None."""
    info = link.get_attr("IFLA_LINKINFO")
    if info is None or info.get_attr("IFLA_INFO_KIND") != "vxlan":
        return None
    data = info.get_attr("IFLA_INFO_DATA")
    if data is None or data.get_attr("IFLA_VXLAN_ID") is None:
        return None
    return int(data.get_attr("IFLA_VXLAN_ID")), int(data.get_attr("IFLA_VXLAN_PORT") or 0)


def redirect_target(flt: Any) -> int | None:
    """The ifindex a u32 filter's `mirred egress redirect` points at (0: its target is gone);
    None when the filter is not such a redirect."""
    if flt.get_attr("TCA_KIND") != "u32":
        return None
    options = flt.get_attr("TCA_OPTIONS")
    actions = options.get_attr("TCA_U32_ACT") if options is not None else None
    if actions is None:
        return None
    for action in actions.get_attrs("TCA_ACT_PRIO_1"):
        if action.get_attr("TCA_ACT_KIND") != "mirred":
            continue
        parms = action.get_attr("TCA_ACT_OPTIONS").get_attr("TCA_MIRRED_PARMS")
        if parms is not None and parms["eaction"] == TCA_EGRESS_REDIR:
            return int(parms["ifindex"])
    return None


def _list_netns(ns: str | None, port: int, tag: int, found: Found) -> None:
    with _netns.iproute(ns) as ipr:
        for link in ipr.get_links():
            vxlan = _vxlan(link)
            if vxlan is None or vxlan[1] != port:
                continue
            if link.get_attr("IFLA_GROUP") == tag:
                found.devices.append(Device(ns, int(link["index"]), vxlan[0]))
            else:
                found.foreign.add(vxlan[0])
        ingress = {int(q["index"]) for q in ipr.get_qdiscs() if q.get_attr("TCA_KIND") == "ingress"}
        for index in sorted(ingress):
            for flt in ipr.get_filters(index=index, parent=INGRESS):
                target = redirect_target(flt)
                if target is not None:
                    found.redirects.append(Redirect(ns, index, flt["info"] >> 16, target))


def find(host_netns: str | None, port: int, tag: int, extra: Iterable[str] = ()) -> Found:
    """List every part that may be ours (namespaces that cannot be read are skipped)."""
    found = Found()
    for ns in namespaces(host_netns, extra):
        try:
            _list_netns(ns, port, tag, found)
        except (PodNetError, NetlinkError, OSError):
            continue
    with _netns.nftables(host_netns) as nft:
        for _base, _hook, ours, _which in _notrack.CHAINS:
            for rule in _notrack.rules_in(nft, ours):
                match = _COMMENT.match(str(rule.get_attr("NFTA_RULE_USERDATA") or ""))
                if match:
                    handle = int(rule.get_attr("NFTA_RULE_HANDLE"))
                    found.rules.append(Rule(ours, handle, int(match.group(1))))
    return found


def _gone(call: Any, *args: Any, **kwargs: Any) -> bool:
    """Run a delete; False when what it deletes is already gone."""
    try:
        call(*args, **kwargs)
    except NetlinkError as exc:
        if exc.code in (errno.ENOENT, errno.ENODEV, errno.EINVAL):
            return False
        raise
    return True


def remove(host_netns: str | None, found: Found, keep: Collection[int]) -> Removed:
    """Remove the parts of `found` that belong to no VNI in `keep`."""
    removed = Removed()
    doomed = [d for d in found.devices if d.vni not in keep]
    by_ns: dict[str | None, set[int]] = {}
    for device in doomed:
        by_ns.setdefault(device.netns, set()).add(device.index)
    for ns in {r.netns for r in found.redirects} | set(by_ns):
        targets = by_ns.get(ns, set())
        # Only a redirect at a doomed device, or one the kernel reports pointing nowhere: a
        # target missing from the listing may be a device made since.
        redirects = [
            r
            for r in found.redirects
            if r.netns == ns and r.index not in targets and (r.target in targets or r.target == 0)
        ]
        try:
            with _netns.iproute(ns) as ipr:
                for r in redirects:
                    if _gone(ipr.tc, "del-filter", index=r.index, parent=INGRESS, prio=r.prio):
                        removed.redirects += 1
                    if not any(
                        redirect_target(f) is not None
                        for f in ipr.get_filters(index=r.index, parent=INGRESS)
                    ):
                        _gone(ipr.tc, "del", "ingress", r.index, "ffff:")
                for index in sorted(targets):
                    if _gone(ipr.link, "del", index=index):
                        removed.devices += 1
        except (PodNetError, NetlinkError, OSError):
            continue
    rules = [r for r in found.rules if r.vni not in keep and r.vni not in found.foreign]
    if rules:
        removed.rules = _notrack.remove_handles(host_netns, [(r.chain, r.handle) for r in rules])
    return removed
