"""The NOTRACK layout: the `peerpod-*` chains hold one lookup rule each whatever the pods, a pod
is one element of the set `peerpod-vms` with its comment, packets to and from a pod VM's VXLAN
port are not tracked (others are), and nothing is left once the last pod goes."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from adaptor.podnet import _netns, _nl, _notrack
from tests.podnet.topology import Topology, sock

PORT = 4789


def _layout(worker: str) -> dict[str, Any]:
    """The comments of the rules of each peerpod chain (absent chains left out), the tables of
    the netns and the set's elements as (address, port, comment)."""
    with _netns.nftables(worker) as nft:
        chains = _notrack._chains(nft)
        rules = {
            ours: [str(r.get_attr("NFTA_RULE_USERDATA")) for r in _notrack.rules_in(nft, ours)]
            for _base, _hook, ours, _which in _notrack.CHAINS
            if ours in chains
        }
        tables = [t.get_attr("NFTA_TABLE_NAME") for t in nft.get_tables()]
    elements = sorted(
        (_notrack.address_of(k), int.from_bytes(k[4:6], "big"), text)
        for k, text in _notrack.elements(worker)
    )
    return {"rules": rules, "tables": tables, "elements": elements}


def _remote(vni: int) -> str:
    return f"10.77.{vni // 250}.{vni % 250 + 1}"


@pytest.fixture
def worker() -> Iterator[str]:
    topology = Topology().build()
    try:
        yield topology.worker
    finally:
        _notrack.close_sockets()
        topology.close()


