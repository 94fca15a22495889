"""config/deploy/adaptor's ValidatingAdmissionPolicy in a real kube-apiserver: the adaptor's
ServiceAccount, with the token of its pod on node A, patches node A's status and is refused on
node B; a token bound to no pod changes no node. RBAC alone (the ClusterRole shipped beside it)
would allow both."""

from __future__ import annotations

import json
import time
import urllib.error
from pathlib import Path

from tests.peers.kube import KubeCluster

ADAPTOR = Path(__file__).resolve().parents[2] / "config" / "deploy" / "adaptor"
NAMESPACE = "peerpods-system"


def _patch_status(cluster: KubeCluster, node: str, token: str, value: str) -> None:
    body = {"status": {"capacity": {"kata.peerpods.io/vm": value}}}
    cluster.api_request("PATCH", f"/api/v1/nodes/{node}/status", body, token=token)


def _refusal(cluster: KubeCluster, node: str, token: str) -> tuple[int, str]:
    try:
        _patch_status(cluster, node, token, "7")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}").get("message", "")
    return 200, ""


def test_the_adaptor_changes_only_its_own_nodes_status(kube_cluster: KubeCluster) -> None:
    kube_cluster.ensure_namespace(NAMESPACE)
    kube_cluster.kubectl("apply", "-f", str(ADAPTOR / "rbac.yaml"))
    kube_cluster.create_fake_node("policy-node-a")
    kube_cluster.create_fake_node("policy-node-b")
    kube_cluster.apply(
        f"""
apiVersion: v1
kind: Pod
metadata: {{name: policy-adaptor, namespace: {NAMESPACE}}}
spec:
  nodeName: policy-node-a
  serviceAccountName: peerpods-adaptor
  containers:
  - name: c
    image: registry.invalid/pause:1
"""
    )
    try:
        token = kube_cluster.create_token(
            NAMESPACE, "peerpods-adaptor", bound_kind="Pod", bound_name="policy-adaptor"
        )
        unbound = kube_cluster.create_token(NAMESPACE, "peerpods-adaptor")
        # RBAC alone lets the adaptor patch any node's status
        _patch_status(kube_cluster, "policy-node-b", token, "3")
        kube_cluster.kubectl("apply", "-f", str(ADAPTOR / "node-policy.yaml"))
        # the API server loads a new policy within seconds
        deadline = time.monotonic() + 60
        while (refused := _refusal(kube_cluster, "policy-node-b", token))[0] == 200:
            assert time.monotonic() < deadline, "the policy never took effect"
            time.sleep(0.5)
        code, message = refused
        assert code == 403, refused
        assert "may change only its own node, not policy-node-b" in message
        # (a poll before the policy took effect may have written 7 there)
        before = kube_cluster.api_get("/api/v1/nodes/policy-node-b")["status"]["capacity"]
        assert _refusal(kube_cluster, "policy-node-b", token)[0] == 403
        after = kube_cluster.api_get("/api/v1/nodes/policy-node-b")["status"]["capacity"]
        assert after == before  # the refused patch changed nothing
        _patch_status(kube_cluster, "policy-node-a", token, "10")
        node_a = kube_cluster.api_get("/api/v1/nodes/policy-node-a")
        assert node_a["status"]["capacity"]["kata.peerpods.io/vm"] == "10"
        assert _refusal(kube_cluster, "policy-node-a", unbound)[0] == 403
        # other users' writes (here the admin's) are not the policy's business
        _patch_status(kube_cluster, "policy-node-b", kube_cluster.admin_token, "4")
    finally:
        kube_cluster.kubectl("delete", "-f", str(ADAPTOR / "node-policy.yaml"), check=False)
        kube_cluster.kubectl(
            "-n", NAMESPACE, "delete", "pod", "policy-adaptor", "--grace-period=0", "--force",
            check=False,
        )  # fmt: skip
        kube_cluster.kubectl("delete", "node", "policy-node-a", "policy-node-b", check=False)
        kube_cluster.kubectl("delete", "-f", str(ADAPTOR / "rbac.yaml"), check=False)
