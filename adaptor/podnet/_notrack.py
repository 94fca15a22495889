"""NOTRACK for the VXLAN underlay in the worker's netns, through nf_tables: CAA's chains, one set.

CAA adds (with iptables, `raw` table) a chain `peerpod-OUTPUT` jumped to from `OUTPUT` and a chain
`peerpod-PREROUTING` jumped to from `PREROUTING`, each holding one rule per pod:
`-d|-s <pod VM IP> -p udp --dport <vxlan port> -m comment --comment "peerpod [vni:N]" -j NOTRACK`.
Every VXLAN packet of the node walks those rules one by one, so each packet's cost grows with the
pods on the node (with 100 pods, 4-10% more CPU per byte of tunnel TCP than with one pod's rules).
Here the same chains and jumps exist, in table `ip raw` (the table iptables-nft uses for `-t raw`,
base chains at priority raw = -300), but each holds ONE rule whatever the pods:

    peerpod-OUTPUT:      ip daddr . udp dport @peerpod-vms notrack
    peerpod-PREROUTING:  ip saddr . udp dport @peerpod-vms notrack

and a pod is one element `<pod VM IP> . <vxlan port>` of the hashed set `peerpod-vms` (key type
`ipv4_addr . inet_service`), with the element comment `peerpod [vni:N]`: a lookup per packet
instead of a walk. Two pods whose tunnels share a pod VM address and port share the element, its
comment naming both (`peerpod [vni:N] [vni:M]`); it goes with the last of them. Written over
netlink (`_nl`, packed by hand): no binary to exec and no C library to load; `nft list table ip
raw` shows the chains, the set and its elements with their comments.

Adding a pod is one element added (F_EXCL: a key already there, another pod's, is read and its
comment rewritten, delete and add in one transaction); removing it is one element read by key and
deleted (or rewritten): neither reads anything that grows with the pods. The chains, jumps, set and
lookup rules are made by the node's first pod (read first, then what is missing in one
transaction, packed here too; pyroute2 only reads and prunes them). The number of elements
this process knows of says when the set may be empty (unknown after a restart: one dump tells).
An empty set goes with the lookup rules, the `peerpod-*` chains and their jumps; a base chain or
the table is deleted only when this module created it (it carries the comment `peerpod`) and it
is empty, so a node whose raw table belongs to someone else keeps it exactly as it was. Per-pod
rules an older version left in the chains (comment `peerpod [vni:N]`) are removed by the sweep.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import struct
import threading
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.nfnetlink.nftsocket import NFT_MSG_GETRULE, nft_rule_msg

from adaptor.podnet import _netns, _nl
from adaptor.podnet._errors import TunnelError

TABLE = "raw"
SET = "peerpod-vms"
OWNER_COMMENT = "peerpod"
NF_IP_PRI_RAW = -300
NFT_META_L4PROTO = 16
NFT_PAYLOAD_NETWORK_HEADER = 1
NFT_PAYLOAD_TRANSPORT_HEADER = 2
NFT_REG32_00, NFT_REG32_01 = 8, 9
# nft's type of `ipv4_addr . inet_service` (7 and 13, 6 bits each) and its length (two
# registers: the port is zero-padded to 4 bytes).
KEY_TYPE = (7 << 6) | 13
KEY_LEN = 8
# The netfilter hooks of our base chains (NF_INET_PRE_ROUTING, NF_INET_LOCAL_OUT).
HOOKS = {"prerouting": 0, "output": 3}
# (base chain, its hook, our chain, which address the rule matches)
CHAINS = (
    ("OUTPUT", "output", "peerpod-OUTPUT", "dst"),
    ("PREROUTING", "prerouting", "peerpod-PREROUTING", "src"),
)
_OWNERS = re.compile(r"^peerpod((?: \[vni:\d+\])+)$")

# One process-wide lock, as CAA has: nf_tables commands are atomic one by one, but "create the
# chain if missing, then add the element" and "delete the chain if empty" are not.
_LOCK = threading.Lock()
# Worker netns whose chains, jumps, set and lookup rules this process made or saw (cleared when
# it prunes them): there a fresh pod's element is added without reading anything first. All
# under _LOCK, as is the one nf_tables socket kept open per worker netns and the number of
# elements of the set this process knows of (absent: unknown, a dump tells).
_READY: set[int] = set()
_SOCKETS: dict[int, _nl.Netlink] = {}
_COUNTS: dict[int, int] = {}


def comment(vni: int) -> str:
    """CAA's rule comment for a pod (the comment of its set element)."""
    return f"peerpod [vni:{vni}]"


