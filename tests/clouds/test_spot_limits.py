"""A market pass tries every candidate type in every zone unless the operator sets a limit.

docs/spot.md promises that a Spot pod tries every candidate type and zone before the on-demand
pass; with 8 candidate types in 3 zones that is 24 placements, which a fixed budget of 16 calls
cut short. The budget now scales with the sites (types x zones, each with its transient
retries); an explicit `max_attempts` is a hard limit that says it was reached.
"""

from __future__ import annotations

import pytest

from providers.clouds.retry import (
    FallbackExhausted,
    RetryPolicy,
    Site,
    budget_for,
    create_with_fallback,
    sites,
)
from providers.core.base import Instance, VMCandidate
from providers.core.capacity import CapacityType
from providers.core.errors import CapacityError, TransientError
from providers.core.markets import NoSpotCapacity, create_in_markets

TYPES = [VMCandidate(f"g6.{n}xlarge") for n in range(1, 9)]
ZONES = ["z-a", "z-b", "z-c"]


async def _no_sleep(_seconds: float) -> None:
    return None


async def test_every_type_in_every_zone_is_tried_by_default() -> None:
    order = sites(TYPES, ZONES)
    assert len(order) == 24
    tried: list[Site] = []

    async def attempt(site: Site) -> Instance:
        tried.append(site)
        raise CapacityError("InsufficientInstanceCapacity: none")

    with pytest.raises(FallbackExhausted) as caught:
        await create_with_fallback("sandbox s", order, attempt, RetryPolicy(sleep=_no_sleep))
    assert tried == order
    assert len(caught.value.tried) == 24
    assert "attempt budget exhausted" not in str(caught.value)


async def test_spot_then_on_demand_each_walk_all_24_placements() -> None:
    order = sites(TYPES, ZONES)
    calls: list[tuple[bool, Site]] = []

    async def create(spot: bool) -> Instance:
        async def attempt(site: Site) -> Instance:
            calls.append((spot, site))
            if spot:
                raise CapacityError("InsufficientInstanceCapacity: no Spot")
            return Instance("i-1", "vm", (), site.instance_type, site.zone)

        return await create_with_fallback("s", order, attempt, RetryPolicy(sleep=_no_sleep))

    found = await create_in_markets("s", CapacityType.SPOT_OR_ON_DEMAND, create)
    assert sum(1 for spot, _ in calls if spot) == 24
    assert calls[-1] == (False, order[0]) and found.instance_type == TYPES[0].instance_type

    calls.clear()
    with pytest.raises(NoSpotCapacity):
        await create_in_markets("s", CapacityType.SPOT, create)
    assert len(calls) == 24


async def test_transient_retries_do_not_eat_other_sites_budget() -> None:
    order = sites(TYPES[:2], ZONES)
    seen: list[Site] = []

    async def attempt(site: Site) -> Instance:
        seen.append(site)
        if site == order[0]:
            raise TransientError("RequestLimitExceeded")
        raise CapacityError("no capacity")

    policy = RetryPolicy(sleep=_no_sleep, transient_retries=2)
    with pytest.raises(FallbackExhausted):
        await create_with_fallback("s", order, attempt, policy)
    assert seen.count(order[0]) == 3 and set(seen) == set(order)
    assert budget_for(len(order), policy) == 18


async def test_an_explicit_limit_stops_the_pass_and_says_so() -> None:
    order = sites(TYPES, ZONES)
    count = 0

    async def attempt(site: Site) -> Instance:
        nonlocal count
        count += 1
        raise CapacityError("no capacity")

    with pytest.raises(FallbackExhausted, match="attempt budget exhausted"):
        await create_with_fallback(
            "s", order, attempt, RetryPolicy(max_attempts=5, sleep=_no_sleep)
        )
    assert count == 5


def test_the_limits_are_flags_every_cloud_reads() -> None:
    """--max-candidate-types and --max-launches-per-pass reach the providers' configs and the
    placement; a bad value is refused with the flag's constraint, not clamped."""
    from pydantic import ValidationError

    from adaptor.planning.placement import Placement
    from providers.clouds import aws, azure, gcp
    from providers.clouds.settings import AwsSettings, AzureSettings, GcpSettings

    common = {"max_candidate_types": 3, "max_launches_per_pass": 7}
    configs = [
        aws.config_from_settings(AwsSettings(aws_region="us-east-1", **common)),
        azure.config_from_settings(AzureSettings(**common)),
        gcp.config_from_settings(GcpSettings(gcp_zones=("us-central1-a",), **common)),
    ]
    for config in configs:
        assert config.max_candidate_types == 3 and config.policy.max_attempts == 7
    provider = aws.AwsProvider(configs[0], owner_id="o", client=object())
    assert Placement.for_provider(provider, None).max_candidates == 3
    default = aws.config_from_settings(AwsSettings(aws_region="us-east-1"))
    assert default.max_candidate_types == 8 and default.policy.max_attempts == 0
    with pytest.raises(ValidationError):
        AwsSettings(max_candidate_types=0)
    with pytest.raises(ValidationError):
        AwsSettings(max_launches_per_pass=-1)
