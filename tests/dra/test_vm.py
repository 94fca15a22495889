"""A pod VM from allocated devices: the CreateVM keys the annotation path writes, refused where
one VM cannot be; and the device plan's slots a container's CDI environment fills."""

from __future__ import annotations

import pytest

from adaptor.devices import DevicePlan
from adaptor.devices.dra import assign_allocated, devices_from_env
from adaptor.dra import PreparedClaim
from adaptor.dra.vm import pod_devices, with_allocated_gpus
from providers.core.contract import DEFAULT_GPU_MODEL, DEFAULT_GPUS, decode_gpu_model
from providers.core.errors import InvalidRequest
from providers.dra.allocation import AllocatedDevice

L4_SHARE = AllocatedDevice("p", "nvidia-l4-shared-0", "l4", "NVIDIA L4", 22888, True, 11444)


def device(
    name: str, model: str = "h100-80gb", product: str = "NVIDIA H100 80GB HBM3"
) -> AllocatedDevice:
    return AllocatedDevice("p", name, model, product, 81920)


def claim(uid: str, *devices: AllocatedDevice) -> PreparedClaim:
    return PreparedClaim(uid, "ns", uid, ("u",), devices, (), ("pod",))


def test_whole_devices_set_the_gpu_count_model_and_product() -> None:
    out = with_allocated_gpus(
        {DEFAULT_GPUS: "0"}, [claim("b", device("d1")), claim("a", device("d0"))]
    )
    assert out[DEFAULT_GPUS] == "2"
    intent = decode_gpu_model(out[DEFAULT_GPU_MODEL], 2)
    assert intent.models == ("h100-80gb",) and intent.products == ("nvidia-h100-80gb-hbm3",)
    assert [
        d.device for d in pod_devices([claim("b", device("d1")), claim("a", device("d0"))])
    ] == ["d0", "d1"]


def test_a_share_asks_a_fractional_gpu_with_the_memory_taken() -> None:
    out = with_allocated_gpus({}, [claim("a", L4_SHARE)])
    intent = decode_gpu_model(out[DEFAULT_GPU_MODEL], int(out[DEFAULT_GPUS]))
    assert intent.fractional and intent.memory_mib == 11444 and intent.models == ("l4",)


def test_spot_capacity_written_by_the_webhook_is_kept() -> None:
    out = with_allocated_gpus({DEFAULT_GPU_MODEL: "v1:cap=spot"}, [claim("a", device("d0"))])
    assert "cap=spot" in out[DEFAULT_GPU_MODEL] and "m=h100-80gb" in out[DEFAULT_GPU_MODEL]


@pytest.mark.parametrize(
    "claims",
    [
        [claim("a", device("d0"), device("l", "l4", "NVIDIA L4"))],
        [claim("a", device("d0"), L4_SHARE)],
    ],
)
def test_what_one_vm_cannot_carry_is_refused(claims: list[PreparedClaim]) -> None:
    with pytest.raises(InvalidRequest):
        with_allocated_gpus({}, claims)


def test_no_claims_changes_nothing() -> None:
    assert with_allocated_gpus({DEFAULT_GPUS: "1"}, []) == {DEFAULT_GPUS: "1"}


def test_a_container_gets_the_slots_its_environment_names_and_nothing_else() -> None:
    inventory = DevicePlan(model="h100-80gb", gpus=("g=0", "g=1", "g=2"))
    plan = assign_allocated(inventory, [device("d0"), device("d1"), device("d2")])
    env = ["PATH=/bin", "PEERPODS_DRA_DEVICE_A_0=p/d2", "PEERPODS_DRA_DEVICE_A_1=p/d0"]
    assert devices_from_env(plan, env) == ["g=2", "g=0"]
    assert devices_from_env(plan, ["PEERPODS_DRA_DEVICE_X_0=p/unknown"]) == []
    assert plan.for_container("main") == []
