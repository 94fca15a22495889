"""The real control plane the peers suite runs against: it is ready, serves DRA, schedules pods,
and hands out the identities node-restricted tests need."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
from typing import Any

import pytest

from tests.peers.kube import KubeCluster


def _wait_for(what: str, check: Any, timeout_seconds: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def test_readyz_through_kubectl(kube_cluster: KubeCluster) -> None:
    result = kube_cluster.kubectl("get", "--raw", "/readyz")
    assert result.stdout.strip() == "ok"
    version = json.loads(kube_cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["minor"] == "36"


def test_resource_slices_are_served(kube_cluster: KubeCluster) -> None:
    resources = kube_cluster.api_get("/apis/resource.k8s.io/v1")
    names = {item["name"] for item in resources["resources"]}
    assert {"resourceslices", "deviceclasses", "resourceclaims"} <= names
    slice_yaml = """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: harness-slice
spec:
  driver: harness.example.com
  nodeName: harness-dra-node
  pool: {name: harness-pool, generation: 1, resourceSliceCount: 1}
  devices:
  - name: dev-0
"""
    kube_cluster.apply(slice_yaml)
    try:
        listed = kube_cluster.api_get("/apis/resource.k8s.io/v1/resourceslices")
        assert [s["metadata"]["name"] for s in listed["items"]] == ["harness-slice"]
        assert listed["items"][0]["spec"]["devices"] == [{"name": "dev-0"}]
    finally:
        kube_cluster.kubectl("delete", "resourceslice", "harness-slice")


def test_scheduler_binds_pod_to_fake_node(kube_cluster: KubeCluster) -> None:
    kube_cluster.create_fake_node("harness-node", cpu="4", memory="8Gi")
    try:
        kube_cluster.apply(
            """
apiVersion: v1
kind: Pod
metadata: {name: harness-pod, namespace: default}
spec:
  containers:
  - name: c
    image: registry.invalid/pause:1
    resources: {requests: {cpu: 100m, memory: 64Mi}}
"""
        )

        def bound() -> str:
            pod = kube_cluster.api_get("/api/v1/namespaces/default/pods/harness-pod")
            node: str = pod["spec"].get("nodeName", "")
            return node

        assert _wait_for("pod bound", bound) == "harness-node"
    finally:
        kube_cluster.kubectl("delete", "pod", "harness-pod", "--grace-period=0", "--force")
        kube_cluster.kubectl("delete", "node", "harness-node")


def test_pod_that_fits_nowhere_stays_pending(kube_cluster: KubeCluster) -> None:
    kube_cluster.create_fake_node("harness-small", cpu="1", memory="1Gi")
    try:
        kube_cluster.apply(
            """
apiVersion: v1
kind: Pod
metadata: {name: harness-big, namespace: default}
spec:
  containers:
  - name: c
    image: registry.invalid/pause:1
    resources: {requests: {cpu: "64"}}
"""
        )

        def unschedulable() -> bool:
            pod = kube_cluster.api_get("/api/v1/namespaces/default/pods/harness-big")
            conditions = pod.get("status", {}).get("conditions", [])
            return any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in conditions
            )

        assert _wait_for("pod marked unschedulable", unschedulable)
        pod = kube_cluster.api_get("/api/v1/namespaces/default/pods/harness-big")
        assert "nodeName" not in pod["spec"]
    finally:
        kube_cluster.kubectl("delete", "pod", "harness-big", "--grace-period=0", "--force")
        kube_cluster.kubectl("delete", "node", "harness-small")


def test_node_identity_is_node_restricted(kube_cluster: KubeCluster) -> None:
    kube_cluster.create_fake_node("harness-self")
    kube_cluster.create_fake_node("harness-other")
    try:
        own = kube_cluster.node_kubeconfig("harness-self")
        mine = kube_cluster.kubectl(
            "label", "node", "harness-self", "example.com/a=b", kubeconfig=own, check=False
        )
        assert mine.returncode == 0, mine.stderr
        other = kube_cluster.kubectl(
            "label", "node", "harness-other", "example.com/a=b", kubeconfig=own, check=False
        )
        assert other.returncode != 0
        assert "forbidden" in other.stderr.lower()
    finally:
        kube_cluster.kubectl("delete", "node", "harness-self", "harness-other")


def test_pod_bound_token_carries_pod_and_node(kube_cluster: KubeCluster) -> None:
    kube_cluster.create_fake_node("harness-token-node")
    kube_cluster.apply(
        """