@pytest.fixture
def dumps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The set dumps made (the reads that grow with the pods)."""
    seen: list[str] = []
    real = _nl.elements_get

    def counted(table: str, name: str) -> Any:
        seen.append(name)
        return real(table, name)

    monkeypatch.setattr(_nl, "elements_get", counted)
    return seen


def test_many_pods_one_rule_per_chain_one_element_per_pod(worker: str, dumps: list[str]) -> None:
    count = 300
    _notrack.add(worker, 1, _remote(1), PORT)  # the chains' first pod: the slow path
    for vni in range(2, count + 1):
        _notrack.add(worker, vni, _remote(vni), PORT, fresh=True)
    assert dumps == []
    layout = _layout(worker)
    assert layout["rules"] == {
        "peerpod-OUTPUT": [_notrack.OWNER_COMMENT],
        "peerpod-PREROUTING": [_notrack.OWNER_COMMENT],
    }
    assert layout["elements"] == sorted(
        (_remote(v), PORT, f"peerpod [vni:{v}]") for v in range(1, count + 1)
    )
    assert all(_notrack.present(worker, v, _remote(v), PORT) for v in (1, 2, count))
    assert not _notrack.present(worker, 2, _remote(3), PORT)
    dumps.clear()  # _layout's
    for vni in range(count, 0, -1):
        _notrack.remove(worker, vni, _remote(vni), PORT)
    # One dump to learn the count (this process did not add the first pod's element fresh),
    # one to see the set empty: not one per pod.
    assert len(dumps) <= 2
    assert _layout(worker) == {"rules": {}, "tables": [], "elements": []}


def test_two_pods_sharing_a_vm_address_share_its_element(worker: str) -> None:
    _notrack.add(worker, 1, "10.77.0.9", PORT)
    _notrack.add(worker, 2, "10.77.0.9", PORT, fresh=True)
    _notrack.add(worker, 2, "10.77.0.9", PORT)  # again: no change
    assert _layout(worker)["elements"] == [("10.77.0.9", PORT, "peerpod [vni:1] [vni:2]")]
    assert _notrack.present(worker, 1, "10.77.0.9", PORT)
    _notrack.remove(worker, 1, "10.77.0.9", PORT)
    assert _layout(worker)["elements"] == [("10.77.0.9", PORT, "peerpod [vni:2]")]
    assert not _notrack.present(worker, 1, "10.77.0.9", PORT)
    assert _notrack.present(worker, 2, "10.77.0.9", PORT)
    _notrack.remove(worker, 2, "10.77.0.9", PORT)
    assert _layout(worker) == {"rules": {}, "tables": [], "elements": []}


def test_the_port_is_part_of_the_key(worker: str) -> None:
    _notrack.add(worker, 1, "10.77.0.9", PORT)
    _notrack.add(worker, 2, "10.77.0.9", 4790, fresh=True)
    assert [e[1:] for e in _layout(worker)["elements"]] == [
        (PORT, "peerpod [vni:1]"),
        (4790, "peerpod [vni:2]"),
    ]
    assert not _notrack.present(worker, 1, "10.77.0.9", 4790)
    for vni, port in ((1, PORT), (2, 4790)):
        _notrack.remove(worker, vni, "10.77.0.9", port)
    assert _layout(worker) == {"rules": {}, "tables": [], "elements": []}


def test_forgotten_state_and_removal_without_a_port(worker: str) -> None:
    for vni in range(1, 6):
        _notrack.add(worker, vni, _remote(vni), PORT, fresh=vni > 1)
    _notrack.close_sockets()  # what a restart forgets
    _notrack.remove(worker, 1, _remote(1))  # an older record: no port, the elements are read
    _notrack.remove(worker, 2, "")  # nor an address
    assert [e[2] for e in _layout(worker)["elements"]] == [f"peerpod [vni:{v}]" for v in (3, 4, 5)]
    for vni in range(3, 6):
        _notrack.remove(worker, vni, _remote(vni), PORT)
    assert _layout(worker) == {"rules": {}, "tables": [], "elements": []}


def test_a_raw_table_of_someone_elses_is_kept(worker: str) -> None:
    with _netns.nftables(worker) as nft:
        nft.table("add", name=_notrack.TABLE)
    _notrack.add(worker, 1, _remote(1), PORT)
    _notrack.remove(worker, 1, _remote(1), PORT)
    assert _layout(worker) == {"rules": {}, "tables": [_notrack.TABLE], "elements": []}


def _chain_facts(worker: str) -> dict[str, Any]:
    """Each chain of table raw, read through pyroute2: its hook and priority (None: a regular
    chain), its comment and, per rule, (comment, whether it jumps to a peerpod chain)."""
    facts = {}
    with _netns.nftables(worker) as nft:
        for name, chain in _notrack._chains(nft).items():
            hook = chain.get_attr("NFTA_CHAIN_HOOK")
            rules = [
                (
                    r.get_attr("NFTA_RULE_USERDATA"),
                    [ours for _b, _h, ours, _w in _notrack.CHAINS if _notrack._jumps_to(r, ours)],
                )
                for r in _notrack.rules_in(nft, name)
            ]
            where = (
                None
                if hook is None
                else (hook.get_attr("NFTA_HOOK_HOOKNUM"), hook.get_attr("NFTA_HOOK_PRIORITY"))
            )
            facts[name] = (where, chain.get_attr("NFTA_CHAIN_USERDATA"), rules)
    return facts


def test_chains_already_there_are_completed_never_doubled(worker: str) -> None:
    with _netns.nftables(worker) as nft:
        nft.table("add", name=_notrack.TABLE)
        nft.chain(
            "add", table=_notrack.TABLE, name="OUTPUT", hook="output", type="filter", priority=-300
        )
    with _netns.entered(worker):
        nl = _nl.Netlink(_nl.NETLINK_NETFILTER)
    with nl:
        theirs = _nl.rule_add(_notrack.TABLE, "OUTPUT", [_nl.expr("counter")], "theirs")
        assert nl.transact(_nl.nft_batch(theirs)) == [0]
    _notrack.add(worker, 1, _remote(1), PORT)
    lookup = (_notrack.OWNER_COMMENT, [])
    whole = {
        "OUTPUT": ((3, -300), None, [("theirs", []), (None, ["peerpod-OUTPUT"])]),
        "PREROUTING": ((0, -300), _notrack.OWNER_COMMENT, [(None, ["peerpod-PREROUTING"])]),
        "peerpod-OUTPUT": (None, None, [lookup]),
        "peerpod-PREROUTING": (None, None, [lookup]),
    }
    assert _chain_facts(worker) == whole
    # A jump gone while this process forgets what it made (a restart): put back, once.
    with _netns.nftables(worker) as nft:
        (jump,) = _notrack.rules_in(nft, "PREROUTING")
        nft.rule(
            "del",
            table=_notrack.TABLE,
            chain="PREROUTING",
            handle=jump.get_attr("NFTA_RULE_HANDLE"),
        )
    _notrack.close_sockets()
    _notrack.add(worker, 2, _remote(2), PORT)
    _notrack.close_sockets()
    _notrack.add(worker, 3, _remote(3), PORT)
    assert _chain_facts(worker) == whole
    for vni in (1, 2, 3):
        _notrack.remove(worker, vni, _remote(vni), PORT)
    assert _chain_facts(worker) == {"OUTPUT": ((3, -300), None, [("theirs", [])])}
    assert _layout(worker) == {"rules": {}, "tables": [_notrack.TABLE], "elements": []}


# --- packets ----------------------------------------------------------------------------------


def _track_everything(worker: str) -> None:
    """A table of the test's own whose rule reads the conntrack state, so the netns tracks
    connections (conntrack hooks a netns only when something uses it)."""
    ct_state = _nl.expr("ct", _nl.be32(1, 1), _nl.be32(2, 0))  # dreg 1, key state
    with _netns.nftables(worker) as nft:
        nft.table("add", name="cttest")
        nft.chain("add", table="cttest", name="out", hook="output", type="filter", priority=0)
    with _netns.entered(worker):
        nl = _nl.Netlink(_nl.NETLINK_NETFILTER)
    with nl:
        codes = nl.transact(_nl.nft_batch(_nl.rule_add("cttest", "out", [ct_state], "ct")))
    assert codes == [0]


def _tracked(worker: str) -> list[str]:
    with _netns.entered(worker), open("/proc/thread-self/net/nf_conntrack") as f:
        return [line for line in f if "udp" in line]


def _send(worker: str, address: str, port: int) -> None:
    with sock(worker, socket.SOCK_DGRAM) as s, contextlib.suppress(OSError):
        s.sendto(b"x" * 64, (address, port))


def test_vxlan_packets_of_a_pod_vm_are_not_tracked(topo: Topology) -> None:
    worker = topo.worker
    vm1, _podns1, ip1 = topo.add_vm()
    vm2, _podns2, ip2 = topo.add_vm()
    _track_everything(worker)
    _notrack.add(worker, 1, ip1, PORT)
    _notrack.add(worker, 2, ip2, PORT, fresh=True)
    _send(worker, ip1, PORT)  # OUTPUT: ip daddr . udp dport
    _send(worker, ip2, PORT)
    _send(vm1, "192.168.0.2", PORT)  # PREROUTING: ip saddr . udp dport
    assert _tracked(worker) == []
    _send(worker, ip1, PORT + 1)  # not the VXLAN port
    _send(worker, "192.168.1.200", PORT)  # no pod's VM
    _send(vm2, "192.168.0.2", PORT + 1)
    tracked = _tracked(worker)
    assert len(tracked) == 3
    assert any(f"dst={ip1} " in t and f"dport={PORT + 1} " in t for t in tracked)
    assert any("dst=192.168.1.200 " in t and f"dport={PORT} " in t for t in tracked)
    assert any(f"src={ip2} " in t and f"dport={PORT + 1} " in t for t in tracked)
    _notrack.remove(worker, 2, ip2, PORT)
    _send(worker, ip2, PORT)  # its element gone: tracked again
    assert any(f"dst={ip2} " in t and f"dport={PORT} " in t for t in _tracked(worker))
    _notrack.remove(worker, 1, ip1, PORT)
