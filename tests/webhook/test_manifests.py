"""The webhook deploy manifests: valid Kubernetes objects with the settings admission needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

DIR = Path(__file__).resolve().parents[2] / "config" / "deploy" / "webhook"
DOCS = [d for p in sorted(DIR.glob("*.yaml")) if p.name != "kustomization.yaml"
        for d in yaml.safe_load_all(p.read_text()) if d]  # fmt: skip


def _one(kind: str) -> dict[str, Any]:
    return next(d for d in DOCS if d["kind"] == kind)


@pytest.mark.parametrize("doc", DOCS, ids=[f"{d['kind']}/{d['metadata']['name']}" for d in DOCS])
def test_valid(doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith("cert-manager.io/"):
        assert doc["spec"]
        return
    kubernetes_validate.validate(doc, "1.34", strict=True)


def test_webhook_configuration() -> None:
    hook = _one("MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["sideEffects"] == "None" and hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["failurePolicy"] == "Fail" and 1 <= hook["timeoutSeconds"] <= 30
    assert hook["clientConfig"]["service"]["path"] == "/mutate"
    excluded = hook["namespaceSelector"]["matchExpressions"][0]
    assert excluded["operator"] == "NotIn"
    assert {"kube-system", "peerpods-system"} <= set(excluded["values"])


def test_deployment_and_rbac() -> None:
    deployment = _one("Deployment")
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["webhook"]
    rules = _one("ClusterRole")["rules"]
    assert rules == [{"apiGroups": ["resource.k8s.io"],
                      "resources": ["resourceclaims", "resourceclaimtemplates", "deviceclasses"],
                      "verbs": ["get"]}]  # fmt: skip
    certificate = next(d for d in DOCS if d["kind"] == "Certificate")
    assert "peerpods-webhook.peerpods-system.svc" in certificate["spec"]["dnsNames"]


def test_only_peer_pods_reach_the_webhook() -> None:
    hook = _one("MutatingWebhookConfiguration")["webhooks"][0]
    (condition,) = hook["matchConditions"]
    assert "object.spec.runtimeClassName in ['kata-remote']" in condition["expression"]
    deployment = _one("Deployment")
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["PEERPODS_RUNTIME_CLASSES"] == "kata-remote"  # the same list


def test_network_policy_admits_only_https_from_outside_the_pod_network() -> None:
    policy = _one("NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "peerpods-webhook"
    }
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8443}]
    (peer,) = rule["from"]
    assert peer["ipBlock"]["except"]  # the pod network never reaches /mutate


def test_updates_reach_the_webhook() -> None:
    hook = _one("MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]


def test_cel_workers_can_start_on_a_read_only_root() -> None:
    spec = _one("Deployment")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]  # the forkserver's socket directory
