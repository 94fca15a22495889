"""CAA's NOTRACK rules for the VXLAN underlay, in the worker's netns, through nf_tables.

CAA adds (with iptables, `raw` table) a chain `peerpod-OUTPUT` jumped to from `OUTPUT` and a chain
`peerpod-PREROUTING` jumped to from `PREROUTING`, each holding one rule per pod:
`-d|-s <pod VM IP> -p udp --dport <vxlan port> -m comment --comment "peerpod [vni:N]" -j NOTRACK`.
This writes the same rules over netlink into table `ip raw` (the table iptables-nft uses for
`-t raw`, base chains at priority raw = -300): no binary to exec and no C library to load, and
`nft list table ip raw` (or iptables-nft) shows them with their comments. A pod's two rules go in
one nf_tables transaction packed directly (`_nl`) once the chains are known to exist; creating
chains and jumps, and pruning them, go through pyroute2 (once per node, not per pod).

Removing: the handles the kernel echoed when this process added a pod's rules are read back one by
one (a lookup, not a dump: the cost does not grow with the pods) and, still the pod's by comment
and address, deleted in one transaction; the chains' use counts then say whether one may be empty.
A pod whose handles are not known (added before a restart, or by the slow path) is found as before:
one filtered dump per chain, parsed by hand. A `peerpod-*` chain left empty goes with its jump. A
base chain or the table is deleted only when this module created it (it carries the comment
`peerpod`) and it is empty, so a node whose raw table belongs to someone else keeps it exactly as
it was.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.nfnetlink.nftsocket import NFT_MSG_GETRULE, nft_rule_msg

from adaptor.podnet import _netns, _nl
from adaptor.podnet._errors import TunnelError

TABLE = "raw"
OWNER_COMMENT = "peerpod"
NF_IP_PRI_RAW = -300
NFT_JUMP = -3
NFT_META_L4PROTO = 16
NFT_PAYLOAD_NETWORK_HEADER = 1
NFT_PAYLOAD_TRANSPORT_HEADER = 2
# (base chain, its hook, our chain, which address the rule matches)
CHAINS = (
    ("OUTPUT", "output", "peerpod-OUTPUT", "dst"),
    ("PREROUTING", "prerouting", "peerpod-PREROUTING", "src"),
)

# One process-wide lock, as CAA has: nf_tables commands are atomic one by one, but "create the
# chain if missing, then add the rule" and "delete the chain if empty" are not.
_LOCK = threading.Lock()
# Worker netns whose chains and jumps this process made or saw (cleared when it prunes one):
# there a fresh pod's rules are added without reading anything first. All under _LOCK, as is
# the one nf_tables socket kept open per worker netns.
_READY: set[int] = set()
_SOCKETS: dict[int, _nl.Netlink] = {}
# By worker netns and VNI, the (chain, handle) of each rule this process added for the pod; None
# where some are not known (the slow path), so removal reads the chains. Handles are unique in a
# table while it lives: forgotten with the sockets and when a chain or the table is pruned.
_HANDLES: dict[int, dict[int, list[tuple[str, int]] | None]] = {}


def comment(vni: int) -> str:
    """CAA's rule comment for a pod."""
    return f"peerpod [vni:{vni}]"


def _expr(name: str, **attrs: Any) -> dict[str, Any]:
    expr: list[tuple[str, Any]] = [("NFTA_EXPR_NAME", name)]
    if attrs:
        data = [(f"NFTA_{name.upper()}_{key.upper()}", value) for key, value in attrs.items()]
        expr.append(("NFTA_EXPR_DATA", {"attrs": data}))
    return {"attrs": expr}


def _value(data: bytes) -> dict[str, Any]:
    return {"attrs": [("NFTA_DATA_VALUE", data)]}


