"""HTTPS round trips through the live webhook: every patch applied, the pod validated against the
Kubernetes schema, and a second pass that changes nothing (checked inside `admit`)."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch

from providers.core.contract import (
    DEFAULT_GPU_MODEL,
    DEFAULT_GPUS,
    DEFAULT_MEMORY,
    DEFAULT_VCPUS,
    DEVICES,
    MACHINE_TYPE,
    SEAL,
    VM_RESOURCE,
    ContainerPlan,
    decode_gpu_model,
)
from tests.webhook.conftest import Admit, Running, container, patch_of, pod, post, review


def _annotations(p: dict[str, Any]) -> dict[str, str]:
    """The pod's annotations less the webhook's seal (tests/webhook/test_contract_trust.py)."""
    found = dict(p["metadata"].get("annotations") or {})
    assert found.pop(SEAL, "").startswith("v2:") or not found.get(DEFAULT_VCPUS)
    return found


def _resources(p: dict[str, Any], index: int = 0, field: str = "containers") -> dict[str, Any]:
    return dict(p["spec"][field][index].get("resources") or {})


def test_multi_container_gpus_become_contract_and_plan(admit: Admit) -> None:
    p = pod(
        container("trainer", {"cpu": "3500m", "memory": "8Gi", "nvidia.com/gpu": 2}),
        container("helper", {"cpu": "1", "memory": "512Mi", "nvidia.com/gpu": "1"}),
        container("plain", requests={"cpu": "250m", "memory": "100M"}),
    )
    _, mutated = admit(p)
    a = _annotations(mutated)
    assert a[DEFAULT_VCPUS] == "5"  # 3.5 + 1 + 0.25 rounded up
    assert a[DEFAULT_MEMORY] == str(8192 + 512 + 96)  # 100M = 95.37 MiB, rounded up
    assert a[DEFAULT_GPUS] == "3"
    assert DEFAULT_GPU_MODEL not in a
    plan = ContainerPlan.decode(a[DEVICES])
    assert plan.containers == {"trainer": ("trainer-gpu",), "helper": ("helper-gpu",)}
    assert {u.id: u.count for u in plan.units} == {"trainer-gpu": 2, "helper-gpu": 1}
    # the first container keeps the VM resource and, for namespace quotas, the GPUs asked for
    kept = {VM_RESOURCE: "1", "kata.peerpods.io/gpu": "3"}
    assert _resources(mutated, 0) == {"limits": kept, "requests": kept}
    assert "resources" not in mutated["spec"]["containers"][1]
    assert "resources" not in mutated["spec"]["containers"][2]


def test_init_and_sidecar_arithmetic(admit: Admit) -> None:
    p = pod(
        container("app", {"cpu": "2", "memory": "1Gi"}),
        init=[
            container("sidecar", {"cpu": "1", "memory": "256Mi"}, restartPolicy="Always"),
            container("migrate", {"cpu": "2", "memory": "4Gi"}),  # + sidecar: 3 CPU, 4.25 GiB
            container("late-sidecar", requests={"cpu": "500m", "memory": "128Mi"},
                      restartPolicy="Always"),
        ],
    )  # fmt: skip
    _, mutated = admit(p)
    a = _annotations(mutated)
    # app phase: 2 + 1 + 0.5 = 3.5 -> 4 vCPUs; init peak 3. Memory: init peak 4352 MiB wins
    # over the app phase 1024 + 256 + 128.
    assert a[DEFAULT_VCPUS] == "4"
    assert a[DEFAULT_MEMORY] == "4352"
    for index in range(3):
        assert "resources" not in mutated["spec"]["initContainers"][index]


def test_pod_level_resources_win(admit: Admit) -> None:
    p = pod(container("a", {"cpu": "1", "memory": "1Gi"}),
            resources={"limits": {"cpu": "6", "memory": "10Gi"}})  # fmt: skip
    _, mutated = admit(p)
    a = _annotations(mutated)
    assert (a[DEFAULT_VCPUS], a[DEFAULT_MEMORY]) == ("6", "10240")
    assert "resources" not in mutated["spec"]


def test_mig_mixed_strategy(admit: Admit) -> None:
    p = pod(
        container("a", {"nvidia.com/mig-1g.10gb": 2}),
        container("b", {"nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-1g.10gb": "1"}),
    )
    _, mutated = admit(p)
    a = _annotations(mutated)
    assert DEFAULT_GPUS not in a
    intent = decode_gpu_model(a[DEFAULT_GPU_MODEL])
    assert intent.mig == {"1g.10gb": 3, "3g.40gb": 1}
    plan = ContainerPlan.decode(a[DEVICES])
    assert plan.containers["b"] == ("b-mig-1g.10gb", "b-mig-3g.40gb")
    assert [u.profile for u in plan.units if u.kind == "mig"] == ["1g.10gb", "1g.10gb", "3g.40gb"]


def test_rdma_and_efa(admit: Admit) -> None:
    p = pod(container("trainer", {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 4,
                                  "cpu": "90", "memory": "1000Gi"}),
            container("ib", {"rdma/ib": 1}))  # fmt: skip
    _, mutated = admit(p)
    a = _annotations(mutated)
    assert a[DEFAULT_GPUS] == "8"
    gpu = decode_gpu_model(a[DEFAULT_GPU_MODEL])
    assert gpu.rdma and gpu.rdma_devices == 5  # four EFA interfaces and one InfiniBand HCA
    plan = ContainerPlan.decode(a[DEVICES])
    assert plan.containers == {"trainer": ("trainer-gpu", "trainer-rdma"), "ib": ("ib-rdma",)}
    assert all(not _resources(mutated, 1).get(s) for s in ("limits", "requests"))


def test_non_peer_pods_untouched(webhook: Running) -> None:
    for runtime in (None, "runc", "kata-qemu"):
        p = pod(container("a", {"nvidia.com/gpu": 1, "cpu": "1"}), runtime=runtime,
                annotations={"cdi.k8s.io/x": "nvidia.com/gpu=all"})  # fmt: skip
        response = post(webhook, review(p))
        assert response == {"uid": response["uid"], "allowed": True}


def test_user_cdi_and_owned_annotations_stripped(admit: Admit) -> None:
    p = pod(
        container("a", {"cpu": "1", "memory": "1Gi"}),
        annotations={
            "cdi.k8s.io/evil": "nvidia.com/gpu=all",
            "cdi.k8s.io/peerpods_a": "nvidia.com/gpu=0",
            DEFAULT_GPUS: "8",
            DEVICES: '{"v":1}',
            "team": "ml",
        },
    )
    response, mutated = admit(p)
    assert _annotations(mutated) == {"team": "ml", DEFAULT_VCPUS: "1", DEFAULT_MEMORY: "1024"}
    paths = {op["path"] for op in patch_of(response)}
    assert "/metadata/annotations/cdi.k8s.io~1evil" in paths  # "/" escaped as "~1"


def test_annotations_map_created_when_missing(webhook: Running) -> None:
    p = pod(container("a", {"cpu": "1"}))
    ops = patch_of(post(webhook, review(p)))
    added = [op for op in ops if op["path"] == "/metadata/annotations"]
    assert [op["op"] for op in added] == ["add"]
    assert _annotations({"metadata": {"annotations": added[0]["value"]}}) == {DEFAULT_VCPUS: "1"}
    assert _annotations(jsonpatch.apply_patch(p, ops)) == {DEFAULT_VCPUS: "1"}


def test_pod_without_resources_only_gets_the_vm_resource(admit: Admit) -> None:
    response, mutated = admit(pod(container("a")))
    assert patch_of(response) == [
        {"op": "add", "path": "/spec/containers/0/resources",
         "value": {"limits": {VM_RESOURCE: "1"}, "requests": {VM_RESOURCE: "1"}}},
    ]  # fmt: skip
    assert "annotations" not in mutated["metadata"]


def test_impossible_requests_denied_with_selection_reason(webhook: Running) -> None:
    cases = [
        pod(container("a", {"nvidia.com/gpu": 16})),
        pod(container("a", {"nvidia.com/mig-2g.35gb": 1})),  # an H200 profile: no H200 here
        pod(container("a", {"nvidia.com/gpu": 1, "rdma/ib": 1, "cpu": "500"})),
    ]
    for p in cases:
        response = post(webhook, review(p))
        assert response["allowed"] is False
        assert response["status"]["code"] == 403
        assert "aws us-east-1 catalog" in response["status"]["message"]
        assert "patch" not in response


def test_machine_type_allow_list(admit: Admit, webhook: Running) -> None:
    allowed = pod(container("a", {"nvidia.com/gpu": 4}), annotations={MACHINE_TYPE: "g5.12xlarge"})
    _, mutated = admit(allowed)
    assert _annotations(mutated)[MACHINE_TYPE] == "g5.12xlarge"
    refused = pod(container("a"), annotations={MACHINE_TYPE: "x2iedn.32xlarge"})
    response = post(webhook, review(refused))
    assert response["allowed"] is False
    assert "x2iedn.32xlarge" in response["status"]["message"]
    too_small = pod(
        container("a", {"nvidia.com/gpu": 8}), annotations={MACHINE_TYPE: "g5.12xlarge"}
    )
    assert post(webhook, review(too_small))["allowed"] is False


def test_invalid_pods_are_denied_not_errors(webhook: Running) -> None:
    cases = [
        pod(container("a", {"cpu": "lots"})),
        pod(container("a", {"nvidia.com/gpu": "1.5"})),
        pod(container("a", {"nvidia.com/mig-big": 1})),
        pod(container("a")) | {"spec": {"runtimeClassName": "kata-remote", "containers": "x"}},
        pod(container("a", {}), annotations={"x": 1}),  # type: ignore[dict-item]
    ]  # fmt: skip
    for p in cases:
        response = post(webhook, review(p))
        assert response["allowed"] is False, p
        assert response["status"]["code"] == 400
        assert response["status"]["message"]


def test_other_kinds_and_operations_pass(webhook: Running) -> None:
    p = pod(container("a", {"nvidia.com/gpu": 1}))
    body = review(p, operation="UPDATE")
    assert post(webhook, body) == {"uid": body["request"]["uid"], "allowed": True}
    body = review({"kind": "ConfigMap"})
    body["request"]["kind"]["kind"] = "ConfigMap"
    assert post(webhook, body)["allowed"] is True


def test_patch_is_minimal_json(webhook: Running) -> None:
    p = pod(container("a", {"cpu": "1", "nvidia.com/gpu": 1}), annotations={"keep": "me"})
    ops = patch_of(post(webhook, review(p)))
    assert all(op["op"] in ("add", "remove", "replace") for op in ops)
    assert not any(op["path"] == "/metadata/annotations/keep" for op in ops)
    json.dumps(ops)
