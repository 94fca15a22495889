"""The pool builder: slices the 1.36 API accepts, complete pools, the model docs/dra.md states."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest

from providers.core.account_quota import AccountLimit, AccountQuota
from providers.core.errors import InvalidRequest
from providers.core.snapshots import CatalogLoader
from providers.dra import DRIVER, build_pool, parse_gpu_limits
from providers.dra.slices import DEFAULT_DEVICES, MAX_DEVICES_PER_SLICE, NODE_LABEL

REGIONS = [("aws", "us-east-1"), ("azure", "eastus"), ("gcp", "us-central1")]
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def catalog(cloud: str, region: str) -> Any:
    return CatalogLoader(None).load(cloud, region)


@pytest.mark.parametrize(("cloud", "region"), REGIONS)
def test_every_slice_validates_against_the_resource_k8s_io_v1_schema(
    cloud: str, region: str
) -> None:
    for slice_ in build_pool(catalog(cloud, region)).slices(1):
        kubernetes_validate.validate(slice_, "1.36.0", strict=True)


@pytest.mark.parametrize(("cloud", "region"), REGIONS)
def test_a_pool_is_complete_and_keeps_the_api_servers_limits(cloud: str, region: str) -> None:
    slices = build_pool(catalog(cloud, region)).slices(3)
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    assert {s["spec"]["pool"]["generation"] for s in slices} == {3}
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    assert len(counter_slices) == 1
    assert "devices" not in counter_slices[0]["spec"]
    sets = {c["name"]: c["counters"] for c in counter_slices[0]["spec"]["sharedCounters"]}
    assert len(sets) <= 8 and all(len(c) <= 32 for c in sets.values())
    names: set[str] = set()
    for slice_ in slices:
        assert slice_["spec"]["driver"] == DRIVER
        if "devices" not in slice_["spec"]:
            continue
        key, value = NODE_LABEL
        term = slice_["spec"]["nodeSelector"]["nodeSelectorTerms"]
        assert term == [{"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}]
        assert "allNodes" not in slice_["spec"]
        devices = slice_["spec"]["devices"]
        assert 0 < len(devices) <= MAX_DEVICES_PER_SLICE
        for device in devices:
            assert _DNS_LABEL.match(device["name"]) and device["name"] not in names
            names.add(device["name"])
            assert len(device["attributes"]) + len(device["capacity"]) <= 32
            assert len(device["consumesCounters"]) <= 2
            for use in device["consumesCounters"]:
                assert set(use["counters"]) <= set(sets[use["counterSet"]])


def test_devices_carry_the_nvidia_driver_vocabulary_and_real_bytes() -> None:
    pool = build_pool(catalog("aws", "us-east-1"))
    slices = pool.slices(1)
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    h100 = next(d for d in devices if d["attributes"]["model"]["string"] == "h100-80gb")
    assert h100["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert h100["attributes"]["type"] == {"string": "gpu"}
    assert h100["attributes"]["brand"] == {"string": "Nvidia"}
    assert h100["attributes"]["architecture"] == {"string": "Hopper"}
    assert h100["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert h100["attributes"]["rdma"] == {"bool": True}
    assert h100["attributes"]["maxPerVM"] == {"int": 8}
    assert h100["capacity"]["memory"]["value"] == str(81920 * 2**20)
    # AMD and Habana GPUs are not NVIDIA's vocabulary; arm64 types are not the image's
    models = {d["attributes"]["model"]["string"] for d in devices}
    assert not models & {"radeon-pro-v520", "gaudi-hl-205", "t4g", "gb200"}
    assert not any(d["attributes"]["type"]["string"] == "mig" for d in devices)


def test_devices_come_cheapest_gpu_first() -> None:
    cat = catalog("aws", "us-east-1")
    pool = build_pool(cat)
    per_gpu: dict[str, float] = {}
    for t in cat.types:
        if t.gpu is not None and t.gpu.fraction == 1 and t.price_per_hour is not None:
            price = t.price_per_hour / t.gpu.count
            per_gpu[t.gpu.model] = min(per_gpu.get(t.gpu.model, price), price)
    order = [d.model for d in pool.devices if not d.shared]
    firsts = list(dict.fromkeys(order))
    prices = [per_gpu[m] for m in firsts if m in per_gpu]
    assert prices == sorted(prices)
    assert firsts[0] == min(per_gpu, key=lambda m: per_gpu[m] if m in set(order) else 1e9)


def test_a_gpu_limit_is_the_number_of_devices_and_the_models_counter() -> None:
    pool = build_pool(catalog("aws", "us-east-1"), parse_gpu_limits(["h100=2", "t4=0"]))
    assert [d.model for d in pool.devices].count("h100-80gb") == 2
    assert [d.model for d in pool.devices].count("t4") == 0
    assert [d.model for d in pool.devices].count("l40s") == DEFAULT_DEVICES
    assert pool.counters["gpus"]["h100-80gb"] == 2


def test_fractional_gpus_are_one_shareable_device_per_gpu_with_the_sizes_sold() -> None:
    pool = build_pool(catalog("aws", "us-east-1"), {"l4": 3})
    devices = [d for s in pool.slices(1) for d in s["spec"].get("devices", [])]
    shared = [d for d in devices if d.get("allowMultipleAllocations")]
    assert {d["attributes"]["model"]["string"] for d in shared} == {"l4"}
    assert len(shared) == 3
    policy = shared[0]["capacity"]["memory"]["requestPolicy"]
    mib = [int(v) // 2**20 for v in policy["validValues"]]
    assert mib == [2861, 5722, 11444, 22888]  # g6f.large/.xlarge, g6f.2xlarge, g6f.4xlarge, whole
    assert int(policy["default"]) == 22888 * 2**20
    # a shared device draws on the same per-model counter as a whole one
    assert shared[0]["consumesCounters"][0] == {
        "counterSet": "gpus",
        "counters": {"l4": {"value": "1"}},
    }


def test_azure_sells_the_a10_in_shares() -> None:
    pool = build_pool(catalog("azure", "eastus"), {"a10": 1})
    shared = [d for d in pool.devices if d.shared]
    assert [d.model for d in shared] == ["a10"]
    assert shared[0].valid_mib[-1] == 24 * 1024 and len(shared[0].valid_mib) >= 3


def test_account_quotas_are_counters_the_devices_consume() -> None:
    p_quota = AccountLimit("Running On-Demand P instances", "vcpus", "class", ("p",), 384, 100)
    spot = AccountLimit("All P Spot Instance Requests", "vcpus", "class", ("p",), 9999, 0, True)
    quota = AccountQuota("aws", "us-east-1", (p_quota, spot))
    pool = build_pool(catalog("aws", "us-east-1"), quota=quota)
    assert pool.counters["account"] == {"running-on-demand-p-instances": 384}
    devices = [d for s in pool.slices(1) for d in s["spec"].get("devices", [])]
    h100 = next(d for d in devices if d["attributes"]["model"]["string"] == "h100-80gb")
    account = next(c for c in h100["consumesCounters"] if c["counterSet"] == "account")
    # p5.48xlarge brings 192 vCPUs with 8 GPUs, p5.4xlarge 16 with 1: the most per GPU
    assert account["counters"] == {"running-on-demand-p-instances": {"value": "24"}}
    l4 = next(d for d in devices if d["attributes"]["model"]["string"] == "l4")
    assert [c["counterSet"] for c in l4["consumesCounters"]] == ["gpus"]  # a G type: not P


def test_a_gcp_gpu_quota_bounds_the_models_devices() -> None:
    limit = AccountLimit("NVIDIA_H100_GPUS", "gpus", "model", ("h100-80gb",), 3, 0, False)
    quota = AccountQuota("gcp", "us-central1", (limit,))
    pool = build_pool(catalog("gcp", "us-central1"), quota=quota)
    assert [d.model for d in pool.devices].count("h100-80gb") == 3
    assert pool.counters["account"] == {"nvidia-h100-gpus": 3}


@pytest.mark.parametrize("item", ["h100", "=2", "h100=two", "h100=-1", "nosuchgpu=1"])
def test_a_bad_gpu_limit_is_one_clear_error(item: str) -> None:
    with pytest.raises(InvalidRequest, match="--gpu-limit"):
        parse_gpu_limits([item])


def test_a_limit_for_a_model_the_region_does_not_sell_is_a_note() -> None:
    pool = build_pool(catalog("gcp", "us-central1"), {"b300": 2})
    assert any("b300" in n and "sells" in n for n in pool.notes)
    assert "b300" not in {d.model for d in pool.devices}
