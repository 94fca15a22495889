# ruff: noqa: E501
"""DRA claims through the live webhook, with claims, templates and device classes read from a
fake Kubernetes API server (KUBECONFIG pointing at it) and selectors evaluated by CEL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from providers.clouds.kube import KubeClient, kubeconfig_config
from providers.core.catalog import Catalog
from providers.core.contract import (
    DEFAULT_GPU_MODEL,
    DEFAULT_GPUS,
    DEVICES,
    ContainerPlan,
    GpuIntent,
    decode_gpu_model,
)
from tests.webhook.conftest import Running, admit_via, container, pod, post, review, serve
from tests.webhook.fakekube import FakeKube
from webhook import KubeResolver, Settings

CLASSES = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com}
spec:
  selectors:
    - cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: mig.nvidia.com}
spec:
  selectors:
    - cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}
"""


def template(
    name: str, requests: list[dict[str, Any]], constraints: list[Any] | None = None
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": {"devices": devices}}}  # fmt: skip


def exactly(
    name: str, cls: str = "gpu.nvidia.com", *selectors: str, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls, **extra}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": body}


TEMPLATES = [
    template("one-gpu", [exactly("gpu")]),
    template("four-mig", [
        exactly(f"m{i}", "mig.nvidia.com", "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'")
        for i in range(4)
    ], [{"requests": ["m0", "m1", "m2", "m3"], "matchAttribute": "gpu.nvidia.com/parentUUID"}]),
    template("eight-mig", [
        exactly(f"m{i}", "mig.nvidia.com", "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'")
        for i in range(3)
    ], [{"requests": [], "matchAttribute": "gpu.nvidia.com/parentUUID"}]),
    template("hopper", [exactly("gpu", "gpu.nvidia.com",
                                "device.attributes['gpu.nvidia.com'].productName.matches('H100|H200')")]),
    template("big-memory", [exactly("gpu", "gpu.nvidia.com",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0", count=2)]),
    template("first-available", [{"name": "gpu", "firstAvailable": [
        {"name": "b200", "deviceClassName": "gpu.nvidia.com",
         "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName.matches('B200')"}}]},
        {"name": "a100", "deviceClassName": "gpu.nvidia.com",
         "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].architecture == 'Ampere' && device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('30Gi'))"}}]},
    ]}]),
    template("share-10g", [exactly("gpu", "gpu.nvidia.com", capacity={"requests": {"memory": "10Gi"}})]),
    template("mig-share-10g", [exactly("gpu", "mig.nvidia.com", capacity={"requests": {"memory": "10Gi"}})]),
    template("share-2g", [exactly("gpu", "gpu.nvidia.com",
        "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA L4'",
        capacity={"requests": {"memory": "2Gi"}})]),
    template("by-uuid", [exactly("gpu", "gpu.nvidia.com", "device.attributes['gpu.nvidia.com'].uuid == 'GPU-1234'")]),
    template("bad-cel", [exactly("gpu", "gpu.nvidia.com", "device.attributes[")]),
    template("nothing", [exactly("gpu", "gpu.nvidia.com", "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA GB300'")]),
    template("all-h100", [exactly("gpu", "gpu.nvidia.com", "device.attributes['gpu.nvidia.com'].productName.matches('H100')",
                                  allocationMode="All")]),
    template("sm90", [exactly("gpu", "gpu.nvidia.com",
        "device.attributes['gpu.nvidia.com'].cudaComputeCapability.compareTo(semver('9.0.0')) >= 0")]),
    template("unknown-class", [exactly("gpu", "tpu.example.com")]),
    template("broken-api", [exactly("gpu")]),
]  # fmt: skip

CLAIM = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": "shared-a10g", "namespace": "default"},
         "spec": {"devices": {"requests": [exactly("gpu", "gpu.nvidia.com",
                  "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A10G'")]}}}  # fmt: skip


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeKube, Path]]:
    with FakeKube() as fake:
        fake.add_yaml(CLASSES)
        fake.add(*TEMPLATES, CLAIM)
        fake.failures[
            "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates/broken-api"
        ] = 500
        yield fake, fake.kubeconfig(tmp_path_factory.mktemp("kube"))