def owners_comment(vnis: list[int]) -> str:
    return "peerpod" + "".join(f" [vni:{v}]" for v in vnis)


def owners(text: str) -> list[int] | None:
    """The VNIs a comment of ours names (None: not ours)."""
    match = _OWNERS.match(text)
    return [int(v) for v in re.findall(r"\d+", match.group(1))] if match else None


def key(remote: str, port: int) -> bytes:
    """A set key: the pod VM's address and the VXLAN port, as the lookup's registers hold them."""
    return socket.inet_aton(remote) + struct.pack(">H", port) + b"\0\0"


def address_of(raw: bytes) -> str:
    return socket.inet_ntoa(raw[:4]) if len(raw) >= 4 else ""


def _lookup(which: str) -> list[bytes]:
    """`meta l4proto udp ip saddr|daddr . udp dport @peerpod-vms notrack`, packed."""
    offset = 12 if which == "src" else 16
    udp = _nl.nest(3, _nl.attr(_nl.NFTA_DATA_VALUE, bytes([socket.IPPROTO_UDP])))
    return [
        _nl.expr("meta", _nl.be32(1, 1), _nl.be32(2, NFT_META_L4PROTO)),
        _nl.expr("cmp", _nl.be32(1, 1), _nl.be32(2, 0), udp),
        _nl.expr(
            "payload",
            _nl.be32(1, NFT_REG32_00),
            _nl.be32(2, NFT_PAYLOAD_NETWORK_HEADER),
            _nl.be32(3, offset),
            _nl.be32(4, 4),
        ),
        _nl.expr(
            "payload",
            _nl.be32(1, NFT_REG32_01),
            _nl.be32(2, NFT_PAYLOAD_TRANSPORT_HEADER),
            _nl.be32(3, 2),
            _nl.be32(4, 2),
        ),
        _nl.expr("lookup", _nl.asciiz(1, SET), _nl.be32(2, NFT_REG32_00)),
        _nl.expr("notrack"),
    ]


def rules_in(nft: Any, chain: str) -> list[Any]:
    """The rules of one chain of table `raw`: a dump the kernel filters, so an operation decodes
    only the chains it reads."""
    msg = nft_rule_msg()
    msg["attrs"] = [("NFTA_RULE_TABLE", TABLE), ("NFTA_RULE_CHAIN", chain)]
    try:
        return list(nft.request_get(msg, NFT_MSG_GETRULE))
    except NetlinkError as exc:
        if exc.code == errno.ENOENT:
            return []
        raise


def _is_lookup(rule: Any) -> bool:
    return bool(rule.get_attr("NFTA_RULE_USERDATA") == OWNER_COMMENT)


def _jumps_to(rule: Any, chain: str) -> bool:
    for expr in rule.get_attr("NFTA_RULE_EXPRESSIONS") or ():
        if expr.get_attr("NFTA_EXPR_NAME") != "immediate":
            continue
        data = expr.get_attr("NFTA_EXPR_DATA")
        value = data.get_attr("NFTA_IMMEDIATE_DATA") if data is not None else None
        verdict = value.get_attr("NFTA_DATA_VERDICT") if value is not None else None
        if verdict is not None and verdict.get_attr("NFTA_VERDICT_CHAIN") == chain:
            return True
    return False


def _chains(nft: Any) -> dict[str, Any]:
    return {
        c.get_attr("NFTA_CHAIN_NAME"): c
        for c in nft.get_chains()
        if c.get_attr("NFTA_CHAIN_TABLE") == TABLE
    }


def _ours(msg: Any, attr: str) -> bool:
    return bool(msg.get_attr(attr) == OWNER_COMMENT)


def _key(host_netns: str | None) -> int:
    return os.stat(host_netns or "/proc/self/ns/net").st_ino


