"""What a real API server refuses, checked on the webhook's output with the server's own rules
(tests/webhook/apiserver_rules.py, written from the kubernetes validation code it cites):

- every bundled example, mutated, passes the resource checks of pod creation;
- a pod with hugepages is denied by the webhook with a reason, never admitted into the
  server's "HugePages require cpu or memory";
- re-applying an example (client-side: the manifest's resources on the live pod; server-side:
  also without the contract annotations) is mutated back to the live pod, so the server's update
  rule accepts it, and the contract stays as admitted;
- an update that really changes resources is left for the server to refuse; one that changes a
  contract key is denied, and the log names the pod;
- a mutated peer pod is BestEffort on the node, deliberately (docs/webhook.md).
"""

from __future__ import annotations

import base64
import copy
import json
import logging
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from providers.core.contract import DEFAULT_GPUS, OWNED_KEYS, SEAL, VM_RESOURCE
from providers.core.snapshots import load_snapshot
from tests.webhook.apiserver_rules import (
    qos_class,
    quota_errors,
    quota_usage,
    requirement_errors,
    resource_errors,
    update_errors,
)
from webhook._admission import Admission
from webhook._mutate import Settings
from webhook._resolver import MemoryResolver

EXAMPLES = Path(__file__).resolve().parents[2] / "config" / "examples"
OBJECTS = [d for p in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())
           if d]  # fmt: skip
PODS = [d for d in OBJECTS if d["kind"] == "Pod"]
SETTINGS = Settings()


@pytest.fixture(scope="module")
def admission() -> Admission:
    catalog = load_snapshot("aws", "us-east-1")
    return Admission(SETTINGS, lambda: catalog, MemoryResolver(OBJECTS))


def _review(operation: str, pod: dict[str, Any], old: dict[str, Any] | None = None) -> Any:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"].get("namespace", "default"),
            "operation": operation,
            "userInfo": {"username": "tester"},
            "object": pod,
            **({"oldObject": old} if old is not None else {}),
        },
    }
    return Admission.parse(json.dumps(body).encode())


Pod = dict[str, Any]


def _decide(
    admission: Admission, operation: str, pod: Pod, old: Pod | None = None
) -> tuple[Pod, Pod]:
    """(response, the object the server stores after the patch)."""
    answer = admission.decide(_review(operation, pod, old))["response"]
    ops = json.loads(base64.b64decode(answer["patch"])) if "patch" in answer else []
    return answer, jsonpatch.apply_patch(pod, ops)


def _create(admission: Admission, pod: dict[str, Any]) -> dict[str, Any]:
    answer, live = _decide(admission, "CREATE", pod)
    assert answer["allowed"], answer
    return live


@pytest.mark.parametrize("pod", PODS, ids=[p["metadata"]["name"] for p in PODS])
def test_mutated_examples_pass_the_servers_resource_checks(
    admission: Admission, pod: dict[str, Any]
) -> None:
    assert resource_errors(pod) == []  # valid before the webhook
    live = _create(admission, pod)
    assert resource_errors(live) == []
    assert live["spec"]["containers"][0]["resources"]["limits"][VM_RESOURCE] == "1"


def test_hugepages_are_denied_with_a_reason(admission: Admission) -> None:
    limits = {"cpu": "2", "memory": "4Gi", "hugepages-2Mi": "1Gi", "nvidia.com/gpu": 1}
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "huge", "namespace": "default"},
        "spec": {"runtimeClassName": "kata-remote",
                 "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]},
    }  # fmt: skip
    assert resource_errors(pod) == []  # valid without the webhook
    # the rule the server applies to what stripping cpu and memory would leave
    left = {"limits": {"hugepages-2Mi": "1Gi"}, "requests": {"hugepages-2Mi": "1Gi"}}
    assert requirement_errors(left, "c") == ["c: Forbidden: HugePages require cpu or memory"]
    answer, _ = _decide(admission, "CREATE", pod)
    assert answer["allowed"] is False and answer["status"]["code"] == 400
    message = answer["status"]["message"]
    assert "spec.containers[0].resources.limits: hugepages-2Mi" in message
    assert "cannot ask for huge pages" in message


