"""The device plan: inventory from the intent and instance, per-container assignment."""

from __future__ import annotations

import pytest

from adaptor.devices import CdiNaming, DevicePlan, plan_devices
from providers.core.catalog import GpuSpec, InstanceType
from providers.core.contract import ContainerPlan, DeviceUnit, GpuIntent
from providers.core.errors import InvalidRequest

P4D = InstanceType(
    name="p4d.24xlarge",
    vcpus=96,
    memory_mib=1179648,
    gpu=GpuSpec(model="a100-40gb", count=8, memory_mib=40960),
    rdma="efa",
    efa_interfaces=4,
)


def units(*items: DeviceUnit) -> tuple[DeviceUnit, ...]:
    return items


def test_whole_gpus_by_index_and_no_sharing() -> None:
    plan = ContainerPlan(
        units=units(DeviceUnit(id="a", kind="gpu", count=2), DeviceUnit(id="b", kind="gpu")),
        containers={"main": ("a",), "side": ("b",), "logger": ()},
    )
    dp = plan_devices(plan, GpuIntent(gpus=3), P4D)
    assert dp.for_container("main") == ["peerpods.io/gpu=gpu0", "peerpods.io/gpu=gpu1"]
    assert dp.for_container("side") == ["peerpods.io/gpu=gpu2"]
    assert dp.for_container("logger") == []
    assert dp.for_container("not-in-plan") == []


def test_shared_unit_goes_to_both_containers() -> None:
    plan = ContainerPlan(
        units=units(DeviceUnit(id="claim", kind="gpu")),
        containers={"a": ("claim",), "b": ("claim",)},
    )
    dp = plan_devices(plan, GpuIntent(gpus=1), (1, "l4"))
    assert dp.for_container("a") == dp.for_container("b") == ["peerpods.io/gpu=gpu0"]


def test_mig_layout_follows_the_packer_after_whole_gpus() -> None:
    plan = ContainerPlan(
        units=units(
            DeviceUnit(id="g", kind="gpu"),
            DeviceUnit(id="m1", kind="mig", profile="3g.20gb", count=2),
            DeviceUnit(id="m2", kind="mig", profile="1g.5gb"),
        ),
        containers={"train": ("g",), "infer": ("m1",), "tiny": ("m2",)},
    )
    intent = GpuIntent(gpus=1, mig={"3g.20gb": 2, "1g.5gb": 1})
    dp = plan_devices(plan, intent, P4D)
    layout = [(m.profile, m.gpu, m.start, m.index) for m in dp.mig]
    # 3g+3g fill one GPU's 8 slots, so the 1g.5gb needs another; GPU 0 stays whole (no MIG)
    assert sorted(layout) == [("1g.5gb", 1, 0, 0), ("3g.20gb", 2, 0, 0), ("3g.20gb", 2, 4, 1)]
    assert dp.for_container("train") == ["peerpods.io/gpu=gpu0"]
    assert dp.for_container("infer") == ["peerpods.io/gpu=gpu2-mig0", "peerpods.io/gpu=gpu2-mig1"]
    assert dp.for_container("tiny") == ["peerpods.io/gpu=gpu1-mig0"]


def test_default_gpus_only_every_app_container_gets_the_pod_gpus() -> None:
    dp = plan_devices(None, GpuIntent(gpus=2), P4D)
    assert dp.containers is None
    assert dp.for_container("anything") == ["peerpods.io/gpu=gpu0", "peerpods.io/gpu=gpu1"]


def test_no_gpus_no_devices() -> None:
    dp = plan_devices(None, GpuIntent(), P4D)
    assert dp.empty and dp.for_container("main") == []


def test_rdma_and_custom_naming() -> None:
    naming = CdiNaming(gpu="example.com/gpu=g{index}", rdma="example.com/rdma=hca{index}")
    plan = ContainerPlan(
        units=units(DeviceUnit(id="g", kind="gpu"), DeviceUnit(id="r", kind="rdma", count=2)),
        containers={"main": ("g", "r")},
    )
    dp = plan_devices(plan, GpuIntent(gpus=1, rdma=True), P4D, naming)
    assert dp.for_container("main") == [
        "example.com/gpu=g0",
        "example.com/rdma=hca0",
        "example.com/rdma=hca1",
    ]


def test_plan_survives_json_and_is_assigned_later() -> None:
    stored = DevicePlan.from_json(plan_devices(None, GpuIntent(gpus=2), P4D).to_json())
    plan = ContainerPlan(units=units(DeviceUnit(id="a", kind="gpu")), containers={"x": ("a",)})
    assigned = stored.with_container_plan(plan)
    assert assigned.for_container("x") == ["peerpods.io/gpu=gpu0"]
    assert assigned.for_container("y") == []
    assert stored.for_container("y") == ["peerpods.io/gpu=gpu0", "peerpods.io/gpu=gpu1"]


@pytest.mark.parametrize(
    ("plan", "intent", "instance", "message"),
    [
        (None, GpuIntent(gpus=9), P4D, "needs 9 whole GPUs"),
        (None, GpuIntent(mig={"7g.40gb": 9}), P4D, "do not fit"),
        (None, GpuIntent(mig={"1g.10gb": 1}), (1, "l4"), "do not fit"),
        (
            ContainerPlan(
                units=units(DeviceUnit(id="a", kind="gpu", count=3)), containers={"m": ("a",)}
            ),
            GpuIntent(gpus=2),
            P4D,
            "needs 3 whole GPUs",
        ),
    ],
)
def test_impossible_plans_are_clear_errors(
    plan: ContainerPlan | None,
    intent: GpuIntent,
    instance: InstanceType | tuple[int, str],
    message: str,
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        plan_devices(plan, intent, instance)


def test_bad_naming_template_is_refused() -> None:
    with pytest.raises(ValueError, match="does not make a CDI name"):
        CdiNaming(gpu="gpu{index}")
