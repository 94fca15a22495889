"""Netlink spoken directly for the tunnel's few fixed messages: packed with struct, sent as one
datagram, acknowledgements read back.

pyroute2 builds and parses every message through its generic attribute machinery, about a
millisecond of CPU each; a tunnel's setup is a dozen messages whose layout never changes. Here
each is a few struct.pack calls, and one sendmsg carries a whole batch: the kernel handles the
requests of a datagram in order, within the send (rtnetlink and nfnetlink both), so every
acknowledgement is queued before send() returns. Dumps are read until NLMSG_DONE.

Only what the tunnel needs: rtnetlink (a VXLAN link, the ingress qdisc, a u32 filter whose
action is `mirred egress redirect`, deletes, a link by name) and nf_tables (a table, chains and
rules added in one batch, the chains and the rules of one chain read, a set and its elements).
Blocking; errors are errno values per message.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

NETLINK_ROUTE = 0
NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10

NLMSG_ERROR, NLMSG_DONE = 2, 3
F_REQUEST, F_MULTI, F_ACK, F_ECHO = 0x1, 0x2, 0x4, 0x8
F_DUMP, F_EXCL, F_CREATE, F_APPEND = 0x300, 0x200, 0x400, 0x800
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF
_HEADER = struct.Struct("=IHHII")
_ATTR = struct.Struct("=HH")

# rtnetlink
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_NEWQDISC, RTM_DELQDISC, RTM_GETQDISC = 36, 37, 38
RTM_NEWTFILTER, RTM_DELTFILTER, RTM_GETTFILTER = 44, 45, 46
IFLA_IFNAME, IFLA_LINKINFO, IFLA_GROUP, IFLA_NET_NS_FD = 3, 18, 27, 28
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
IFLA_VXLAN_ID, IFLA_VXLAN_GROUP, IFLA_VXLAN_TTL, IFLA_VXLAN_TOS = 1, 2, 5, 6
IFLA_VXLAN_LEARNING, IFLA_VXLAN_PROXY, IFLA_VXLAN_PORT = 7, 11, 15
IFF_UP = 0x1
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_U32_CLASSID, TCA_U32_SEL, TCA_U32_ACT = 1, 5, 7
TC_U32_TERMINAL = 1
TCA_ACT_KIND, TCA_ACT_OPTIONS = 1, 2
TCA_MIRRED_PARMS = 2
TC_ACT_STOLEN, TCA_EGRESS_REDIR = 4, 1
TC_H_INGRESS, INGRESS_HANDLE = 0xFFFFFFF1, 0xFFFF0000
ETH_P_ALL = 0x0003
# The u32 key node our one redirect filter uses (ht 800, bucket 0, node 800): a fixed handle,
# so adding it again is EEXIST instead of a second filter.
U32_HANDLE = 0x80000800

# nf_tables
NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 0x10, 0x11
NFT_MSG_NEWTABLE, NFT_MSG_GETTABLE = 0, 1
NFT_MSG_NEWCHAIN, NFT_MSG_GETCHAIN = 3, 4
NFT_MSG_NEWRULE, NFT_MSG_GETRULE = 6, 7
NFTA_TABLE_NAME, NFTA_TABLE_USERDATA = 1, 6
NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME, NFTA_CHAIN_HOOK, NFTA_CHAIN_TYPE = 1, 3, 4, 7
NFTA_CHAIN_USERDATA = 12
NFTA_HOOK_HOOKNUM, NFTA_HOOK_PRIORITY = 1, 2
NFTA_IMMEDIATE_DREG, NFTA_IMMEDIATE_DATA = 1, 2
NFTA_DATA_VERDICT = 2
NFTA_VERDICT_CODE, NFTA_VERDICT_CHAIN = 1, 2
NFT_JUMP = -3
NFTA_RULE_TABLE, NFTA_RULE_CHAIN = 1, 2
NFTA_RULE_EXPRESSIONS, NFTA_RULE_USERDATA = 4, 7
NFTA_LIST_ELEM = 1
NFTA_EXPR_NAME, NFTA_EXPR_DATA = 1, 2
NFTA_DATA_VALUE = 1
NFPROTO_IPV4 = 2
NFT_MSG_NEWSET, NFT_MSG_DELSET = 9, 11
NFT_MSG_NEWSETELEM, NFT_MSG_GETSETELEM, NFT_MSG_DELSETELEM = 12, 13, 14
NFTA_SET_TABLE, NFTA_SET_NAME, NFTA_SET_KEY_TYPE, NFTA_SET_KEY_LEN = 1, 2, 4, 5
NFTA_SET_ID = 10
NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_ELEMENTS = 1, 2, 3
NFTA_SET_ELEM_KEY, NFTA_SET_ELEM_USERDATA = 1, 6


class NetlinkFailure(OSError):
    """A netlink exchange itself failed (no answer, a malformed one)."""


@dataclass(frozen=True)
class Message:
    """One request: its type, flags (REQUEST is added) and body after the netlink header."""

    type: int
    flags: int
    body: bytes


def attr(kind: int, payload: bytes) -> bytes:
    length = _ATTR.size + len(payload)
    return _ATTR.pack(length, kind) + payload + b"\0" * (-length % 4)


def nest(kind: int, *attrs: bytes) -> bytes:
    return attr(kind | NLA_F_NESTED, b"".join(attrs))


def u32(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=I", value))


def be32(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack(">I", value))


def asciiz(kind: int, text: str) -> bytes:
    return attr(kind, text.encode() + b"\0")


def attrs(data: bytes, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """(type without flags, payload) of each attribute from `offset` on."""
    end = len(data)
    while offset + _ATTR.size <= end:
        length, kind = _ATTR.unpack_from(data, offset)
        if length < _ATTR.size:
            return
        yield kind & NLA_TYPE_MASK, data[offset + _ATTR.size : offset + length]
        offset += (length + 3) & ~3


def attr_map(data: bytes, offset: int = 0) -> dict[int, bytes]:
    return dict(attrs(data, offset))


class Netlink:
    """One netlink socket of `protocol`, in the netns of the thread that made it."""

    def __init__(self, protocol: int) -> None:
        self.sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol
        )
        try:
            self.sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)  # acks without the request
            self.sock.bind((0, 0))
            self.sock.settimeout(10)
        except OSError:
            self.sock.close()
            raise
        self._seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Netlink:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _pack(self, messages: Sequence[Message]) -> tuple[bytes, list[int]]:
        parts, seqs = [], []
        for message in messages:
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            seqs.append(self._seq)
            header = _HEADER.pack(
                _HEADER.size + len(message.body),
                message.type,
                message.flags | F_REQUEST,
                self._seq,
                0,
            )
            parts.append(header + message.body)
        return b"".join(parts), seqs

    def transact(
        self, messages: Sequence[Message], echoes: list[tuple[int, bytes]] | None = None
    ) -> list[int]:
        """Send `messages` in one datagram; for each with F_ACK, its errno (0: done), in
        order; a message the kernel never answered (a batch it abandoned) reads ECANCELED.
        `echoes` gets (type, payload) of what the kernel sent back besides acks (F_ECHO)."""
        if not messages:
            return []
        data, seqs = self._pack(messages)
        self.sock.send(data)
        wanted = {s for s, m in zip(seqs, messages, strict=True) if m.flags & F_ACK}
        answers: dict[int, int] = {}
        while len(answers) < len(wanted):
            try:
                reply = self.sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            for kind, _flags, seq, payload in _messages(reply):
                if kind == NLMSG_ERROR and seq in wanted:
                    answers[seq] = -struct.unpack_from("=i", payload)[0]
                elif echoes is not None and kind != NLMSG_DONE and seq in seqs:
                    echoes.append((kind, payload))
        return [
            answers.get(s, errno.ECANCELED)
            for s, m in zip(seqs, messages, strict=True)
            if m.flags & F_ACK
        ]

    def get(self, message: Message) -> list[bytes]:
        """One request that answers with messages (a dump, or one object): their payloads;
        OSError with the kernel's errno when it refuses."""
        data, (seq,) = self._pack([message])
        self.sock.send(data)
        found: list[bytes] = []
        while True:
            try:
                reply = self.sock.recv(1 << 17)
            except TimeoutError:
                raise NetlinkFailure(errno.ETIMEDOUT, "netlink: no answer") from None
            for kind, flags, got, payload in _messages(reply):
                if got != seq:
                    continue
                if kind == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", payload)[0]
                    if code:
                        raise OSError(code, errno.errorcode.get(code, str(code)))
                    return found
                if kind == NLMSG_DONE:
                    return found
                found.append(payload)
                if not flags & F_MULTI:
                    return found


