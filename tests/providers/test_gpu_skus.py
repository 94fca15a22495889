"""GPU facts per instance type: the product name its GPUs report and the memory its cloud reports.

Expected answers come from public facts: NVIDIA's product names as the driver reports them
("NVIDIA A100-SXM4-80GB" for SXM4 parts, "NVIDIA A100 80GB PCIe" for the PCIe card, "NVIDIA
B300 SXM6 AC" for HGX B300), the clouds' size pages (Azure NC A100 v4 carries PCIe A100 80GB
cards, ND A100 v4 SXM4 ones; AWS p4de and GCP a2-ultragpu SXM4 ones), AWS DescribeInstanceTypes'
GPU memory (A10G and L4 report 22888 MiB, L40S 45776) and GCP's G2 page (L4 with 24 GB).
Memory requests are binary units compared with the MiB reported for the type.
"""

from __future__ import annotations

from typing import Any

import pytest

from adaptor.cli.pod_plan import plan_manifest
from providers.core.quantity import to_mib
from providers.core.request import InstanceRequest
from providers.core.selection import select
from providers.core.skus import product_key, product_name
from providers.core.snapshots import load_catalog

PCIE = "NVIDIA A100 80GB PCIe"
SXM4 = "NVIDIA A100-SXM4-80GB"


@pytest.mark.parametrize(
    ("cloud", "instance_type", "model", "product"),
    [
        ("azure", "Standard_NC24ads_A100_v4", "a100-80gb", PCIE),
        ("azure", "Standard_NC96ads_A100_v4", "a100-80gb", PCIE),
        ("azure", "Standard_ND96amsr_A100_v4", "a100-80gb", SXM4),
        ("aws", "p4de.24xlarge", "a100-80gb", SXM4),
        ("gcp", "a2-ultragpu-1g", "a100-80gb", SXM4),
        ("aws", "p6-b300.48xlarge", "b300", "NVIDIA B300 SXM6 AC"),
        ("aws", "p5.4xlarge", "h100-80gb", "NVIDIA H100 80GB HBM3"),
        ("azure", "Standard_NC40ads_H100_v5", "h100-nvl", "NVIDIA H100 NVL"),
    ],
)
def test_product_name_per_sku(cloud: str, instance_type: str, model: str, product: str) -> None:
    assert product_name(cloud, instance_type, model) == product


def test_product_key() -> None:
    assert product_key(PCIE) == "nvidia-a100-80gb-pcie"
    assert product_key(SXM4) == "nvidia-a100-sxm4-80gb"


def _claim_pod(selector: str, count: int) -> list[dict[str, Any]]:
    gpu_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {
            "selectors": [
                {"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}
            ]
        },
    }
    body = {
        "deviceClassName": "gpu.nvidia.com",
        "count": count,
        "selectors": [{"cel": {"expression": selector}}],
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "gpus", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "g", "exactly": body}]}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "runtimeClassName": "kata-remote",
            "resourceClaims": [{"name": "c", "resourceClaimName": "gpus"}],
            "containers": [{"name": "m", "image": "x", "resources": {"claims": [{"name": "c"}]}}],
        },
    }
    return [gpu_class, claim, pod]


@pytest.mark.parametrize(
    ("provider", "product", "count", "expected"),
    [
        # two PCIe A100 80GB: NC48ads A100 v4, never the SXM4 ND96amsr
        ("azure", PCIE, 2, "Standard_NC48ads_A100_v4"),
        ("azure", SXM4, 2, "Standard_ND96amsr_A100_v4"),
        ("aws", SXM4, 2, "p4de.24xlarge"),
        ("gcp", SXM4, 2, "a2-ultragpu-2g"),
    ],
)
def test_product_name_selector_picks_the_form(
    provider: str, product: str, count: int, expected: str
) -> None:
    selector = f"device.attributes['gpu.nvidia.com'].productName == '{product}'"
    report = plan_manifest(_claim_pod(selector, count), provider)
    assert report.ok, report.failure
    assert report.selection is not None and report.selection.selected.name == expected
    # the form travels through the annotation contract to the adaptor
    assert report.intent is not None
    others = {
        t.name for t in report.selection.catalog.types if t.gpu and t.gpu.model == "a100-80gb"
    }
    if (
        len({product_name(provider, n, "a100-80gb") for n in others}) > 1
    ):  # the cloud sells both forms: the contract narrows to this one
        assert report.intent.gpu.products == (product_key(product),)


