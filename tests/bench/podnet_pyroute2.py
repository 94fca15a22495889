"""The benchmark's baseline (benchmark code): the same worker end of a tunnel built and removed
through pyroute2's generic calls, as adaptor.podnet did before it packed its own netlink
messages. Same parts, same order: per-pod NOTRACK rules (the layout before the set) after
reading the chains and their rules, the
pod interface and vxlan1 read by RTM_GETLINK, the device created then set up, an ingress qdisc
and a u32 redirect per device; teardown reads the qdiscs, filters and rules it deletes."""

from __future__ import annotations

import errno
import os
import socket
import struct
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from adaptor.podnet import _netns, _notrack
from adaptor.podnet._model import VXLAN_DEVICE, PodNetwork

INGRESS = 0xFFFF0000
NFT_JUMP = -3


def _expr(name: str, **attrs: Any) -> dict[str, Any]:
    expr: list[tuple[str, Any]] = [("NFTA_EXPR_NAME", name)]
    if attrs:
        data = [(f"NFTA_{name.upper()}_{key.upper()}", value) for key, value in attrs.items()]
        expr.append(("NFTA_EXPR_DATA", {"attrs": data}))
    return {"attrs": expr}


def _jump(chain: str) -> list[dict[str, Any]]:
    verdict = {"attrs": [("NFTA_VERDICT_CODE", NFT_JUMP), ("NFTA_VERDICT_CHAIN", chain)]}
    return [_expr("immediate", dreg=0, data={"attrs": [("NFTA_DATA_VERDICT", verdict)]})]


def _value(data: bytes) -> dict[str, Any]:
    return {"attrs": [("NFTA_DATA_VALUE", data)]}


def _match(address: str, port: int, which: str) -> list[dict[str, Any]]:
    """`ip saddr|daddr ADDRESS udp dport PORT notrack`."""
    expr = _expr
    return [
        expr("payload", dreg=1, base=1, offset=12 if which == "src" else 16, len=4),
        expr("cmp", sreg=1, op=0, data=_value(socket.inet_aton(address))),
        expr("meta", key=_notrack.NFT_META_L4PROTO, dreg=1),
        expr("cmp", sreg=1, op=0, data=_value(bytes([socket.IPPROTO_UDP]))),
        expr("payload", dreg=1, base=2, offset=2, len=2),
        expr("cmp", sreg=1, op=0, data=_value(struct.pack(">H", port))),
        {"attrs": [("NFTA_EXPR_NAME", "notrack")]},
    ]


def _ours_rule(rule: Any, vni: int) -> bool:
    return bool(rule.get_attr("NFTA_RULE_USERDATA") == _notrack.comment(vni))


def _link(ipr: Any, name: str) -> Any | None:
    try:
        links = ipr.link("get", ifname=name)
    except NetlinkError as exc:
        if exc.code in (errno.ENODEV, errno.ENOENT):
            return None
        raise
    return links[0] if links else None


def _notrack_add(host: str, vni: int, remote: str, port: int) -> None:
    with _netns.nftables(host) as nft:
        chains = _notrack._chains(nft)
        if not chains:
            nft.table("add", name=_notrack.TABLE, userdata=_notrack.OWNER_COMMENT)
        for base, hook, ours, which in _notrack.CHAINS:
            if base not in chains:
                nft.chain(
                    "add",
                    table=_notrack.TABLE,
                    name=base,
                    hook=hook,
                    type="filter",
                    priority=_notrack.NF_IP_PRI_RAW,
                    userdata=_notrack.OWNER_COMMENT,
                )
            if ours not in chains:
                nft.chain("add", table=_notrack.TABLE, name=ours)
            base_rules = _notrack.rules_in(nft, base) if base in chains else []
            if not any(_notrack._jumps_to(r, ours) for r in base_rules):
                nft.rule("add", table=_notrack.TABLE, chain=base, expressions=[_jump(ours)])
            our_rules = _notrack.rules_in(nft, ours) if ours in chains else []
            if not any(_ours_rule(r, vni) for r in our_rules):
                nft.rule(
                    "add",
                    table=_notrack.TABLE,
                    chain=ours,
                    expressions=[_match(remote, port, which)],
                    userdata=_notrack.comment(vni),
                )


def _redirect(ipr: Any, index: int, target: int) -> None:
    ipr.tc("add", "ingress", index, "ffff:")
    ipr.tc(
        "add-filter",
        "u32",
        index,
        parent=INGRESS,
        prio=1,
        protocol=3,
        keys=["0x0/0x0+0"],
        target=0x10001,
        action={"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": target},
    )


def setup(host: str, netns: str, network: PodNetwork, remote: str) -> None:
    with _notrack._LOCK:
        _notrack_add(host, network.vxlan_id, remote, network.vxlan_port)
    with _netns.iproute(netns) as pod:
        eth = _link(pod, network.interface)
        assert eth is not None and _link(pod, VXLAN_DEVICE) is None
        target = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with _netns.iproute(host) as worker:
                worker.link(
                    "add",
                    ifname=VXLAN_DEVICE,
                    kind="vxlan",
                    vxlan_id=network.vxlan_id,
                    vxlan_group=remote,
                    vxlan_port=network.vxlan_port,
                    vxlan_learning=0,
                    net_ns_fd=target,
                )
        finally:
            os.close(target)
        vxlan = _link(pod, VXLAN_DEVICE)
        assert vxlan is not None
        pod.link("set", index=vxlan["index"], state="up")
        _redirect(pod, eth["index"], vxlan["index"])
        _redirect(pod, vxlan["index"], eth["index"])


def _unredirect(ipr: Any, index: int) -> None:
    if not any(q.get_attr("TCA_KIND") == "ingress" for q in ipr.get_qdiscs(index=index)):
        return
    for f in ipr.get_filters(index=index, parent=INGRESS):
        if f.get_attr("TCA_KIND") == "u32" and f["info"] >> 16:
            ipr.tc("del-filter", index=index, parent=INGRESS, prio=f["info"] >> 16)
    ipr.tc("del", "ingress", index, "ffff:")


def teardown(host: str, netns: str, network: PodNetwork, remote: str) -> None:
    with _netns.iproute(netns) as pod:
        eth = _link(pod, network.interface)
        vxlan = _link(pod, VXLAN_DEVICE)
        assert eth is not None and vxlan is not None
        _unredirect(pod, eth["index"])
        _unredirect(pod, vxlan["index"])
        pod.link("del", index=vxlan["index"])
    with _notrack._LOCK, _netns.nftables(host) as nft:
        for _base, _hook, ours, _which in _notrack.CHAINS:
            for rule in _notrack.rules_in(nft, ours):
                if _ours_rule(rule, network.vxlan_id):
                    _notrack._delete_rule(nft, ours, rule)
        if not any(_notrack.rules_in(nft, ours) for _b, _h, ours, _w in _notrack.CHAINS):
            _notrack._prune(nft, host)