def _match(address: str, port: int, which: str) -> list[dict[str, Any]]:
    """`ip saddr|daddr ADDRESS udp dport PORT notrack`."""
    return [
        _expr(
            "payload",
            dreg=1,
            base=NFT_PAYLOAD_NETWORK_HEADER,
            offset=12 if which == "src" else 16,
            len=4,
        ),
        _expr("cmp", sreg=1, op=0, data=_value(socket.inet_aton(address))),
        _expr("meta", key=NFT_META_L4PROTO, dreg=1),
        _expr("cmp", sreg=1, op=0, data=_value(bytes([socket.IPPROTO_UDP]))),
        _expr("payload", dreg=1, base=NFT_PAYLOAD_TRANSPORT_HEADER, offset=2, len=2),
        _expr("cmp", sreg=1, op=0, data=_value(struct.pack(">H", port))),
        {"attrs": [("NFTA_EXPR_NAME", "notrack")]},
    ]


def _jump(chain: str) -> list[dict[str, Any]]:
    verdict = {"attrs": [("NFTA_VERDICT_CODE", NFT_JUMP), ("NFTA_VERDICT_CHAIN", chain)]}
    return [_expr("immediate", dreg=0, data={"attrs": [("NFTA_DATA_VERDICT", verdict)]})]


def rules_in(nft: Any, chain: str) -> list[Any]:
    """The rules of one chain of table `raw`: a dump the kernel filters, so an operation decodes
    only the chains it reads (decoding is what costs, and peerpod chains grow with pods)."""
    msg = nft_rule_msg()
    msg["attrs"] = [("NFTA_RULE_TABLE", TABLE), ("NFTA_RULE_CHAIN", chain)]
    try:
        return list(nft.request_get(msg, NFT_MSG_GETRULE))
    except NetlinkError as exc:
        if exc.code == errno.ENOENT:
            return []
        raise


def _ours_rule(rule: Any, vni: int, remote: str) -> bool:
    return bool(
        rule.get_attr("NFTA_RULE_USERDATA") == comment(vni)
        and (not remote or _matches_address(rule, remote))
    )


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


def _matches_address(rule: Any, address: str) -> bool:
    packed = socket.inet_aton(address)
    for expr in rule.get_attr("NFTA_RULE_EXPRESSIONS") or ():
        if expr.get_attr("NFTA_EXPR_NAME") != "cmp":
            continue
        data = expr.get_attr("NFTA_EXPR_DATA")
        value = data.get_attr("NFTA_CMP_DATA") if data is not None else None
        raw = value.get_attr("NFTA_DATA_VALUE") if value is not None else None
        if _as_bytes(raw) == packed:
            return True
    return False


def _as_bytes(raw: Any) -> bytes:
    if isinstance(raw, bytes):
        return raw
    if isinstance(raw, str):
        # pyroute2 decodes binary values as "aa:bb:cc" hex strings.
        try:
            return bytes(int(part, 16) for part in raw.split(":"))
        except ValueError:
            return raw.encode()
    return b""


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
    _HANDLES.clear()


def close_sockets() -> None:
    """Close the kept nf_tables sockets."""
    with _LOCK:
        _drop_sockets()
        _READY.clear()


def _raw_match(address: str, port: int, which: str) -> list[bytes]:
    """`_match` packed directly (the same expressions, attribute for attribute)."""

    def value(data: bytes) -> bytes:
        return _nl.nest(3, _nl.attr(_nl.NFTA_DATA_VALUE, data))

    offset = 12 if which == "src" else 16
    eq = (_nl.be32(1, 1), _nl.be32(2, 0))
    return [
        _nl.expr(
            "payload",
            _nl.be32(1, 1),
            _nl.be32(2, NFT_PAYLOAD_NETWORK_HEADER),
            _nl.be32(3, offset),
            _nl.be32(4, 4),
        ),
        _nl.expr("cmp", *eq, value(socket.inet_aton(address))),
        _nl.expr("meta", _nl.be32(1, 1), _nl.be32(2, NFT_META_L4PROTO)),
        _nl.expr("cmp", *eq, value(bytes([socket.IPPROTO_UDP]))),
        _nl.expr(
            "payload",
            _nl.be32(1, 1),
            _nl.be32(2, NFT_PAYLOAD_TRANSPORT_HEADER),
            _nl.be32(3, 2),
            _nl.be32(4, 2),
        ),
        _nl.expr("cmp", *eq, value(struct.pack(">H", port))),
        _nl.expr("notrack"),
    ]


