"""The DRA-driver mode against a real kube-apiserver and kube-scheduler v1.36.2, one peer-pod
Node and no kubelet: the published slices are accepted and form complete pools, config/deploy/dra
applies, a kata-remote pod asking `nvidia.com/gpu: 1` is admitted by `peerpods webhook
--dra-driver` still asking for it, bound, and its extended-resource claim allocated on
gpu.peerpods.io; a namespace quota on requests.nvidia.com/gpu binds; a limit of two H100s lets two
of three H100 claims through; a claim for an H100 of 40Gi or more gets one, and `peerpods plan
--dra-driver` names the same model."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from tests.peers.kube import KubeCluster, free_port

ROOT = Path(__file__).resolve().parents[2]
NODE = "dra-peer-node"
LABEL = "peerpods-dra-test"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
H100 = "device.attributes['gpu.peerpods.io'].productName == 'NVIDIA H100 80GB HBM3'"


def peerpods(*argv: str, kubeconfig: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERPODS_")}
    env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [sys.executable, "-m", "adaptor.cli.main", *argv],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=check,
        timeout=120,
    )


def wait_for(what: str, check: Callable[[], Any], timeout_seconds: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def namespace(cluster: KubeCluster, name: str) -> str:
    cluster.ensure_namespace(name)
    cluster.api_request(
        "PATCH", f"/api/v1/namespaces/{name}", {"metadata": {"labels": {LABEL: "true"}}}
    )
    return name


def gpu_pod(name: str, gpus: int = 1, claim: str = "") -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    spec: dict[str, Any] = {"runtimeClassName": "kata-remote"}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    if claim:
        resources["claims"] = [{"name": "gpu"}]
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    spec["containers"] = [{"name": "main", "image": "busybox", "resources": resources}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def h100_claim(name: str, *selectors: str) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.peerpods.io"}
    exactly["selectors"] = [{"cel": {"expression": s}} for s in (H100, *selectors)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def create(cluster: KubeCluster, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
    path = f"/api/v1/namespaces/{ns}/pods" if obj["kind"] == "Pod" else CLAIMS.format(ns=ns)
    answer: dict[str, Any] = cluster.api_request("POST", path, obj)
    return answer


def pod(cluster: KubeCluster, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.api_get(f"/api/v1/namespaces/{ns}/pods/{name}")
    return found


def bound(cluster: KubeCluster, ns: str, name: str) -> bool:
    return bool(pod(cluster, ns, name)["spec"].get("nodeName"))


def unschedulable(cluster: KubeCluster, ns: str, name: str) -> bool:
    conditions = pod(cluster, ns, name).get("status", {}).get("conditions") or []
    return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)


def allocated(cluster: KubeCluster, ns: str, claim: str) -> list[dict[str, Any]]:
    found = cluster.api_get(f"{CLAIMS.format(ns=ns)}/{claim}")
    results: list[dict[str, Any]] = (
        ((found.get("status") or {}).get("allocation") or {}).get("devices") or {}
    ).get("results") or []
    return results


def device_of(cluster: KubeCluster, result: dict[str, Any]) -> dict[str, Any]:
    for item in cluster.api_get(SLICES)["items"]:
        for device in item["spec"].get("devices") or []:
            if (
                item["spec"]["pool"]["name"] == result["pool"]
                and device["name"] == result["device"]
            ):
                found: dict[str, Any] = device
                return found
    raise AssertionError(f"{result['pool']}/{result['device']} is in no slice")


@pytest.fixture(scope="module")
def webhook(kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`peerpods webhook --dra-driver` on loopback, registered for the test's namespaces."""
    folder = tmp_path_factory.mktemp("dra-webhook")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(folder / "tls.key")
    cert.cert_chain_pems[0].write_to_path(folder / "tls.crt")
    seal = folder / "seal"
    seal.mkdir()
    (seal / "current").write_text(secrets.token_hex(32))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERPODS_")}
    log = (folder / "log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "adaptor.cli.main", "webhook", "--dra-driver", "--host", "127.0.0.1",
         "--port", str(port), "--tls-cert-file", str(folder / "tls.crt"),
         "--tls-key-file", str(folder / "tls.key"), "--seal-key-dir", str(seal),
         "--cel-workers", "0"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip

    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    wait_for("the webhook to listen", listening, 30)
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "peerpods-dra-test"},
        "webhooks": [
            {
                "name": "dra.peerpods.io",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/mutate",
                    "caBundle": __import__("base64").b64encode(ca.cert_pem.bytes()).decode(),
                },
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"],
                           "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}],
                "namespaceSelector": {"matchLabels": {LABEL: "true"}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "reinvocationPolicy": "IfNeeded",
            }
        ],
    }  # fmt: skip
    kube_cluster.apply(yaml.safe_dump(config))
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        kube_cluster.kubectl(
            "delete", "mutatingwebhookconfiguration", "peerpods-dra-test", check=False
        )
        process.terminate()
        process.wait(10)
        log.close()