apiVersion: v1
kind: Pod
metadata: {name: harness-token-pod, namespace: default}
spec:
  nodeName: harness-token-node
  containers:
  - name: c
    image: registry.invalid/pause:1
"""
    )
    try:
        token = kube_cluster.create_token(
            "default", "default", bound_kind="Pod", bound_name="harness-token-pod"
        )
        review = kube_cluster.api_request(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = review["status"]
        assert status["authenticated"] is True
        assert status["user"]["username"] == "system:serviceaccount:default:default"
        extra = status["user"]["extra"]
        assert extra["authentication.kubernetes.io/pod-name"] == ["harness-token-pod"]
        assert extra["authentication.kubernetes.io/node-name"] == ["harness-token-node"]
        # The token works against the API; the default account may not list nodes.
        with pytest.raises(urllib.error.HTTPError) as refused:
            kube_cluster.api_get("/api/v1/nodes", token=token)
        assert refused.value.code == 403
    finally:
        kube_cluster.kubectl("delete", "pod", "harness-token-pod", "--grace-period=0", "--force")
        kube_cluster.kubectl("delete", "node", "harness-token-node")


def test_token_for_missing_pod_is_refused(kube_cluster: KubeCluster) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:
        kube_cluster.create_token("default", "default", bound_kind="Pod", bound_name="no-such-pod")
    assert refused.value.code == 404


def test_stop_leaves_no_process() -> None:
    cluster = KubeCluster(scheduler=True, ready_timeout_seconds=120.0)
    with cluster:
        pids = [p.popen.pid for p in cluster.processes]
        folder = cluster.folder
        assert len(pids) == 3
    for pid in pids:
        state = subprocess.run(
            ["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True
        )
        assert state.stdout.strip() == ""
    assert not folder.exists()


def test_validating_admission_policy_is_enforced(kube_cluster: KubeCluster) -> None:
    kube_cluster.apply(
        """
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: harness-no-forbidden-key}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [configmaps]
  validations:
  - expression: "!has(object.data) || !('forbidden' in object.data)"
    message: harness says no
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: harness-no-forbidden-key}
spec:
  policyName: harness-no-forbidden-key
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {kubernetes.io/metadata.name: default}
"""
    )
    manifest = """
apiVersion: v1
kind: ConfigMap
metadata: {name: harness-cm, namespace: default}
data: {forbidden: "1"}
"""
    try:

        def refused() -> str:
            result = kube_cluster.kubectl("create", "-f", "-", input=manifest, check=False)
            if result.returncode == 0:  # the policy is not loaded yet
                kube_cluster.kubectl("delete", "configmap", "harness-cm", "-n", "default")
                return ""
            return result.stderr

        assert "harness says no" in _wait_for("policy enforced", refused)
        allowed = manifest.replace("forbidden", "fine")
        kube_cluster.kubectl("create", "-f", "-", input=allowed)
    finally:
        kube_cluster.kubectl(
            "delete", "configmap", "harness-cm", "-n", "default", "--ignore-not-found"
        )
        kube_cluster.kubectl(
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            "harness-no-forbidden-key",
        )


def test_node_bound_token_names_the_node(kube_cluster: KubeCluster) -> None:
    kube_cluster.create_fake_node("harness-bound-node")
    try:
        node = kube_cluster.api_get("/api/v1/nodes/harness-bound-node")
        token = kube_cluster.create_token(
            "default", "default", bound_kind="Node", bound_name="harness-bound-node"
        )
        review = kube_cluster.api_request(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        extra = review["status"]["user"]["extra"]
        assert extra["authentication.kubernetes.io/node-name"] == ["harness-bound-node"]
        assert extra["authentication.kubernetes.io/node-uid"] == [node["metadata"]["uid"]]
        assert "authentication.kubernetes.io/pod-name" not in extra
    finally:
        kube_cluster.kubectl("delete", "node", "harness-bound-node")

    # Deleting the node invalidates the token bound to it, once the apiserver's cache of
    # successful token reviews (seconds) has let the old answer go.
    def rejected() -> bool:
        review = kube_cluster.api_request(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        return review["status"].get("authenticated") is not True

    assert _wait_for("token of the deleted node rejected", rejected)