def _socket(host_netns: str | None) -> _nl.Netlink:
    """The raw nf_tables socket kept in the worker's netns (used under _LOCK only)."""
    key = _key(host_netns)
    sock = _SOCKETS.get(key)
    if sock is None:
        with _netns.entered(host_netns):
            sock = _SOCKETS[key] = _nl.Netlink(_nl.NETLINK_NETFILTER)
    return sock


def _drop_sockets() -> None:
    for sock in _SOCKETS.values():
        sock.close()
    _SOCKETS.clear()
    _COUNTS.clear()


def close_sockets() -> None:
    """Close the kept nf_tables sockets."""
    with _LOCK:
        _drop_sockets()
        _READY.clear()


def elements(host_netns: str | None) -> list[tuple[bytes, str]]:
    """(key, comment) of every element of the set; [] when there is no set."""
    with _LOCK:
        return _elements(host_netns)


def _elements(host_netns: str | None) -> list[tuple[bytes, str]]:
    try:
        replies = _socket(host_netns).get(_nl.elements_get(TABLE, SET))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return []
        raise
    return [element for payload in replies for element in _nl.elements_of(payload)]


def _element(host_netns: str | None, k: bytes) -> str | None:
    """The comment of the element `k` (None: there is none)."""
    try:
        replies = _socket(host_netns).get(_nl.element_get(TABLE, SET, k))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    found = [c for payload in replies for key, c in _nl.elements_of(payload) if key[:6] == k[:6]]
    return found[0] if found else None


def _transact(host_netns: str | None, *messages: _nl.Message) -> list[int]:
    try:
        return _socket(host_netns).transact(_nl.nft_batch(*messages))
    except OSError as exc:
        _drop_sockets()
        return [exc.errno or errno.EIO]


def _count(host_netns: str | None, delta: int) -> None:
    netns = _key(host_netns)
    if netns in _COUNTS:
        _COUNTS[netns] = max(_COUNTS[netns] + delta, 0)


def _join(host_netns: str | None, vni: int, k: bytes) -> None:
    """The pod's VNI into the element `k`: added, or named by the element already there."""
    for _attempt in range(3):
        current = _element(host_netns, k)
        if current is None:
            results = _transact(host_netns, _nl.element_add(TABLE, SET, k, comment(vni)))
            if not any(results):
                _count(host_netns, 1)
                return
            if results != [errno.EEXIST]:
                raise TunnelError(f"NOTRACK element for VNI {vni}: {os.strerror(results[0])}")
            continue
        named = owners(current) or []
        if vni in named:
            return
        rewrite = owners_comment([*named, vni])
        results = _transact(
            host_netns,
            _nl.element_delete(TABLE, SET, k),
            _nl.element_add(TABLE, SET, k, rewrite),
        )
        if not any(results):
            return
    raise TunnelError(f"NOTRACK element for VNI {vni}: the set keeps changing")


def _exists(sock: _nl.Netlink, request: _nl.Message) -> bool:
    """Whether the one table or chain `request` asks for exists."""
    try:
        return bool(sock.get(request))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise


def _raw_chains(sock: _nl.Netlink) -> set[str]:
    """Which of the base and peerpod chains table `raw` (family ip) has."""
    names = [name for base, _hook, ours, _which in CHAINS for name in (base, ours)]
    return {name for name in names if _exists(sock, _nl.chain_get(TABLE, name))}


def _rules(sock: _nl.Netlink, chain: str) -> list[tuple[str, list[str]]]:
    """(comment, chains it jumps to) of each rule of one chain of table `raw`."""
    try:
        return [_nl.rule_of(payload) for payload in sock.get(_nl.rules_get(TABLE, chain))]
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return []
        raise


