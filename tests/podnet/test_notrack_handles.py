"""A pod's NOTRACK rules are removed by the handles the kernel echoed when they were added, with
no dump of the chains; a handle that no longer names the pod's rule, or handles forgotten (as by a
restart), send removal back to reading the chains, and nothing is left either way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from adaptor.podnet import _netns, _nl, _notrack
from tests.podnet.topology import Topology

PORT = 4789


def _rules(worker: str) -> dict[str, list[str]]:
    """The comments of the rules in each peerpod chain; {} once the chains are gone."""
    with _netns.nftables(worker) as nft:
        chains = _notrack._chains(nft)
        return {
            ours: [str(r.get_attr("NFTA_RULE_USERDATA")) for r in _notrack.rules_in(nft, ours)]
            for _base, _hook, ours, _which in _notrack.CHAINS
            if ours in chains
        }


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
    """The chains removal dumped (by hand-parsed dump, the path that grows with the pods)."""
    seen: list[str] = []
    real = _nl.rules_get

    def counted(table: str, chain: str) -> Any:
        seen.append(chain)
        return real(table, chain)

    monkeypatch.setattr(_nl, "rules_get", counted)
    return seen


def test_fresh_pods_go_by_handle_without_a_dump(worker: str, dumps: list[str]) -> None:
    _notrack.add(worker, 1, _remote(1), PORT)  # the chains' first pod: the slow path
    for vni in range(2, 12):
        _notrack.add(worker, vni, _remote(vni), PORT, fresh=True)
    for vni in range(2, 12):
        _notrack.remove(worker, vni, _remote(vni))
    assert dumps == []
    assert _rules(worker) == {chain: ["peerpod [vni:1]"] for chain in _rules(worker)}
    assert len(_rules(worker)) == 2
    _notrack.remove(worker, 1, _remote(1))  # added by the slow path: found by reading
    assert dumps
    assert _rules(worker) == {}


def test_a_handle_that_is_not_the_pods_deletes_nothing_of_another(
    worker: str, dumps: list[str]
) -> None:
    for vni in (1, 2, 3):
        _notrack.add(worker, vni, _remote(vni), PORT, fresh=vni > 1)
    pods = next(iter(_notrack._HANDLES.values()))
    pods[2] = pods[3]  # pod 2 "remembers" pod 3's handles
    _notrack.remove(worker, 2, _remote(2))
    assert dumps  # the handles were not the pod's: its rules were found by reading
    assert {chain: sorted(rules) for chain, rules in _rules(worker).items()} == {
        chain: ["peerpod [vni:1]", "peerpod [vni:3]"] for chain in _rules(worker)
    }
    for vni in (3, 1):
        _notrack.remove(worker, vni, _remote(vni))
    assert _rules(worker) == {}


def test_forgotten_handles_fall_back_to_reading(worker: str, dumps: list[str]) -> None:
    for vni in range(1, 6):
        _notrack.add(worker, vni, _remote(vni), PORT, fresh=vni > 1)
    _notrack.close_sockets()  # what a restart forgets
    for vni in range(1, 6):
        _notrack.remove(worker, vni, _remote(vni))
    assert len(dumps) >= 5
    assert _rules(worker) == {}


def test_rules_gone_already_still_prune_the_chains(worker: str) -> None:
    for vni in (1, 2):
        _notrack.add(worker, vni, _remote(vni), PORT, fresh=vni > 1)
    pods = next(iter(_notrack._HANDLES.values()))
    recorded = pods[2]
    assert recorded is not None and len(recorded) == 2
    _notrack.remove_handles(worker, list(recorded))  # as the sweep deletes
    _notrack.remove(worker, 1, _remote(1))
    _notrack.remove(worker, 2, _remote(2))
    assert _rules(worker) == {}
