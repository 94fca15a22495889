"""One codec for the contract both ways: every contract the webhook can write is one the adaptor
accepts and reads back unchanged; every pod the webhook admits yields annotations the adaptor
accepts; the forms Kata's runtimes send (runtime-rs's float vCPUs, empty keys, CRI-O names)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from providers.core import contract
from providers.core.capacity import CapacityType
from providers.core.contract import ContainerPlan, Contract, DeviceUnit, GpuIntent
from providers.core.errors import AnnotationError, PeerpodsError
from webhook import Settings, mutate_pod

models = st.lists(st.sampled_from(["h100", "a100-80gb", "l4", "t4"]), unique=True, max_size=3)
profiles = st.dictionaries(
    st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]), st.integers(1, 8), max_size=3
)
gpu_intents = st.builds(
    GpuIntent,
    gpus=st.integers(0, 64),
    models=models.map(tuple),
    memory_mib=st.integers(0, 200_000),
    mig=profiles,
    fractional=st.booleans(),
    rdma=st.booleans(),
)
units = st.lists(
    st.builds(
        DeviceUnit,
        id=st.sampled_from(["gpu-a", "gpu-b", "rdma-a"]),
        kind=st.just("gpu"),
        count=st.integers(1, 8),
    ),
    unique_by=lambda u: u.id,
    max_size=3,
)


@st.composite
def contracts(draw: st.DrawFn) -> Contract:
    plan_units = draw(units)
    plan = ContainerPlan(
        units=tuple(plan_units), containers={"main": tuple(u.id for u in plan_units)}
    )
    return Contract(
        vcpus=draw(st.integers(0, contract.MAX_VCPUS)),
        memory_mib=draw(st.integers(0, contract.MAX_MEMORY_MIB)),
        gpu=draw(gpu_intents),
        capacity_type=draw(st.sampled_from(list(CapacityType))),
        devices=plan if plan_units else None,
    )


@given(contracts())
def test_every_contract_round_trips(value: Contract) -> None:
    annotations = value.encode()
    assert Contract.decode(annotations) == value
    # ... and the adaptor accepts it at CreateVM, with every other key Kata sends empty
    names = {contract.SANDBOX_NAME: "pod-a", contract.SANDBOX_NAMESPACE: "ns"}
    intent = contract.parse_vm_annotations({**EMPTY_NINE, **names, **annotations})
    assert (intent.vcpus, intent.memory_mib, intent.gpu) == (
        value.vcpus,
        value.memory_mib,
        value.gpu,
    )


@pytest.mark.parametrize(
    ("field", "value", "key"),
    [
        ("vcpus", contract.MAX_VCPUS + 1, contract.DEFAULT_VCPUS),
        ("memory_mib", contract.MAX_MEMORY_MIB + 1, contract.DEFAULT_MEMORY),
    ],
)
def test_what_the_adaptor_would_refuse_is_never_written(field: str, value: int, key: str) -> None:
    with pytest.raises(AnnotationError) as info:
        Contract(**{field: value}).encode()
    assert info.value.key == key
    with pytest.raises(AnnotationError):
        Contract.decode({key: str(value)})


EMPTY_NINE = {
    contract.SANDBOX_NAME: "",
    contract.SANDBOX_NAMESPACE: "",
    contract.MACHINE_TYPE: "",
    contract.DEFAULT_VCPUS: "",
    contract.DEFAULT_MEMORY: "",
    contract.IMAGE: "",
    contract.CC_INIT_DATA: "",
    contract.DEFAULT_GPUS: "",
    contract.DEFAULT_GPU_MODEL: "",
}


@pytest.mark.parametrize(
    ("sent", "vcpus"), [("1", 1), ("1.5", 2), ("2.0", 2), ("0.25", 1), ("", 0), ("16", 16)]
)
def test_runtime_rs_float_vcpus_round_up(sent: str, vcpus: int) -> None:
    names = {contract.SANDBOX_NAME: "pod-a", contract.SANDBOX_NAMESPACE: "ns"}
    annotations = {**EMPTY_NINE, **names, contract.DEFAULT_VCPUS: sent}
    assert contract.parse_vm_annotations(annotations).vcpus == vcpus


@pytest.mark.parametrize("sent", ["-1", "1.", ".5", "1e3", "inf", "NaN", "²", "1.5.2", "9" * 40])
def test_bad_vcpus_are_named(sent: str) -> None:
    names = {contract.SANDBOX_NAME: "pod-a", contract.SANDBOX_NAMESPACE: "ns"}
    with pytest.raises(AnnotationError) as info:
        contract.parse_vm_annotations({**EMPTY_NINE, **names, contract.DEFAULT_VCPUS: sent})
    assert info.value.key == contract.DEFAULT_VCPUS


def test_empty_keys_mean_unset_and_crio_names_are_read() -> None:
    crio = {contract.SANDBOX_NAME: "k8s_trainer-0_ml_3f2a9c1e-0b1d-4c55-9a63-1f0e2d3c4b5a_0"}
    intent = contract.parse_vm_annotations({**EMPTY_NINE, **crio})
    assert (intent.pod_name, intent.pod_namespace) == ("trainer-0", "ml")
    assert (intent.vcpus, intent.memory_mib, intent.gpu.gpus, intent.machine_type) == (0, 0, 0, "")
    with pytest.raises(AnnotationError, match="sandbox-name"):
        contract.parse_vm_annotations(EMPTY_NINE)


# --- every pod the webhook admits yields annotations the adaptor accepts ----------------------

quantities = st.one_of(
    st.integers(0, 10**9).map(str),
    st.sampled_from(["500m", "1.5", "99999999", "16Gi", "1Ei", "0.001", "2k", "1e3"]),
)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    containers = []
    for index in range(draw(st.integers(1, 3))):
        limits = {}
        if draw(st.booleans()):
            limits["cpu"] = draw(quantities)
        if draw(st.booleans()):
            limits["memory"] = draw(quantities)
        if draw(st.booleans()):
            limits["nvidia.com/gpu"] = draw(st.integers(0, 2000).map(str))
        containers.append({"name": f"c{index}", "image": "x", "resources": {"limits": limits}})
    annotations = draw(
        st.dictionaries(
            st.sampled_from([contract.DEFAULT_VCPUS, contract.DEFAULT_GPUS, contract.SEAL]),
            st.sampled_from(["8", "99999999", "1.5", "", "v1:x"]),
            max_size=2,
        )
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
        "spec": {"runtimeClassName": "kata-remote", "containers": containers},
    }


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(pods())
def test_every_admitted_pod_is_accepted_by_the_adaptor(pod: dict[str, Any]) -> None:
    policy = Settings()  # one webhook: its seal key recognises what it sealed
    try:
        result = mutate_pod(pod, settings=policy, namespace="ns")
    except PeerpodsError:
        return  # a denial: nothing reaches the adaptor
    annotations = dict(result.pod["metadata"].get("annotations") or {})
    names = {contract.SANDBOX_NAME: "p", contract.SANDBOX_NAMESPACE: "ns"}
    intent = contract.parse_vm_annotations({**EMPTY_NINE, **annotations, **names})
    assert intent.vcpus <= contract.MAX_VCPUS
    # and the admitted pod is a fixed point
    again = mutate_pod(result.pod, settings=policy, namespace="ns")
    assert again.patch == []