def _client_side(live: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """What `kubectl apply` (client-side) sends: the live pod with the manifest's spec fields
    merged back (resources and claims as written), annotations kept."""
    new = copy.deepcopy(live)
    new["spec"] = copy.deepcopy(manifest["spec"])
    return new


def _server_side(live: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """What `kubectl apply --server-side` stores before admission: the manifest's fields, and
    the fields the applier set at creation but no longer names removed (the contract
    annotations were set in its create request, so its manager owns them)."""
    new = _client_side(live, manifest)
    annotations = dict(manifest["metadata"].get("annotations") or {})
    if annotations:
        new["metadata"]["annotations"] = annotations
    else:
        new["metadata"].pop("annotations", None)
    return new


@pytest.mark.parametrize("apply", [_client_side, _server_side], ids=["client", "server"])
@pytest.mark.parametrize("pod", PODS, ids=[p["metadata"]["name"] for p in PODS])
def test_a_reapply_is_accepted_and_keeps_the_contract(
    admission: Admission, pod: dict[str, Any], apply: Any
) -> None:
    live = _create(admission, pod)
    sent = apply(live, pod)
    assert update_errors(live, sent) != []  # what the server refused before
    answer, stored = _decide(admission, "UPDATE", sent, live)
    assert answer["allowed"], answer
    assert update_errors(live, stored) == []
    assert stored["metadata"]["annotations"] == live["metadata"]["annotations"]
    assert stored == live
    # and the stored pod is a fixed point: the reinvocation or the next apply changes nothing
    again, _ = _decide(admission, "UPDATE", stored, live)
    assert "patch" not in again


def test_an_unrelated_update_is_untouched(admission: Admission) -> None:
    live = _create(admission, PODS[0])
    labelled = copy.deepcopy(live)
    labelled["metadata"]["labels"] = {"team": "a"}
    answer, stored = _decide(admission, "UPDATE", labelled, live)
    assert answer["allowed"] and "patch" not in answer and stored == labelled


def test_a_real_resource_change_is_left_for_the_server_to_refuse(admission: Admission) -> None:
    (pod,) = [p for p in PODS if p["metadata"]["name"] == "cuda-vectoradd"]
    live = _create(admission, pod)
    changed = _client_side(live, pod)
    changed["spec"]["containers"][0]["resources"]["limits"]["memory"] = "32Gi"
    changed["spec"]["containers"][1]["resources"]["limits"]["example.com/dongle"] = 1
    answer, stored = _decide(admission, "UPDATE", changed, live)
    assert answer["allowed"]
    assert update_errors(live, stored) != []  # the extended resource is a real change
    # the contract is never re-derived from an update
    assert (
        stored["metadata"]["annotations"][DEFAULT_GPUS]
        == live["metadata"]["annotations"][DEFAULT_GPUS]
    )


def test_a_contract_change_is_denied_naming_the_pod(
    admission: Admission, caplog: pytest.LogCaptureFixture
) -> None:
    (pod,) = [p for p in PODS if p["metadata"]["name"] == "cuda-vectoradd"]
    live = _create(admission, pod)
    changed = copy.deepcopy(live)
    changed["metadata"]["annotations"][DEFAULT_GPUS] = "8"
    with caplog.at_level(logging.INFO, logger="webhook._admission"):
        answer, _ = _decide(admission, "UPDATE", changed, live)
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    assert "pod default/cuda-vectoradd" in caplog.text


def test_an_unsealed_pod_is_not_restored(admission: Admission) -> None:
    (pod,) = [p for p in PODS if p["metadata"]["name"] == "cuda-vectoradd"]
    live = _create(admission, pod)
    del live["metadata"]["annotations"][SEAL]
    sent = _client_side(live, pod)
    answer, stored = _decide(admission, "UPDATE", sent, live)
    assert answer["allowed"] and stored == sent  # not known as ours: nothing restored
    assert all(
        k in stored["metadata"]["annotations"]
        for k in OWNED_KEYS
        if k in live["metadata"]["annotations"]
    )


@pytest.mark.parametrize("pod", PODS, ids=[p["metadata"]["name"] for p in PODS])
def test_a_peer_pod_is_best_effort_on_the_node(admission: Admission, pod: dict[str, Any]) -> None:
    assert qos_class(pod) in ("Burstable", "Guaranteed")
    assert qos_class(_create(admission, pod)) == "BestEffort"


def test_the_qos_rules_themselves() -> None:
    def one(resources: dict[str, Any]) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": "c", "resources": resources}]}}

    assert qos_class(one({"limits": {"cpu": "1", "memory": "1Gi"}})) == "Guaranteed"
    assert qos_class(one({"requests": {"cpu": "1"}})) == "Burstable"
    assert qos_class(one({"limits": {"nvidia.com/gpu": 1}})) == "BestEffort"
    assert requirement_errors({"requests": {"example.com/x": 1}}, "c") != []
    assert requirement_errors({"limits": {"example.com/x": "1.5"}}, "c") != []
    assert requirement_errors({"limits": {"cpu": "1"}, "requests": {"cpu": "2"}}, "c") != []


def test_any_model_denial_names_no_model(admission: Admission) -> None:
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "many", "namespace": "default"},
        "spec": {"runtimeClassName": "kata-remote", "containers": [
            {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 64}}}]},
    }  # fmt: skip
    answer, _ = _decide(admission, "CREATE", pod)
    assert answer["allowed"] is False
    message = answer["status"]["message"]
    assert "64 GPUs of any model exceed the largest GPU type" in message, message