def _setup(host_netns: str | None) -> None:
    """Table, base chains, peerpod chains and jumps, the set and the lookup rules, each made
    when missing: what exists is read on the kept socket (each chain by name, the rules of
    those that exist), then what is missing goes in one transaction. The node's first pod
    pays for it again each time the last one went (the prune), so it is packed here too."""
    sock = _socket(host_netns)
    chains = _raw_chains(sock)
    messages = []
    if not chains and not _exists(sock, _nl.table_get(TABLE)):
        messages.append(_nl.table_add(TABLE, OWNER_COMMENT))
    lookups = []
    for base, hook, ours, which in CHAINS:
        if base not in chains:
            messages.append(_nl.chain_add(TABLE, base, HOOKS[hook], NF_IP_PRI_RAW, OWNER_COMMENT))
        if ours not in chains:
            messages.append(_nl.chain_add(TABLE, ours))
        base_rules = _rules(sock, base) if base in chains else []
        if not any(ours in targets for _comment, targets in base_rules):
            messages.append(_nl.rule_add(TABLE, base, [_nl.jump(ours)]))
        our_rules = _rules(sock, ours) if ours in chains else []
        if not any(text == OWNER_COMMENT for text, _targets in our_rules):
            lookups.append(_nl.rule_add(TABLE, ours, _lookup(which), OWNER_COMMENT))
    messages.append(_nl.set_add(TABLE, SET, KEY_TYPE, KEY_LEN))
    results = _transact(host_netns, *messages, *lookups)
    if any(results):
        raise TunnelError("NOTRACK set: " + ", ".join(os.strerror(c) for c in results if c))


def add(host_netns: str | None, vni: int, remote: str, port: int, fresh: bool = False) -> None:
    """The pod's set element (once), with the chains, jumps, set and rules made as needed.
    `fresh`: the pod has none yet, so where the set is known, nothing is read first."""
    k = key(remote, port)
    with _LOCK:
        if fresh and _key(host_netns) in _READY:
            results = _transact(host_netns, _nl.element_add(TABLE, SET, k, comment(vni)))
            if not any(results):
                _count(host_netns, 1)
                return
            if results != [errno.EEXIST]:
                _READY.clear()
                _drop_sockets()
        try:
            if _key(host_netns) not in _READY:
                _setup(host_netns)
                _READY.add(_key(host_netns))
            _join(host_netns, vni, k)
        except OSError as exc:
            _drop_sockets()
            raise TunnelError(f"NOTRACK element for VNI {vni}: {exc}") from None


def present(host_netns: str | None, vni: int, remote: str, port: int) -> bool:
    """Whether the pod's element and both lookup rules are in place."""
    with _LOCK:
        current = _element(host_netns, key(remote, port))
    if current is None or vni not in (owners(current) or []):
        return False
    with _netns.nftables(host_netns) as nft:
        return all(
            any(_is_lookup(r) for r in rules_in(nft, ours)) for _base, _hook, ours, _which in CHAINS
        )


def _leave(host_netns: str | None, vni: int, keys: list[tuple[bytes, str]]) -> int:
    """The pod's VNI out of each element (k, comment) that names it: the element deleted when
    it named no other, else rewritten; how many elements were deleted."""
    messages: list[_nl.Message] = []
    deleted = 0
    for k, text in keys:
        named = owners(text)
        if named is None or vni not in named:
            continue
        messages.append(_nl.element_delete(TABLE, SET, k))
        rest = [v for v in named if v != vni]
        if rest:
            messages.append(_nl.element_add(TABLE, SET, k, owners_comment(rest)))
        else:
            deleted += 1
    results = _transact(host_netns, *messages) if messages else []
    if any(code not in (0, errno.ENOENT) for code in results):
        raise TunnelError(
            f"removing the NOTRACK element of VNI {vni}: "
            + ", ".join(os.strerror(c) for c in results if c)
        )
    return deleted


def remove(host_netns: str | None, vni: int, remote: str, port: int = 0) -> None:
    """The pod's VNI out of its element (read by key; without a port or address, the elements
    are read); then, once the set is empty, the set, rules, chains, jumps we made."""
    with _LOCK:
        try:
            if remote and port:
                k = key(remote, port)
                current = _element(host_netns, k)
                found = [(k, current)] if current is not None else []
            else:
                found = [
                    (k, text)
                    for k, text in _elements(host_netns)
                    if not remote or address_of(k) == remote
                ]
            _count(host_netns, -_leave(host_netns, vni, found))
            if _COUNTS.get(_key(host_netns), 0) > 0:
                return
            left = len(_elements(host_netns))
        except OSError as exc:
            _drop_sockets()
            raise TunnelError(f"removing the NOTRACK element of VNI {vni}: {exc}") from None
        _COUNTS[_key(host_netns)] = left
        if left:
            return
        try:
            with _netns.nftables(host_netns) as nft:
                _prune(nft, host_netns)
        except NetlinkError as exc:
            raise TunnelError(f"removing NOTRACK rules of VNI {vni}: {exc}") from None