@pytest.fixture(scope="module")
def dra(kube_cluster: KubeCluster, webhook: str) -> Iterator[KubeCluster]:
    """The pool published with two H100s, config/deploy/dra and the RuntimeClass applied, one
    peer-pod Node; all removed afterwards."""
    cluster = kube_cluster
    cluster.ensure_namespace("peerpods-system")
    cluster.kubectl("apply", "-k", str(ROOT / "config" / "deploy" / "dra"))
    cluster.apply((ROOT / "config" / "deploy" / "runtimeclass.yaml").read_text())
    # the publisher's own Deployment never runs here (no kubelet): the command does its job
    cluster.kubectl("scale", "-n", "peerpods-system", "deployment/peerpods-dra-publisher",
                    "--replicas=0")  # fmt: skip
    cluster.create_fake_node(
        NODE, labels={"node.kubernetes.io/peerpods": "true"}, extra={"kata.peerpods.io/vm": "100"}
    )
    published = peerpods(
        "dra", "publish", "--provider", "aws", "--region", "us-east-1", "--once",
        "--gpu-limit", "h100=2", kubeconfig=cluster.admin_kubeconfig,
    )  # fmt: skip
    assert "generation 1" in published.stdout, published.stderr
    try:
        yield cluster
    finally:
        peerpods("dra", "publish", "--provider", "aws", "--delete",
                 kubeconfig=cluster.admin_kubeconfig, check=False)  # fmt: skip
        cluster.kubectl("delete", "-k", str(ROOT / "config" / "deploy" / "dra"), "--wait=false",
                        check=False)  # fmt: skip
        cluster.kubectl("delete", "node", NODE, check=False)


def test_published_slices_form_a_complete_pool_with_the_nvidia_vocabulary(dra: KubeCluster) -> None:
    items = [s for s in dra.api_get(SLICES)["items"] if s["spec"]["driver"] == "gpu.peerpods.io"]
    assert items
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in items}
    assert counts == {len(items)} and {s["spec"]["pool"]["generation"] for s in items} == {1}
    devices = [d for s in items for d in s["spec"].get("devices") or []]
    assert all("productName" in d["attributes"] and "memory" in d["capacity"] for d in devices)
    assert sum(d["attributes"]["model"]["string"] == "h100-80gb" for d in devices) == 2
    mapped = dra.api_get("/apis/resource.k8s.io/v1/deviceclasses/nvidia-gpu.gpu.peerpods.io")
    assert mapped["spec"]["extendedResourceName"] == "nvidia.com/gpu"