def _messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, flags, seq, _pid = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            raise NetlinkFailure(errno.EPROTO, "netlink: malformed message")
        yield kind, flags, seq, data[offset + _HEADER.size : offset + length]
        offset += (length + 3) & ~3


# --- rtnetlink ------------------------------------------------------------------------------------


def _ifinfo(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    return struct.pack("=BxHiII", socket.AF_UNSPEC, 0, index, flags, change)


def _tcmsg(index: int, handle: int, parent: int, info: int = 0) -> bytes:
    return struct.pack("=BxxxiIII", socket.AF_UNSPEC, index, handle, parent, info)


def vxlan_create(name: str, vni: int, remote: str, port: int, netns_fd: int, group: int) -> Message:
    """A VXLAN device created up, tagged with `group`, placed in the netns of `netns_fd`."""
    data = nest(
        IFLA_INFO_DATA,
        u32(IFLA_VXLAN_ID, vni),
        attr(IFLA_VXLAN_GROUP, socket.inet_aton(remote)),
        attr(IFLA_VXLAN_PORT, struct.pack(">H", port)),
        attr(IFLA_VXLAN_LEARNING, b"\0"),
        attr(IFLA_VXLAN_PROXY, b"\0"),
        attr(IFLA_VXLAN_TTL, b"\0"),
        attr(IFLA_VXLAN_TOS, b"\0"),
    )
    body = (
        _ifinfo(flags=IFF_UP, change=IFF_UP)
        + asciiz(IFLA_IFNAME, name)
        + u32(IFLA_GROUP, group)
        + u32(IFLA_NET_NS_FD, netns_fd)
        + nest(IFLA_LINKINFO, asciiz(IFLA_INFO_KIND, "vxlan"), data)
    )
    return Message(RTM_NEWLINK, F_ACK | F_CREATE | F_EXCL, body)


def link_up(index: int) -> Message:
    return Message(RTM_NEWLINK, F_ACK, _ifinfo(index, IFF_UP, IFF_UP))


def link_down(index: int) -> Message:
    return Message(RTM_NEWLINK, F_ACK, _ifinfo(index, 0, IFF_UP))


def link_delete(index: int) -> Message:
    return Message(RTM_DELLINK, F_ACK, _ifinfo(index))


def link_get(name: str) -> Message:
    return Message(RTM_GETLINK, 0, _ifinfo() + asciiz(IFLA_IFNAME, name))


@dataclass(frozen=True)
class Vxlan:
    """What a link reply says of a VXLAN device."""

    index: int
    group: int
    vni: int
    remote: str
    port: int


def vxlan_of(payload: bytes) -> Vxlan | None:
    """The VXLAN facts of an RTM_NEWLINK payload (None: not a VXLAN device)."""
    index = struct.unpack_from("=i", payload, 4)[0]
    top = attr_map(payload, 16)
    info = attr_map(top.get(IFLA_LINKINFO, b""))
    if info.get(IFLA_INFO_KIND, b"").rstrip(b"\0") != b"vxlan":
        return None
    data = attr_map(info.get(IFLA_INFO_DATA, b""))
    group = struct.unpack("=I", top[IFLA_GROUP])[0] if IFLA_GROUP in top else 0
    vni = struct.unpack("=I", data[IFLA_VXLAN_ID])[0] if IFLA_VXLAN_ID in data else -1
    remote = socket.inet_ntoa(data[IFLA_VXLAN_GROUP]) if IFLA_VXLAN_GROUP in data else ""
    port = struct.unpack(">H", data[IFLA_VXLAN_PORT])[0] if IFLA_VXLAN_PORT in data else 0
    return Vxlan(index, group, vni, remote, port)


def links_get() -> Message:
    return Message(RTM_GETLINK, F_DUMP, _ifinfo())


def qdiscs_get() -> Message:
    return Message(RTM_GETQDISC, F_DUMP, _tcmsg(0, 0, 0))


def ingress_filters_get(index: int) -> Message:
    return Message(RTM_GETTFILTER, F_DUMP, _tcmsg(index, 0, INGRESS_HANDLE))


def tc_kind(payload: bytes) -> tuple[int, str]:
    """(ifindex, TCA_KIND) of a qdisc or filter reply."""
    index = struct.unpack_from("=i", payload, 4)[0]
    kind = attr_map(payload, 20).get(TCA_KIND, b"").rstrip(b"\0").decode(errors="replace")
    return index, kind


def is_ours(payload: bytes) -> bool:
    """Whether a filter reply has the shape of our redirect: prio 1, handle 800::800."""
    handle, _parent, info = struct.unpack_from("=III", payload, 8)
    return bool(handle == U32_HANDLE and info >> 16 == 1)


def redirect_of(payload: bytes) -> tuple[int, int] | None:
    """(prio, target ifindex) of a u32 filter reply whose action is `mirred egress redirect`
    (target 0: the kernel dropped it with its device); None for anything else."""
    info = struct.unpack_from("=I", payload, 16)[0]
    top = attr_map(payload, 20)
    if top.get(TCA_KIND, b"").rstrip(b"\0") != b"u32":
        return None
    actions = attr_map(top.get(TCA_OPTIONS, b"")).get(TCA_U32_ACT)
    if actions is None:
        return None
    for _prio, action in attrs(actions):
        fields = attr_map(action)
        if fields.get(TCA_ACT_KIND, b"").rstrip(b"\0") != b"mirred":
            continue
        parms = attr_map(fields.get(TCA_ACT_OPTIONS, b"")).get(TCA_MIRRED_PARMS, b"")
        if len(parms) >= 28:
            eaction, target = struct.unpack_from("=iI", parms, 20)
            if eaction == TCA_EGRESS_REDIR:
                return info >> 16, target
    return None


def filter_delete(index: int, prio: int) -> Message:
    """Every ingress filter of `index` at `prio`."""
    return Message(RTM_DELTFILTER, F_ACK, _tcmsg(index, 0, INGRESS_HANDLE, prio << 16))


def ingress_add(index: int) -> Message:
    body = _tcmsg(index, INGRESS_HANDLE, TC_H_INGRESS) + asciiz(TCA_KIND, "ingress")
    return Message(RTM_NEWQDISC, F_ACK | F_CREATE | F_EXCL, body)


def ingress_delete(index: int) -> Message:
    """The ingress qdisc, and with it every filter attached to it."""
    body = _tcmsg(index, INGRESS_HANDLE, TC_H_INGRESS) + asciiz(TCA_KIND, "ingress")
    return Message(RTM_DELQDISC, F_ACK, body)


def redirect_add(index: int, target: int, prio: int) -> Message:
    """`tc filter add dev <index> ingress prio <prio> protocol all u32 match u32 0 0
    action mirred egress redirect dev <target>`."""
    selector = struct.pack("=BBBxHHhhI", TC_U32_TERMINAL, 0, 1, 0, 0, 0, 0, 0)
    key = struct.pack("=IIii", 0, 0, 0, 0)
    mirred = struct.pack("=IIiiiiI", 0, 0, TC_ACT_STOLEN, 0, 0, TCA_EGRESS_REDIR, target)
    action = nest(
        1,
        asciiz(TCA_ACT_KIND, "mirred"),
        nest(TCA_ACT_OPTIONS, attr(TCA_MIRRED_PARMS, mirred)),
    )
    options = nest(
        TCA_OPTIONS,
        u32(TCA_U32_CLASSID, 0x10001),
        attr(TCA_U32_SEL, selector + key),
        nest(TCA_U32_ACT, action),
    )
    info = (prio << 16) | socket.htons(ETH_P_ALL)
    body = _tcmsg(index, U32_HANDLE, INGRESS_HANDLE, info) + asciiz(TCA_KIND, "u32") + options
    return Message(RTM_NEWTFILTER, F_ACK | F_CREATE | F_EXCL, body)


# --- nf_tables ------------------------------------------------------------------------------------


def _nfgen(res_id: int = 0) -> bytes:
    return struct.pack("=BBH", NFPROTO_IPV4, 0, socket.htons(res_id))


def _nft(kind: int) -> int:
    return (NFNL_SUBSYS_NFTABLES << 8) | kind


def nft_batch(*messages: Message) -> list[Message]:
    """Messages wrapped in one nf_tables transaction."""
    begin = Message(NFNL_MSG_BATCH_BEGIN, 0, _nfgen(NFNL_SUBSYS_NFTABLES))
    end = Message(NFNL_MSG_BATCH_END, 0, _nfgen(NFNL_SUBSYS_NFTABLES))
    return [begin, *messages, end]


def expr(name: str, *data: bytes) -> bytes:
    parts = [asciiz(NFTA_EXPR_NAME, name)]
    if data:
        parts.append(nest(NFTA_EXPR_DATA, *data))
    return nest(NFTA_LIST_ELEM, *parts)


def udata_comment(text: str) -> bytes:
    """A rule comment as nft(8) and libnftnl store it in the rule's userdata: a TLV."""
    value = text.encode() + b"\0"
    return bytes([0, len(value)]) + value


def rule_add(
    table: str, chain: str, expressions: Sequence[bytes], comment: str = "", echo: bool = False
) -> Message:
    """Appended to `chain`, with `comment` ("": no userdata); `echo`: the kernel sends the rule
    back as added, handle included."""
    body = (
        _nfgen()
        + asciiz(NFTA_RULE_TABLE, table)
        + asciiz(NFTA_RULE_CHAIN, chain)
        + nest(NFTA_RULE_EXPRESSIONS, *expressions)
    )
    if comment:
        body += attr(NFTA_RULE_USERDATA, udata_comment(comment))
    flags = F_ACK | F_CREATE | F_APPEND | (F_ECHO if echo else 0)
    return Message(_nft(NFT_MSG_NEWRULE), flags, body)


def jump(chain: str) -> bytes:
    """The expression `jump <chain>`."""
    verdict = nest(
        NFTA_DATA_VERDICT,
        attr(NFTA_VERDICT_CODE, struct.pack(">i", NFT_JUMP)),
        asciiz(NFTA_VERDICT_CHAIN, chain),
    )
    return expr("immediate", be32(NFTA_IMMEDIATE_DREG, 0), nest(NFTA_IMMEDIATE_DATA, verdict))


def table_add(name: str, comment: str) -> Message:
    """A table with `comment` (an existing one is kept as it is: no F_EXCL, no flags)."""
    body = _nfgen() + asciiz(NFTA_TABLE_NAME, name)
    body += attr(NFTA_TABLE_USERDATA, udata_comment(comment))
    return Message(_nft(NFT_MSG_NEWTABLE), F_ACK | F_CREATE | F_APPEND, body)


def table_get(name: str) -> Message:
    """One table by name (ENOENT: there is none)."""
    return Message(_nft(NFT_MSG_GETTABLE), 0, _nfgen() + asciiz(NFTA_TABLE_NAME, name))


def chain_add(
    table: str, name: str, hook: int | None = None, priority: int = 0, comment: str = ""
) -> Message:
    """A regular chain, or with `hook` a base chain of type filter at `priority`."""
    body = _nfgen() + asciiz(NFTA_CHAIN_TABLE, table) + asciiz(NFTA_CHAIN_NAME, name)
    if hook is not None:
        body += nest(
            NFTA_CHAIN_HOOK,
            be32(NFTA_HOOK_HOOKNUM, hook),
            attr(NFTA_HOOK_PRIORITY, struct.pack(">i", priority)),
        )
        body += asciiz(NFTA_CHAIN_TYPE, "filter")
    if comment:
        body += attr(NFTA_CHAIN_USERDATA, udata_comment(comment))
    return Message(_nft(NFT_MSG_NEWCHAIN), F_ACK | F_CREATE | F_APPEND, body)


def chain_get(table: str, name: str) -> Message:
    """One chain by name (ENOENT: it or its table is missing). Asked one by one: the kernel
    filters a chain dump by family only, and a node's kube-proxy may keep hundreds."""
    body = _nfgen() + asciiz(NFTA_CHAIN_TABLE, table) + asciiz(NFTA_CHAIN_NAME, name)
    return Message(_nft(NFT_MSG_GETCHAIN), 0, body)


def rules_get(table: str, chain: str) -> Message:
    """The rules of one chain (a dump the kernel filters by table and chain)."""
    body = _nfgen() + asciiz(NFTA_RULE_TABLE, table) + asciiz(NFTA_RULE_CHAIN, chain)
    return Message(_nft(NFT_MSG_GETRULE), F_DUMP, body)


def rule_of(payload: bytes) -> tuple[str, list[str]]:
    """(comment, the chains its verdicts jump or go to) of a rule reply."""
    top = attr_map(payload, 4)
    targets = []
    for _kind, expression in attrs(top.get(NFTA_RULE_EXPRESSIONS, b"")):
        fields = attr_map(expression)
        if fields.get(NFTA_EXPR_NAME, b"").rstrip(b"\0") != b"immediate":
            continue
        data = attr_map(attr_map(fields.get(NFTA_EXPR_DATA, b"")).get(NFTA_IMMEDIATE_DATA, b""))
        verdict = attr_map(data.get(NFTA_DATA_VERDICT, b""))
        if NFTA_VERDICT_CHAIN in verdict:
            targets.append(verdict[NFTA_VERDICT_CHAIN].rstrip(b"\0").decode(errors="replace"))
    return comment_of(top.get(NFTA_RULE_USERDATA, b"")), targets


def set_add(table: str, name: str, key_type: int, key_len: int) -> Message:
    """A set (kept as it is when it exists already)."""
    body = (
        _nfgen()
        + asciiz(NFTA_SET_TABLE, table)
        + asciiz(NFTA_SET_NAME, name)
        + be32(NFTA_SET_KEY_TYPE, key_type)
        + be32(NFTA_SET_KEY_LEN, key_len)
        + be32(NFTA_SET_ID, 1)
    )
    return Message(_nft(NFT_MSG_NEWSET), F_ACK | F_CREATE, body)


def set_delete(table: str, name: str) -> Message:
    body = _nfgen() + asciiz(NFTA_SET_TABLE, table) + asciiz(NFTA_SET_NAME, name)
    return Message(_nft(NFT_MSG_DELSET), F_ACK, body)


def _elements(table: str, name: str, *elements: bytes) -> bytes:
    body = _nfgen() + asciiz(NFTA_SET_ELEM_LIST_TABLE, table) + asciiz(NFTA_SET_ELEM_LIST_SET, name)
    if elements:
        body += nest(NFTA_SET_ELEM_LIST_ELEMENTS, *elements)
    return body


def _element(key: bytes, comment: str = "") -> bytes:
    parts = [nest(NFTA_SET_ELEM_KEY, attr(NFTA_DATA_VALUE, key))]
    if comment:
        parts.append(attr(NFTA_SET_ELEM_USERDATA, udata_comment(comment)))
    return nest(NFTA_LIST_ELEM, *parts)


def element_add(table: str, name: str, key: bytes, comment: str) -> Message:
    """One element with its comment; EEXIST when the key is there already."""
    body = _elements(table, name, _element(key, comment))
    return Message(_nft(NFT_MSG_NEWSETELEM), F_ACK | F_CREATE | F_EXCL, body)


def element_delete(table: str, name: str, key: bytes) -> Message:
    return Message(_nft(NFT_MSG_DELSETELEM), F_ACK, _elements(table, name, _element(key)))


def element_get(table: str, name: str, key: bytes) -> Message:
    """One element by its key (the kernel looks it up: nothing else is sent back)."""
    return Message(_nft(NFT_MSG_GETSETELEM), 0, _elements(table, name, _element(key)))


def elements_get(table: str, name: str) -> Message:
    return Message(_nft(NFT_MSG_GETSETELEM), F_DUMP, _elements(table, name))


def comment_of(userdata: bytes) -> str:
    """The comment TLV (type 0) of a rule's or an element's userdata; "" when none."""
    offset = 0
    while offset + 2 <= len(userdata):
        kind, length = userdata[offset], userdata[offset + 1]
        value = userdata[offset + 2 : offset + 2 + length]
        if kind == 0:
            return value.split(b"\0", 1)[0].decode(errors="replace")
        offset += 2 + length
    return ""


def elements_of(payload: bytes) -> list[tuple[bytes, str]]:
    """(key, comment) of each element of a set element reply."""
    found = []
    listed = attr_map(payload, 4).get(NFTA_SET_ELEM_LIST_ELEMENTS, b"")
    for _kind, element in attrs(listed):
        fields = attr_map(element)
        key = attr_map(fields.get(NFTA_SET_ELEM_KEY, b"")).get(NFTA_DATA_VALUE, b"")
        found.append((key, comment_of(fields.get(NFTA_SET_ELEM_USERDATA, b""))))
    return found


# --- reading a netns: links, IPv4 addresses, routes and neighbours --------------------------------

RTM_GETADDR, RTM_GETROUTE, RTM_GETNEIGH = 22, 26, 30
IFLA_ADDRESS, IFLA_MTU = 1, 4
IFA_ADDRESS = 1
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_MULTIPATH, RTA_TABLE = 1, 4, 5, 6, 9, 15
NDA_DST, NDA_LLADDR = 1, 2


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    mac: str
    mtu: int


@dataclass(frozen=True)
class RouteFacts:
    dst: str
    dst_len: int
    gateway: str
    oif: int | None
    priority: int
    table: int
    protocol: int
    scope: int
    type: int


@dataclass(frozen=True)
class NetView:
    """What inspection reads of one netns, from four dumps."""

    links: dict[int, Link]
    addresses: list[tuple[int, str, int]]  # (ifindex, address, prefix length), kernel order
    routes: list[RouteFacts]
    neighbours: list[tuple[int, str, str, int]]  # (ifindex, address, MAC, NUD state)


def _mac(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def _u32(raw: bytes | None, default: int = 0) -> int:
    return struct.unpack("=I", raw[:4])[0] if raw else default


def link_of(payload: bytes) -> Link:
    index = struct.unpack_from("=i", payload, 4)[0]
    top = attr_map(payload, 16)
    return Link(
        index,
        top.get(IFLA_IFNAME, b"").rstrip(b"\0").decode(errors="replace"),
        _mac(top.get(IFLA_ADDRESS, b"")),
        _u32(top.get(IFLA_MTU), 1500),
    )


def link_by_index(sock: Netlink, index: int) -> Link | None:
    """One link by ifindex (None: no such link)."""
    try:
        replies = sock.get(Message(RTM_GETLINK, 0, _ifinfo(index)))
    except OSError as exc:
        if exc.errno in (errno.ENODEV, errno.ENOENT):
            return None
        raise
    return link_of(replies[0]) if replies else None


IFA_LOCAL = 2


def local_ipv4(sock: Netlink) -> set[str]:
    """Every IPv4 address of the netns's interfaces (the local end, IFA_LOCAL, included for
    point-to-point links, where IFA_ADDRESS is the peer's)."""
    family = struct.pack("=B", socket.AF_INET)
    found = set()
    for payload in sock.get(Message(RTM_GETADDR, F_DUMP, family + b"\0" * 7)):
        top = attr_map(payload, 8)
        for kind in (IFA_LOCAL, IFA_ADDRESS):
            if kind in top and len(top[kind]) == 4:
                found.add(socket.inet_ntoa(top[kind]))
    return found


def read_view(sock: Netlink, *, whole: bool = True) -> NetView:
    """Four dumps; `whole` False (the worker's netns, with a link per pod): no link dump and no
    neighbours, the caller reads the few links it needs with `link_by_index`."""
    family = struct.pack("=B", socket.AF_INET)
    links = {}
    if whole:
        for payload in sock.get(Message(RTM_GETLINK, F_DUMP, _ifinfo())):
            link = link_of(payload)
            links[link.index] = link
    addresses = []
    for payload in sock.get(Message(RTM_GETADDR, F_DUMP, family + b"\0" * 7)):
        _family, prefix, _flags, _scope, index = struct.unpack_from("=BBBBi", payload)
        top = attr_map(payload, 8)
        if IFA_ADDRESS in top:
            addresses.append((index, socket.inet_ntoa(top[IFA_ADDRESS]), prefix))
    routes = []
    for payload in sock.get(Message(RTM_GETROUTE, F_DUMP, family + b"\0" * 11)):
        fam, dst_len, _src, _tos, table, proto, scope, kind = struct.unpack_from("=8B", payload)
        if fam != socket.AF_INET:
            continue
        top = attr_map(payload, 12)
        oif = _u32(top[RTA_OIF]) if RTA_OIF in top else None
        if oif is None and RTA_MULTIPATH in top and len(top[RTA_MULTIPATH]) >= 8:
            oif = struct.unpack_from("=HBBi", top[RTA_MULTIPATH])[3]
        routes.append(
            RouteFacts(
                dst=socket.inet_ntoa(top[RTA_DST]) if RTA_DST in top else "0.0.0.0",
                dst_len=dst_len,
                gateway=socket.inet_ntoa(top[RTA_GATEWAY]) if RTA_GATEWAY in top else "",
                oif=oif,
                priority=_u32(top.get(RTA_PRIORITY)),
                table=_u32(top.get(RTA_TABLE), table),
                protocol=proto,
                scope=scope,
                type=kind,
            )
        )
    neighbours = []
    for payload in sock.get(Message(RTM_GETNEIGH, F_DUMP, family + b"\0" * 11)) if whole else ():
        fam, index, state = struct.unpack_from("=BxxxiH", payload)
        top = attr_map(payload, 12)
        if fam == socket.AF_INET and NDA_DST in top:
            dst = socket.inet_ntoa(top[NDA_DST])
            neighbours.append((index, dst, _mac(top.get(NDA_LLADDR, b"")), state))
    return NetView(links, addresses, routes, neighbours)