def remove_owned(host_netns: str | None, doomed: dict[bytes, list[int]]) -> int:
    """Each element's VNIs of `doomed` (key -> VNIs) taken out of it, as `remove` does, then
    the prune; how many VNIs were taken out."""
    taken = 0
    with _LOCK:
        try:
            for k, vnis in doomed.items():
                for vni in vnis:
                    current = _element(host_netns, k)
                    if current is not None and vni in (owners(current) or []):
                        _leave(host_netns, vni, [(k, current)])
                        taken += 1
            _COUNTS.pop(_key(host_netns), None)
            empty = not _elements(host_netns)
        except OSError as exc:
            _drop_sockets()
            raise TunnelError(f"removing orphan NOTRACK elements: {exc}") from None
        if empty:
            try:
                with _netns.nftables(host_netns) as nft:
                    _prune(nft, host_netns)
            except NetlinkError as exc:
                raise TunnelError(f"removing orphan NOTRACK elements: {exc}") from None
    return taken


def remove_handles(host_netns: str | None, rules: list[tuple[str, int]]) -> int:
    """Delete rules by (chain, handle) (per-pod rules an older version added), then prune as
    `remove` does when the set is empty; how many were deleted."""
    deleted = 0
    with _LOCK:
        try:
            with _netns.nftables(host_netns) as nft:
                for chain, handle in rules:
                    try:
                        nft.rule("del", table=TABLE, chain=chain, handle=handle)
                    except NetlinkError as exc:
                        if exc.code != errno.ENOENT:
                            raise
                    else:
                        deleted += 1
                if not _elements(host_netns):
                    _prune(nft, host_netns)
        except (NetlinkError, OSError) as exc:
            _drop_sockets()
            raise TunnelError(f"removing orphan NOTRACK rules: {exc}") from None
    return deleted


def _prune(nft: Any, host_netns: str | None) -> None:
    """With the set empty: each peerpod chain holding nothing but the lookup rule goes with
    that rule and its jump; the set once no rule uses it; then a base chain and the table that
    this module created, once empty."""
    chains = _chains(nft)
    _READY.clear()
    _COUNTS.pop(_key(host_netns), None)
    left = len(chains)
    for base, _hook, ours, _which in CHAINS:
        if ours not in chains:
            continue
        rules = rules_in(nft, ours)
        if not all(_is_lookup(r) for r in rules):
            continue
        for rule in rules:
            _delete_rule(nft, ours, rule)
        base_rules = []
        for rule in rules_in(nft, base) if base in chains else []:
            if _jumps_to(rule, ours):
                _delete_rule(nft, base, rule)
            else:
                base_rules.append(rule)
        nft.chain("del", table=TABLE, name=ours)
        left -= 1
        base_chain = chains.get(base)
        if base_chain is not None and _ours(base_chain, "NFTA_CHAIN_USERDATA") and not base_rules:
            nft.chain("del", table=TABLE, name=base)
            left -= 1
    results = _transact(host_netns, _nl.set_delete(TABLE, SET))
    if any(code not in (0, errno.ENOENT, errno.EBUSY) for code in results):
        raise TunnelError("NOTRACK set: " + ", ".join(os.strerror(c) for c in results if c))
    if chains and not left and results != [errno.EBUSY]:
        tables = {t.get_attr("NFTA_TABLE_NAME"): t for t in nft.get_tables()}
        table = tables.get(TABLE)
        if table is not None and _ours(table, "NFTA_TABLE_USERDATA"):
            nft.table("del", name=TABLE)


def _delete_rule(nft: Any, chain: str, rule: Any) -> None:
    nft.rule("del", table=TABLE, chain=chain, handle=rule.get_attr("NFTA_RULE_HANDLE"))