def test_an_nvidia_gpu_pod_is_admitted_asking_bound_and_its_claim_allocated(
    dra: KubeCluster,
) -> None:
    ns = namespace(dra, "dra-plain")
    created = create(dra, ns, gpu_pod("one-gpu"))
    limits = created["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1" and limits["kata.peerpods.io/vm"] == "1"
    assert "cpu" not in created["spec"]["containers"][0]["resources"].get("requests", {})
    wait_for("the pod to be bound", lambda: bound(dra, ns, "one-gpu"))
    status = wait_for(
        "the extended-resource claim",
        lambda: pod(dra, ns, "one-gpu").get("status", {}).get("extendedResourceClaimStatus"),
    )
    name = status["resourceClaimName"]
    assert name.startswith("one-gpu-extended-resources-")
    results = wait_for("its allocation", lambda: allocated(dra, ns, name))
    assert [r["driver"] for r in results] == ["gpu.peerpods.io"]
    assert pod(dra, ns, "one-gpu")["spec"]["nodeName"] == NODE


def test_a_namespace_quota_on_nvidia_gpu_refuses_the_second_pod(dra: KubeCluster) -> None:
    ns = namespace(dra, "dra-quota")
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu"},
             "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}}  # fmt: skip
    dra.api_request("POST", f"/api/v1/namespaces/{ns}/resourcequotas", quota)
    # no kube-controller-manager here: the quota's status is written as its controller would
    status = {"status": {"hard": {"requests.nvidia.com/gpu": "1"},
                         "used": {"requests.nvidia.com/gpu": "0"}}}  # fmt: skip
    dra.api_request("PATCH", f"/api/v1/namespaces/{ns}/resourcequotas/gpu/status", status)
    create(dra, ns, gpu_pod("first"))
    with pytest.raises(urllib.error.HTTPError) as refused:
        create(dra, ns, gpu_pod("second"))
    assert refused.value.code == 403
    assert "exceeded quota" in refused.value.read().decode()


def test_a_limit_of_two_h100s_schedules_two_of_three_h100_claims(dra: KubeCluster) -> None:
    ns = namespace(dra, "dra-limit")
    for i in range(3):
        create(dra, ns, h100_claim(f"h100-{i}"))
        create(dra, ns, gpu_pod(f"train-{i}", gpus=0, claim=f"h100-{i}"))
    wait_for(
        "two pods bound and one unschedulable",
        lambda: (
            sum(bound(dra, ns, f"train-{i}") for i in range(3)) == 2
            and sum(unschedulable(dra, ns, f"train-{i}") for i in range(3)) == 1
        ),
        90,
    )
    time.sleep(3)  # and it stays so
    assert sum(bound(dra, ns, f"train-{i}") for i in range(3)) == 2
    devices = {r["device"] for i in range(3) for r in allocated(dra, ns, f"h100-{i}")}
    assert devices == {"nvidia-h100-80gb-hbm3-0", "nvidia-h100-80gb-hbm3-1"}
    release(dra, ns, [f"train-{i}" for i in range(3)], [f"h100-{i}" for i in range(3)])


def release(cluster: KubeCluster, ns: str, pods: list[str], claims: list[str]) -> None:
    """Free the devices as kube-controller-manager would (none runs here): the pods go, then
    their claims, whose finalizer only that controller would lift."""
    for name in pods:
        cluster.kubectl("delete", "pod", "-n", ns, name, "--grace-period=0", "--force",
                        check=False)  # fmt: skip
    for name in claims:
        path = f"{CLAIMS.format(ns=ns)}/{name}"
        cluster.api_request("PATCH", path, {"metadata": {"finalizers": None}})
        cluster.kubectl("delete", "resourceclaim", "-n", ns, name, "--wait=false", check=False)
    wait_for(
        "the claims to be gone",
        lambda: not any(c["metadata"]["name"] in claims
                        for c in cluster.api_get(CLAIMS.format(ns=ns))["items"]),
        30,
    )  # fmt: skip


def test_a_claim_for_40gi_or_more_gets_such_an_h100_and_plan_names_it(
    dra: KubeCluster, tmp_path: Path
) -> None:
    ns = namespace(dra, "dra-memory")
    big = "device.capacity['gpu.peerpods.io'].memory.compareTo(quantity('40Gi')) >= 0"
    claim = h100_claim("big", big)
    workload = gpu_pod("big", gpus=0, claim="big")
    create(dra, ns, claim)
    create(dra, ns, workload)
    results = wait_for("the claim's allocation", lambda: allocated(dra, ns, "big"), 90)
    device = device_of(dra, results[0])
    assert device["attributes"]["productName"]["string"] == "NVIDIA H100 80GB HBM3"
    assert int(device["capacity"]["memory"]["value"]) >= 40 * 2**30
    manifest = tmp_path / "pod.yaml"
    claim_doc = {**claim, "metadata": {"name": "big", "namespace": ns}}
    manifest.write_text(yaml.safe_dump_all([claim_doc, workload]))
    planned = peerpods("plan", "--dra-driver", "--dra-gpu-limit", "h100=2", "--output", "json",
                       str(manifest), kubeconfig=dra.admin_kubeconfig)  # fmt: skip
    report = json.loads(planned.stdout)
    assert report["allocated"][0]["model"] == device["attributes"]["model"]["string"]
    assert report["allocated"][0]["productName"] == "NVIDIA H100 80GB HBM3"