def _add_fresh(host_netns: str | None, vni: int, remote: str, port: int) -> bool:
    """A fresh pod's two rules, one transaction, into chains known to exist; False when they
    were not there (nothing was added: a transaction is all or nothing)."""
    rules = [
        _nl.rule_add(TABLE, ours, _raw_match(remote, port, which), comment(vni), echo=True)
        for _base, _hook, ours, which in CHAINS
    ]
    echoes: list[tuple[int, bytes]] = []
    try:
        results = _socket(host_netns).transact(_nl.nft_batch(*rules), echoes)
    except OSError:
        results = [errno.EIO]
    if any(results):
        _READY.clear()
        _drop_sockets()
        return False
    pods = _HANDLES.setdefault(_key(host_netns), {})
    echoed = [_nl.rule_of(payload) for kind, payload in echoes if _nl.is_new_rule(kind)]
    added = [(r.chain, r.handle) for r in echoed if r.chain and r.handle]
    known = pods.get(vni, [])
    pods[vni] = known + added if known is not None and len(added) == len(rules) else None
    return True


def add(host_netns: str | None, vni: int, remote: str, port: int, fresh: bool = False) -> None:
    """Both NOTRACK rules for a pod (each once), with chains and jumps created as needed.
    `fresh`: the pod has none yet, so where the chains are known, nothing is read first (a
    rule added twice by a retry is removed with the other: removal takes every match)."""
    with _LOCK:
        if fresh and _key(host_netns) in _READY and _add_fresh(host_netns, vni, remote, port):
            return
        try:
            with _netns.nftables(host_netns) as nft:
                chains = _chains(nft)
                if not chains:
                    tables = [t.get_attr("NFTA_TABLE_NAME") for t in nft.get_tables()]
                    if TABLE not in tables:
                        nft.table("add", name=TABLE, userdata=OWNER_COMMENT)
                for base, hook, ours, which in CHAINS:
                    if base not in chains:
                        nft.chain(
                            "add",
                            table=TABLE,
                            name=base,
                            hook=hook,
                            type="filter",
                            priority=NF_IP_PRI_RAW,
                            userdata=OWNER_COMMENT,
                        )
                    if ours not in chains:
                        nft.chain("add", table=TABLE, name=ours)
                    base_rules = rules_in(nft, base) if base in chains else []
                    if not any(_jumps_to(r, ours) for r in base_rules):
                        nft.rule("add", table=TABLE, chain=base, expressions=[_jump(ours)])
                    our_rules = rules_in(nft, ours) if ours in chains else []
                    if not any(_ours_rule(r, vni, remote) for r in our_rules):
                        nft.rule(
                            "add",
                            table=TABLE,
                            chain=ours,
                            expressions=[_match(remote, port, which)],
                            userdata=comment(vni),
                        )
            _READY.add(_key(host_netns))
            _HANDLES.setdefault(_key(host_netns), {})[vni] = None
        except NetlinkError as exc:
            raise TunnelError(f"NOTRACK rules for VNI {vni}: {exc}") from None


def present(host_netns: str | None, vni: int, remote: str) -> bool:
    """Whether both of a pod's rules are in place."""
    with _netns.nftables(host_netns) as nft:
        return all(
            any(_ours_rule(r, vni, remote) for r in rules_in(nft, ours))
            for _base, _hook, ours, _which in CHAINS
        )


def _matching(host_netns: str | None, vni: int, remote: str) -> tuple[list[_nl.Message], bool]:
    """The deletes of a pod's rules, read with one dump per peerpod chain parsed by hand, and
    whether a chain is left empty by them (or is missing: the slow path then looks)."""
    sock = _socket(host_netns)
    mark = _nl.udata_comment(comment(vni))
    address = _nl.attr(_nl.NFTA_DATA_VALUE, socket.inet_aton(remote)) if remote else b""
    deletes: list[_nl.Message] = []
    emptied = False
    for _base, _hook, ours, _which in CHAINS:
        try:
            rules = [_nl.rule_of(p) for p in sock.get(_nl.rules_get(TABLE, ours))]
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                emptied = True
                continue
            raise
        mine = [r for r in rules if r.userdata == mark and address in r.expressions]
        deletes += [_nl.rule_delete(TABLE, ours, r.handle) for r in mine]
        emptied = emptied or len(mine) == len(rules)
    return deletes, emptied


