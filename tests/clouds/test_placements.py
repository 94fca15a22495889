"""The order in which a create tries zones and candidates, and per-candidate zone restrictions."""

from __future__ import annotations

import pytest

from providers.clouds.retry import Site, sites
from providers.core.base import Accelerator, VMCandidate
from providers.core.errors import InvalidRequest

A, B = VMCandidate("a"), VMCandidate("b")
P100 = VMCandidate("n1", zones=("z2", "z9"), accelerator=Accelerator("p100", 1))
T4 = VMCandidate("n1", accelerator=Accelerator("t4", 1))


def order(candidates: list[VMCandidate], zones: list[str]) -> list[tuple[str, str]]:
    return [(str(s.candidate), s.zone) for s in sites(candidates, zones)]


def test_every_zone_of_the_best_type_first() -> None:
    assert order([A, B], ["z1", "z2"]) == [("a", "z1"), ("a", "z2"), ("b", "z1"), ("b", "z2")]
    assert order([A, A], []) == [("a", "")]


def test_a_restricted_candidate_only_goes_where_it_can() -> None:
    assert order([P100, T4], ["z1", "z2"]) == [
        ("n1 with 1 p100", "z2"),
        ("n1 with 1 t4", "z1"),
        ("n1 with 1 t4", "z2"),
    ]
    # no configured zones: the restriction names them
    assert order([P100], []) == [("n1 with 1 p100", "z2"), ("n1 with 1 p100", "z9")]


def test_nowhere_to_go_is_a_clear_error() -> None:
    with pytest.raises(InvalidRequest, match=r"no configured zone \(z1\) can host n1 with 1 p100"):
        sites([P100], ["z1"])
    with pytest.raises(InvalidRequest, match="candidate list is empty"):
        sites([], ["z1"])
    assert Site(A, "z1").zone == "z1" and Site(A, "z1").instance_type == "a"
