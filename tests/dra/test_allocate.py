"""The offline first-fit allocator over published pools: classes and selectors (CEL), device
exclusivity, counters (a model's limit, an account quota), consumable capacity, complete pools."""

from __future__ import annotations

from typing import Any

import pytest

from providers.core.account_quota import AccountLimit, AccountQuota
from providers.core.snapshots import CatalogLoader
from providers.dra import build_pool, parse_gpu_limits
from providers.dra.allocation import device_facts, gpu_intent
from tests.dra.test_deviceclasses import classes
from webhook._allocate import AllocationFailed, Allocator

H100 = "device.attributes['gpu.peerpods.io'].productName == 'NVIDIA H100 80GB HBM3'"


def slices(limits: dict[str, int] | None = None, quota: AccountQuota | None = None) -> list[Any]:
    parsed = parse_gpu_limits(f"{k}={v}" for k, v in (limits or {}).items())
    return build_pool(CatalogLoader(None).load("aws", "us-east-1"), parsed, quota).slices(1)


def claim(cls: str = "gpu.peerpods.io", *selectors: str, count: int = 1, **extra: Any) -> Any:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count, **extra}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def test_the_cheapest_gpu_comes_first() -> None:
    allocator = Allocator(slices(), classes())
    [result] = allocator.allocate_claim("c", claim())
    assert result.device == "tesla-t4-0" and result.request == "gpu"


def test_a_gpu_limit_of_two_lets_two_h100_claims_of_three_through() -> None:
    allocator = Allocator(slices({"h100": 2}), classes())
    got = [allocator.allocate_claim(f"c{i}", claim("gpu.peerpods.io", H100)) for i in range(2)]
    assert sorted(r[0].device for r in got) == [
        "nvidia-h100-80gb-hbm3-0",
        "nvidia-h100-80gb-hbm3-1",
    ]
    with pytest.raises(AllocationFailed, match="no published device fits"):
        allocator.allocate_claim("c2", claim("gpu.peerpods.io", H100))


def test_a_memory_selector_gets_a_device_that_large_and_its_vm() -> None:
    big = "device.capacity['gpu.peerpods.io'].memory.compareTo(quantity('40Gi')) >= 0"
    pool = slices()
    [result] = Allocator(pool, classes()).allocate_claim("c", claim("gpu.peerpods.io", H100, big))
    facts = device_facts(pool, result.pool, result.device, result.request)
    assert facts is not None and facts.model == "h100-80gb" and facts.memory_mib >= 40 * 1024
    intent = gpu_intent([facts])
    assert (intent.gpus, intent.models) == (1, ("h100-80gb",))


def test_an_account_quota_counter_stops_what_the_account_cannot_launch() -> None:
    # 40 vCPUs of P instances: one H100 device takes 24, so the second does not fit
    limit = AccountLimit("Running On-Demand P instances", "vcpus", "class", ("p",), 40, 0)
    pool = slices(quota=AccountQuota("aws", "us-east-1", (limit,)))
    allocator = Allocator(pool, classes())
    allocator.allocate_claim("c0", claim("gpu.peerpods.io", H100))
    with pytest.raises(AllocationFailed):
        allocator.allocate_claim("c1", claim("gpu.peerpods.io", H100))
    # a G-class GPU draws on no P quota
    assert allocator.allocate_claim("c2", claim())[0].device.startswith("tesla-t4")


def test_a_memory_request_takes_a_share_rounded_up_to_what_is_sold() -> None:
    allocator = Allocator(slices({"l4": 2}), classes())
    eight: dict[str, Any] = {"capacity": {"requests": {"memory": "8Gi"}}}
    first = allocator.allocate_claim("a", claim("fraction.gpu.peerpods.io", **eight))
    second = allocator.allocate_claim("b", claim("fraction.gpu.peerpods.io", **eight))
    third = allocator.allocate_claim("c", claim("fraction.gpu.peerpods.io", **eight))
    assert first[0].device == second[0].device == "nvidia-l4-shared-0"
    assert first[0].consumed == {"memory": str(11444 * 2**20)}  # g6f.4xlarge's share
    assert third[0].device == "nvidia-l4-shared-1"  # two 11444Mi shares fill one L4
    facts = device_facts(
        slices({"l4": 2}), "aws-us-east-1", first[0].device, "gpu", first[0].consumed
    )
    assert facts is not None and facts.shared and facts.consumed_mib == 11444
    intent = gpu_intent([facts])
    assert intent.fractional and intent.memory_mib == 11444 and intent.models == ("l4",)


def test_an_incomplete_pool_is_not_allocatable() -> None:
    pool = slices()
    with pytest.raises(AllocationFailed):
        Allocator(pool[:-1], classes()).allocate_claim("c", claim("gpu.peerpods.io", H100))


def test_first_available_takes_the_first_subrequest_that_fits() -> None:
    allocator = Allocator(slices({"h100": 0}), classes())
    h100: dict[str, Any] = {"name": "h100", "deviceClassName": "gpu.peerpods.io"}
    h100["selectors"] = [{"cel": {"expression": H100}}]
    any_gpu = {"name": "any", "deviceClassName": "gpu.peerpods.io"}
    spec = {"devices": {"requests": [{"name": "gpu", "firstAvailable": [h100, any_gpu]}]}}
    [result] = allocator.allocate_claim("c", spec)
    assert result.request == "gpu/any"


def test_what_is_not_modelled_is_refused_not_guessed() -> None:
    allocator = Allocator(slices(), classes())
    spec = claim()
    spec["devices"]["constraints"] = [{"matchAttribute": "gpu.peerpods.io/productName"}]
    with pytest.raises(AllocationFailed, match="constraints"):
        allocator.allocate_claim("c", spec)
    with pytest.raises(AllocationFailed, match="not known"):
        allocator.allocate_claim("c", claim("nosuch.class"))
