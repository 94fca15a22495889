"""The capacity type in the contract: inside `default_gpu_model`, the one value of ours Kata
passes to CreateVM (docs/annotations.md, What the adaptor accepts at CreateVM)."""

from __future__ import annotations

import pytest

from providers.core.capacity import CapacityType
from providers.core.contract import (
    DEFAULT_GPU_MODEL,
    DEFAULT_GPUS,
    SANDBOX_NAME,
    SANDBOX_NAMESPACE,
    GpuIntent,
    decode_capacity_type,
    decode_gpu_model,
    encode_gpu_model,
    parse_vm_annotations,
)
from providers.core.errors import AnnotationError

POD = {SANDBOX_NAME: "p", SANDBOX_NAMESPACE: "ml"}


@pytest.mark.parametrize("capacity", list(CapacityType))
@pytest.mark.parametrize(
    "gpu",
    [
        GpuIntent(),
        GpuIntent(gpus=2, models=("h100-80gb",), rdma=True),
        GpuIntent(mig={"1g.10gb": 2}),
    ],
)
def test_round_trip(capacity: CapacityType, gpu: GpuIntent) -> None:
    value = encode_gpu_model(gpu, capacity)
    assert ("cap=" in value) is (capacity is not CapacityType.ON_DEMAND)
    assert decode_capacity_type(value) is capacity
    assert decode_gpu_model(value, gpu.gpus) == gpu
    intent = parse_vm_annotations({**POD, DEFAULT_GPUS: str(gpu.gpus), DEFAULT_GPU_MODEL: value})
    assert intent.capacity_type is capacity and intent.gpu == gpu
    wants = "spot" if capacity is not CapacityType.ON_DEMAND else "on-demand"
    assert intent.to_request().provisioning == wants


def test_on_demand_writes_nothing_and_legacy_values_are_on_demand() -> None:
    assert encode_gpu_model(GpuIntent(gpus=1)) == ""
    assert encode_gpu_model(GpuIntent(), CapacityType.SPOT) == "v1:cap=spot"
    assert decode_capacity_type("") is CapacityType.ON_DEMAND
    assert decode_capacity_type("a100,h100") is CapacityType.ON_DEMAND  # CAA's encoding


@pytest.mark.parametrize("value", ["v1:cap=cheap", "v1:cap=on-demand", "v1:cap=", "v1:cap"])
def test_bad_capacity_is_an_error_naming_the_key(value: str) -> None:
    with pytest.raises(AnnotationError) as info:
        parse_vm_annotations({**POD, DEFAULT_GPU_MODEL: value})
    assert info.value.key == DEFAULT_GPU_MODEL
