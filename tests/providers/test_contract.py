"""The annotation contract: what the webhook writes is exactly what the adaptor reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from providers.core import contract
from providers.core.contract import ContainerPlan, DeviceUnit, GpuIntent
from providers.core.errors import AnnotationError

models = st.lists(
    st.sampled_from(["h100", "a100-80gb", "l4", "t4", "h200"]), unique=True, max_size=3
)
profiles = st.dictionaries(
    st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me"]),
    st.integers(1, 8),
    max_size=3,
)


@given(
    gpus=st.integers(0, 16),
    models=models,
    memory=st.integers(0, 200_000),
    mig=profiles,
    fractional=st.booleans(),
    rdma=st.booleans(),
)
def test_gpu_model_round_trips(
    gpus: int, models: list[str], memory: int, mig: dict[str, int], fractional: bool, rdma: bool
) -> None:
    intent = GpuIntent(
        gpus=gpus,
        models=tuple(models),
        memory_mib=memory,
        mig=mig,
        fractional=fractional,
        rdma=rdma,
    )
    assert contract.decode_gpu_model(contract.encode_gpu_model(intent), gpus) == intent


def test_encoding_is_compact_and_versioned() -> None:
    intent = GpuIntent(gpus=1, models=("h100", "h200"), mig={"1g.10gb": 2})
    assert contract.encode_gpu_model(intent) == "v1:m=h100|h200;mig=1g.10gb:2"
    assert contract.encode_gpu_model(GpuIntent(gpus=2)) == ""


def test_rdma_device_count() -> None:
    intent = contract.decode_gpu_model("v1:m=h100;rdma=4", 8)
    assert intent.rdma and intent.rdma_devices == 4
    assert contract.encode_gpu_model(intent) == "v1:m=h100;rdma=4"
    assert contract.decode_gpu_model("v1:rdma=1").rdma_devices == 0  # one is the default
    request = contract.VMIntent(pod_name="p", pod_namespace="d", gpu=intent).to_request()
    assert request.rdma and request.rdma_devices == 4


def test_legacy_value_is_a_model_list() -> None:
    assert contract.decode_gpu_model("a100, h100", 2).models == ("a100", "h100")


@pytest.mark.parametrize(
    "value",
    [
        "v2:m=h100",
        "v1:m=",
        "v1:mig=1g.10gb",
        "v1:mig=9x:1",
        "v1:mem=lots",
        "v1:bogus",
        "a100 80",
        "v1:rdma=0",
        "v1:rdma=many",
    ],
)
def test_bad_gpu_model_names_the_annotation(value: str) -> None:
    with pytest.raises(AnnotationError, match="default_gpu_model"):
        contract.decode_gpu_model(value)


def _annotations(**extra: str) -> dict[str, str]:
    base = {
        contract.SANDBOX_NAME: "trainer-0",
        contract.SANDBOX_NAMESPACE: "ml",
        contract.DEFAULT_VCPUS: "8",
        contract.DEFAULT_MEMORY: "16384",
        contract.DEFAULT_GPUS: "2",
        contract.DEFAULT_GPU_MODEL: "v1:m=h100;rdma",
        contract.MACHINE_TYPE: "",
        contract.IMAGE: "",
        contract.CC_INIT_DATA: "",
    }
    base.update(extra)
    return base


def test_vm_annotations_become_a_request() -> None:
    intent = contract.parse_vm_annotations(_annotations())
    request = intent.to_request()
    assert (intent.pod_namespace, intent.pod_name) == ("ml", "trainer-0")
    assert (request.vcpus, request.memory_mib, request.gpus) == (8, 16384, 2)
    assert request.gpu_models == ("h100",) and request.rdma


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (contract.DEFAULT_VCPUS, "-1"),
        (contract.DEFAULT_MEMORY, "16Gi"),
        (contract.DEFAULT_GPUS, "two"),
        (contract.SANDBOX_NAME, ""),
        (contract.SANDBOX_NAMESPACE, "Bad_NS"),
        (contract.MACHINE_TYPE, "p5.48xlarge; rm -rf"),
    ],
)
def test_bad_vm_annotation_is_named(key: str, value: str) -> None:
    with pytest.raises(AnnotationError) as info:
        contract.parse_vm_annotations(_annotations(**{key: value}))
    assert info.value.key == key


def test_container_plan_round_trip_and_intent() -> None:
    plan = ContainerPlan(
        units=(
            DeviceUnit(id="gpu-main", kind="gpu", count=2),
            DeviceUnit(id="claim-shared", kind="mig", profile="1g.10gb", count=1),
            DeviceUnit(id="nic", kind="rdma"),
        ),
        containers={"main": ("gpu-main", "claim-shared", "nic"), "side": ("claim-shared",)},
    )
    decoded = ContainerPlan.decode(plan.encode())
    assert decoded == plan
    assert decoded.gpu_intent() == GpuIntent(gpus=2, mig={"1g.10gb": 1}, rdma=True)
    assert len(contract.DEVICES) <= 63 and "/" not in contract.DEVICES


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        '{"v":2}',
        '{"v":1,"units":[{"id":"a","kind":"gpu"}],"containers":{"c":["b"]}}',
        '{"v":1,"units":[{"id":"a","kind":"mig"}]}',
        '{"v":1,"units":[{"id":"a","kind":"gpu"},{"id":"a","kind":"gpu"}]}',
        '{"v":1,"units":[{"id":"a","kind":"gpu","count":0}]}',
    ],
)
def test_bad_container_plan_is_named(value: str) -> None:
    with pytest.raises(AnnotationError, match=r"peerpods\.devices"):
        ContainerPlan.decode(value)