def test_pcie_a100_is_not_sold_on_aws() -> None:
    selector = f"device.attributes['gpu.nvidia.com'].productName == '{PCIE}'"
    report = plan_manifest(_claim_pod(selector, 1), "aws")
    assert report.failure is not None and report.failure.stage == "admission"
    assert "no catalog device matches" in report.failure.message


@pytest.mark.parametrize(
    ("provider", "expected_family", "excluded_models"),
    [
        # AWS reports 22888 MiB for A10G and L4: short of 23Gi, so the L40S (45776 MiB)
        ("aws", "g6e", {"a10g", "l4"}),
        # GCP's L4 is the same GPU, 22888 MiB there too: an A100 serves 23Gi
        ("gcp", "a2", {"l4"}),
        ("azure", None, set()),
    ],
)
def test_memory_requests_compare_binary_units_with_reported_mib(
    provider: str, expected_family: str | None, excluded_models: set[str]
) -> None:
    catalog = load_catalog(
        provider, {"aws": "us-east-1", "azure": "eastus", "gcp": "us-central1"}[provider]
    )  # type: ignore[arg-type]
    need = to_mib("23Gi")
    selection = select(catalog, InstanceRequest(gpus=1, gpu_memory_mib=need))
    chosen = selection.selected
    assert chosen.gpu_memory_mib >= need
    assert chosen.gpu_model not in excluded_models
    if expected_family is not None:
        assert chosen.instance_type.family == expected_family
    for candidate in selection.candidates:
        assert candidate.gpu_memory_mib >= need
    # the same figure through a DRA capacity selector (the MiB the cloud reports for the type)
    selector = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('23Gi')) >= 0"
    report = plan_manifest(_claim_pod(selector, 1), provider)
    assert report.ok and report.selection is not None, report.failure
    assert report.selection.selected.gpu_memory_mib >= need


def test_products_round_trip_the_annotation_contract() -> None:
    from providers.core.contract import GpuIntent, decode_gpu_model, encode_gpu_model
    from providers.core.errors import AnnotationError

    intent = GpuIntent(gpus=2, models=("a100-80gb",), products=("nvidia-a100-80gb-pcie",))
    encoded = encode_gpu_model(intent)
    assert encoded == "v1:m=a100-80gb;p=nvidia-a100-80gb-pcie"
    assert decode_gpu_model(encoded, 2) == intent
    with pytest.raises(AnnotationError, match="product"):
        decode_gpu_model("v1:p=NVIDIA A100", 1)


def test_createvm_reads_the_form_and_selection_enforces_it() -> None:
    # what the adaptor does at CreateVM/StartVM with the webhook's annotations
    from providers.core.contract import DEFAULT_GPU_MODEL, DEFAULT_GPUS, parse_vm_annotations

    annotations = {
        "io.kubernetes.cri.sandbox-name": "p",
        "io.kubernetes.cri.sandbox-namespace": "default",
        DEFAULT_GPUS: "2",
        DEFAULT_GPU_MODEL: "v1:m=a100-80gb;p=nvidia-a100-80gb-pcie",
    }
    request = parse_vm_annotations(annotations).to_request()
    assert request.gpu_products == ("nvidia-a100-80gb-pcie",)
    selection = select(load_catalog("azure", "eastus"), request)
    assert [c.name for c in selection.candidates][:1] == ["Standard_NC48ads_A100_v4"]
    assert all(product_name("azure", c.name, "a100-80gb") == PCIE for c in selection.candidates)
    sxm = next(r for r in selection.rejections if r.name == "Standard_ND96amsr_A100_v4")
    assert "NVIDIA A100-SXM4-80GB" in sxm.reason