def test_namespace_gpu_quotas_still_bind_peer_pods(admission: Admission) -> None:
    """The quota check runs after the webhook removed nvidia.com/gpu: what the pod asked for
    stays countable as kata.peerpods.io/gpu (whole GPUs) and kata.peerpods.io/mig (devices)."""
    by_name = {p["metadata"]["name"]: p for p in PODS}
    gpu_pod = _create(admission, by_name["cuda-vectoradd"])
    # an operator's old quota on nvidia.com/gpu no longer sees the pod: why the resource is kept
    assert quota_errors(gpu_pod, {"requests.nvidia.com/gpu": "0"}, {}) == []
    assert quota_errors(gpu_pod, {"requests.kata.peerpods.io/gpu": "0"}, {}) == [
        "exceeded quota: requested: requests.kata.peerpods.io/gpu=1, used: "
        "requests.kata.peerpods.io/gpu=0, limited: requests.kata.peerpods.io/gpu=0"
    ]
    assert quota_errors(gpu_pod, {"requests.kata.peerpods.io/gpu": "4"}, {}) == []
    assert quota_errors(
        gpu_pod, {"requests.kata.peerpods.io/gpu": "4"}, {"requests.kata.peerpods.io/gpu": "4"}
    )
    mig_pod = _create(admission, by_name[next(n for n in by_name if "mig" in n)])
    mig_usage = quota_usage(mig_pod)
    assert mig_usage.get("kata.peerpods.io/mig", 0) > 0
    assert quota_errors(mig_pod, {"requests.kata.peerpods.io/mig": "0"}, {})
    # a re-apply keeps them (the API server compares resources on update)
    sent = _client_side(gpu_pod, by_name["cuda-vectoradd"])
    _, stored = _decide(admission, "UPDATE", sent, gpu_pod)
    assert stored == gpu_pod


def test_a_user_cannot_shrink_the_counted_gpus(admission: Admission) -> None:
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sly", "namespace": "default"},
        "spec": {"runtimeClassName": "kata-remote", "containers": [
            {"name": "c", "image": "x", "resources": {"limits": {
                "nvidia.com/gpu": 2, "kata.peerpods.io/gpu": 0}}}]},
    }  # fmt: skip
    live = _create(admission, pod)
    assert quota_usage(live)["kata.peerpods.io/gpu"] == 2