@pytest.fixture(scope="module")
def dra(
    kube: tuple[FakeKube, Path], tls_dir: Path, ca: trustme.CA, catalog: Catalog
) -> Iterator[Running]:
    _, kubeconfig = kube
    mp = pytest.MonkeyPatch()
    mp.setenv("KUBECONFIG", str(kubeconfig))
    mp.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    try:
        yield from serve(tls_dir, ca, Settings(), catalog, KubeResolver(ttl_seconds=60))
    finally:
        mp.undo()


def claim_pod(
    *claims: tuple[str, str], containers: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    entries = [{"name": n, "resourceClaimTemplateName": t} for n, t in claims]
    cs = containers or [container("main", resources_claims=None)]
    for c in cs:
        c.pop("resources_claims", None)
    if containers is None:
        cs[0]["resources"] = {"claims": [{"name": n} for n, _ in claims]}
    return pod(*cs, resourceClaims=entries)


def _contract(p: dict[str, Any]) -> tuple[GpuIntent, ContainerPlan]:
    a = p["metadata"]["annotations"]
    intent = decode_gpu_model(a.get(DEFAULT_GPU_MODEL, ""), int(a.get(DEFAULT_GPUS, "0")))
    return intent, ContainerPlan.decode(a[DEVICES])


def _admitted(dra: Running, p: dict[str, Any]) -> tuple[GpuIntent, ContainerPlan, dict[str, Any]]:
    _, mutated = admit_via(dra, p)
    assert "resourceClaims" not in mutated["spec"]
    assert all("claims" not in (c.get("resources") or {}) for c in mutated["spec"]["containers"])
    intent, plan = _contract(mutated)
    return intent, plan, mutated


def _denied(dra: Running, p: dict[str, Any]) -> str:
    response = post(dra, review(p))
    assert response["allowed"] is False, response
    assert "patch" not in response
    message: str = response["status"]["message"]
    return message


def test_one_gpu_template(dra: Running) -> None:
    intent, plan, _ = _admitted(dra, claim_pod(("g", "one-gpu")))
    assert intent.gpus == 1 and intent.models == ()
    assert plan.containers == {"main": ("claim-g-gpu",)}


def test_two_containers_share_one_claim(dra: Running) -> None:
    cs = [container("a"), container("b"), container("c")]
    cs[0]["resources"] = {"claims": [{"name": "shared"}]}
    cs[1]["resources"] = {"claims": [{"name": "shared", "request": "gpu"}]}
    p = pod(*cs, resourceClaims=[{"name": "shared", "resourceClaimName": "shared-a10g"}])
    intent, plan, _ = _admitted(dra, p)
    assert intent.gpus == 1 and intent.models == ("a10g",)
    assert plan.containers == {"a": ("claim-shared-gpu",), "b": ("claim-shared-gpu",)}
    assert len(plan.units) == 1


def test_four_mig_slices_on_one_gpu(dra: Running) -> None:
    intent, plan, _ = _admitted(dra, claim_pod(("m", "four-mig")))
    assert intent.gpus == 0 and intent.mig == {"1g.10gb": 4}
    # 1g.10gb exists on A100-40GB (2 slots, 4 fit), A100-80GB and H100 (1 slot, 7 fit)
    assert set(intent.models) <= {"a100-40gb", "h100-80gb"}
    assert {u.profile for u in plan.units} == {"1g.10gb"} and len(plan.units) == 4


def test_mig_slices_that_cannot_share_one_gpu_denied(dra: Running) -> None:
    message = _denied(dra, claim_pod(("m", "eight-mig")))
    assert "3g.40gb x3" in message and "one GPU" in message


def test_product_name_regex(dra: Running) -> None:
    intent, _, _ = _admitted(dra, claim_pod(("g", "hopper")))
    assert intent.models == ("h100-80gb",) and intent.gpus == 1


def test_memory_compare_to(dra: Running) -> None:
    intent, plan, _ = _admitted(dra, claim_pod(("g", "big-memory")))
    assert intent.gpus == 2 and set(intent.models) == {"a100-40gb", "h100-80gb"}
    assert plan.units[0].models == ("a100-40gb", "h100-80gb")


def test_first_available_takes_the_first_servable(dra: Running) -> None:
    intent, _, _ = _admitted(dra, claim_pod(("g", "first-available")))
    assert intent.models == ("a100-40gb",)


def test_capacity_request_through_the_gpu_class_is_never_mig(dra: Running) -> None:
    # gpu.nvidia.com admits only type == 'gpu': a whole GPU of >= 10 GiB or an L4 share rounded
    # up to the next share the L4's requestPolicy offers (11444 MiB), whichever ranks first
    intent, plan, _ = _admitted(dra, claim_pod(("g", "share-10g")))
    assert intent.mig == {} and plan.units[0].kind == "gpu" and intent.gpus == 1
    if intent.fractional:
        assert intent.models == ("l4",) and intent.memory_mib == 11444
    else:
        assert intent.memory_mib == 10240 and "l4" not in intent.models


def test_capacity_request_through_the_mig_class_is_a_mig_slice(dra: Running) -> None:
    intent, plan, _ = _admitted(dra, claim_pod(("g", "mig-share-10g")))
    assert intent.mig == {"1g.10gb": 1} and intent.gpus == 0
    assert plan.units[0].kind == "mig"


def test_capacity_request_served_by_fractional_gpu(dra: Running) -> None:
    intent, _, _ = _admitted(dra, claim_pod(("g", "share-2g")))
    assert intent.fractional and intent.gpus == 1 and intent.models == ("l4",)
    # 2Gi rounded up to the smallest L4 share on offer (1/8: 2861 MiB), KEP-5075 validValues
    assert intent.memory_mib == 2861


def test_compute_capability_semver(dra: Running) -> None:
    intent, _, _ = _admitted(dra, claim_pod(("g", "sm90")))
    assert intent.models == ("h100-80gb",)


def test_allocation_mode_all_means_every_gpu_of_the_vm(dra: Running) -> None:
    response = post(dra, review(claim_pod(("g", "all-h100"))))
    assert response["allowed"] is True
    assert any("allocationMode All" in w for w in response.get("warnings", []))
    intent, _, _ = _admitted(dra, claim_pod(("g", "all-h100")))
    assert intent.gpus == 8


def test_post_boot_attribute_denied(dra: Running) -> None:
    message = _denied(dra, claim_pod(("g", "by-uuid")))
    assert "gpu.nvidia.com/uuid" in message and "after the pod VM boots" in message


def test_bad_cel_and_no_match_denied(dra: Running) -> None:
    assert "invalid CEL expression" in _denied(dra, claim_pod(("g", "bad-cel")))
    assert "no catalog device matches" in _denied(dra, claim_pod(("g", "nothing")))


def test_missing_objects_and_api_errors_denied(dra: Running) -> None:
    assert "ResourceClaimTemplate default/absent not found" in _denied(
        dra, claim_pod(("g", "absent"))
    )
    assert "DeviceClass tpu.example.com not found" in _denied(
        dra, claim_pod(("g", "unknown-class"))
    )
    response = post(dra, review(claim_pod(("g", "broken-api"))))
    assert response["allowed"] is False and response["status"]["code"] == 503
    assert "HTTP 500" in response["status"]["message"]


def test_models_of_two_claims_must_agree(dra: Running) -> None:
    message = _denied(dra, claim_pod(("a", "hopper"), ("b", "first-available")))
    assert "one GPU model" in message


def test_lookups_are_cached(dra: Running, kube: tuple[FakeKube, Path]) -> None:
    fake, _ = kube
    _admitted(dra, claim_pod(("g", "hopper")))
    before = len(fake.requests)
    _admitted(dra, claim_pod(("g", "hopper")))
    assert len(fake.requests) == before


def test_lookup_cache_is_bounded(kube: tuple[FakeKube, Path]) -> None:
    """Tenants choose how many templates exist: the cache keeps the most recent few only."""
    fake, kubeconfig = kube
    client = KubeClient(kubeconfig_config({"KUBECONFIG": str(kubeconfig)}))
    resolver = KubeResolver(ttl_seconds=60, client=client, max_cached=2)
    for name in ("one-gpu", "hopper", "big-memory"):
        resolver.claim_template("default", name)
    before = len(fake.requests)
    resolver.claim_template("default", "big-memory")  # recent: cached
    assert len(fake.requests) == before
    resolver.claim_template("default", "one-gpu")  # dropped: read again
    assert len(fake.requests) == before + 1