def _recorded(
    host_netns: str | None, vni: int, remote: str, known: list[tuple[str, int]]
) -> list[_nl.Message] | None:
    """The deletes of a pod's rules by the handles recorded when they were added, each read
    back first; None when one is no longer the pod's (the chains are read instead)."""
    sock = _socket(host_netns)
    mark = _nl.udata_comment(comment(vni))
    address = _nl.attr(_nl.NFTA_DATA_VALUE, socket.inet_aton(remote)) if remote else b""
    deletes: list[_nl.Message] = []
    for chain, handle in known:
        try:
            found = [_nl.rule_of(p) for p in sock.get(_nl.rule_get(TABLE, chain, handle))]
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                continue
            raise
        if not all(r.userdata == mark and address in r.expressions for r in found):
            return None
        deletes.append(_nl.rule_delete(TABLE, chain, handle))
    return deletes


def _may_be_empty(host_netns: str | None) -> bool:
    """Whether a peerpod chain is missing or holds at most one rule besides the jump into it
    (its use count is its rules plus the jumps into it): then `_prune` reads it."""
    sock = _socket(host_netns)
    for _base, _hook, ours, _which in CHAINS:
        try:
            chains = sock.get(_nl.chain_get(TABLE, ours))
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return True
            raise
        if any(_nl.chain_use(payload) <= 2 for payload in chains):
            return True
    return False


def remove(host_netns: str | None, vni: int, remote: str) -> None:
    """A pod's rules; then each emptied peerpod chain with its jump; then what we created."""
    with _LOCK:
        try:
            known = _HANDLES.get(_key(host_netns), {}).pop(vni, None)
            deletes = _recorded(host_netns, vni, remote, known) if known is not None else None
            emptied: bool | None = None
            if deletes is None:
                deletes, emptied = _matching(host_netns, vni, remote)
            results = _socket(host_netns).transact(_nl.nft_batch(*deletes)) if deletes else []
            if any(code not in (0, errno.ENOENT) for code in results):
                raise TunnelError(
                    f"removing NOTRACK rules of VNI {vni}: "
                    + ", ".join(os.strerror(c) for c in results if c)
                )
            if emptied is None:
                emptied = _may_be_empty(host_netns)
        except OSError as exc:
            _drop_sockets()
            raise TunnelError(f"removing NOTRACK rules of VNI {vni}: {exc}") from None
        if not emptied:
            return
        try:
            with _netns.nftables(host_netns) as nft:
                _prune(nft, _chains(nft))
        except NetlinkError as exc:
            raise TunnelError(f"removing NOTRACK rules of VNI {vni}: {exc}") from None


def remove_handles(host_netns: str | None, rules: list[tuple[str, int]]) -> int:
    """Delete rules by (chain, handle), then prune as `remove` does; how many were deleted."""
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
                _prune(nft, _chains(nft))
        except NetlinkError as exc:
            raise TunnelError(f"removing orphan NOTRACK rules: {exc}") from None
    return deleted


def _prune(nft: Any, chains: dict[str, Any]) -> None:
    """Each peerpod chain left empty goes with its jump; then a base chain and the table that
    this module created, once empty."""
    left = len(chains)
    for base, _hook, ours, _which in CHAINS:
        if ours not in chains or rules_in(nft, ours):
            continue
        _READY.clear()
        _HANDLES.clear()
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
    if chains and not left:
        tables = {t.get_attr("NFTA_TABLE_NAME"): t for t in nft.get_tables()}
        table = tables.get(TABLE)
        if table is not None and _ours(table, "NFTA_TABLE_USERDATA"):
            nft.table("del", name=TABLE)


def _delete_rule(nft: Any, chain: str, rule: Any) -> None:
    nft.rule("del", table=TABLE, chain=chain, handle=rule.get_attr("NFTA_RULE_HANDLE"))
