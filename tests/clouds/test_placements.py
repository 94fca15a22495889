"""The order in which a create tries zones and types, and per-candidate zone restrictions."""

from __future__ import annotations

import pytest

from providers.errors import InvalidRequest
from providers.fallback import Placement, placements


def order(*args: object) -> list[tuple[str, str]]:
    return [(p.instance_type, p.zone) for p in placements(*args)]  # type: ignore[arg-type]


def test_every_zone_of_the_best_type_first() -> None:
    assert order(["a", "b"], ["z1", "z2"]) == [("a", "z1"), ("a", "z2"), ("b", "z1"), ("b", "z2")]
    assert order(["a", "a", ""], []) == [("a", "")]


def test_a_restricted_candidate_only_goes_where_it_can() -> None:
    only = {"n1+p100": ("z2", "z9")}
    assert order(["n1+p100", "n1+t4"], ["z1", "z2"], only) == [
        ("n1+p100", "z2"),
        ("n1+t4", "z1"),
        ("n1+t4", "z2"),
    ]
    # no configured zones: the restriction names them
    assert order(["n1+p100"], [], only) == [("n1+p100", "z2"), ("n1+p100", "z9")]


def test_nowhere_to_go_is_a_clear_error() -> None:
    with pytest.raises(InvalidRequest, match=r"no configured zone \(z1\) can host n1\+p100"):
        placements(["n1+p100"], ["z1"], {"n1+p100": ("z2",)})
    with pytest.raises(InvalidRequest, match="candidate list is empty"):
        placements([], ["z1"])
    assert Placement("a", "z1").zone == "z1"
