"""Issue 14, categories 5-7 on the bundled catalogs: coverage, prices everywhere, provisioning.

Expected answers follow from public facts, named at each case: the clouds' instance/size/machine
type tables (GPU model and count, vCPUs, architecture, RDMA), their list prices (AWS Price List,
Azure Retail Prices, GCP Cloud Billing Catalog) and GCP's accelerator-optimized machine docs
(A3 High 1/2/4-GPU shapes: Spot or Flex-start only).
"""

from __future__ import annotations

from typing import Any

import pytest

from providers.clouds.loaders import aws
from providers.core import snapshots
from providers.core.contract import GpuIntent, VMIntent
from providers.core.errors import InvalidRequest, NoMatch
from providers.core.estimates import catalog_gpu_rates, estimate_price
from providers.core.request import InstanceRequest
from providers.core.selection import Candidate, select


def top(cloud: str, **fields: Any) -> Candidate:
    return select(snapshots.load_catalog(cloud), InstanceRequest(**fields)).selected


# --- category 5: the GPU families the clouds sell --------------------------------------------

# (cloud, type, GPU model, GPUs, architecture, RDMA) from the public type tables
FAMILIES = [
    ("aws", "p5e.48xlarge", "h200", 8, "x86_64", "efa"),
    ("aws", "p6-b300.48xlarge", "b300", 8, "x86_64", "efa"),
    ("aws", "p6e-gb200.36xlarge", "gb200", 4, "arm64", "efa"),
    ("azure", "Standard_ND96isr_MI300X_v5", "mi300x", 8, "x86_64", "infiniband"),
    ("azure", "Standard_NCC40ads_H100_v5", "h100-nvl", 1, "x86_64", ""),
    ("azure", "Standard_ND128isr_NDR_GB200_v6", "gb200", 4, "arm64", "infiniband"),
    ("gcp", "a4-highgpu-8g", "b200", 8, "x86_64", "roce"),
    ("gcp", "a4x-highgpu-4g", "gb200", 4, "arm64", "roce"),
    ("gcp", "a3-ultragpu-8g", "h200", 8, "x86_64", "roce"),
    ("gcp", "g4-standard-48", "rtx-pro-6000", 1, "x86_64", ""),
]


@pytest.mark.parametrize(("cloud", "name", "model", "count", "arch", "rdma"), FAMILIES)
def test_bundled_catalogs_carry_the_families_the_clouds_sell(
    cloud: str, name: str, model: str, count: int, arch: str, rdma: str
) -> None:
    t = snapshots.load_catalog(cloud).by_name()[name]
    assert t.gpu is not None and (t.gpu.model, t.gpu.count) == (model, count)
    assert (t.arch, t.rdma) == (arch, rdma)
    assert t.zones


@pytest.mark.parametrize(
    ("cloud", "fields", "expected"),
    [
        ("aws", {"gpus": 1, "gpu_models": ("b300",)}, "p6-b300.48xlarge"),
        # P6e-GB200, A4X, A4 and A3 Ultra are sold through reserved capacity (docs/gpus.md):
        # candidates when the operator names a capacity block or reservation
        ("aws", {"gpus": 4, "gpu_models": ("gb200",), "arch": "arm64", "reservation": "cr-1"},
         "p6e-gb200.36xlarge"),
        ("azure", {"gpus": 4, "gpu_models": ("gb200",), "arch": "arm64"},
         "Standard_ND128isr_NDR_GB200_v6"),
        ("gcp", {"gpus": 4, "gpu_models": ("gb200",), "arch": "arm64", "reservation": "r-1"},
         "a4x-highgpu-4g"),
        ("gcp", {"gpus": 8, "gpu_models": ("b200",), "provisioning": "spot"}, "a4-highgpu-8g"),
        ("gcp", {"gpus": 1, "gpu_models": ("rtx-pro-6000",)}, "g4-standard-48"),
        # GPUDirect RDMA over RoCE (A3 Ultra) counts as RDMA: an 8x H200 RDMA pod fits on GCP
        ("gcp", {"gpus": 8, "gpu_models": ("h200",), "rdma": True, "reservation": "r-1"},
         "a3-ultragpu-8g"),
    ],
)  # fmt: skip
def test_new_families_are_selected(cloud: str, fields: dict[str, Any], expected: str) -> None:
    assert top(cloud, **fields).name == expected


def test_an_amd_gpu_is_never_an_nvidia_answer_and_a_pod_naming_it_is_refused() -> None:
    # nvidia.com/gpu without a model: NVIDIA only, so never the MI300X (AMD) type
    azure = select(snapshots.load_catalog("azure"), InstanceRequest(gpus=8))
    assert all(c.gpu_model != "mi300x" for c in azure.candidates)
    # `peerpods select --gpu-model mi300x` names it: it is in the catalog ...
    assert top("azure", gpus=8, gpu_models=("mi300x",)).name == "Standard_ND96isr_MI300X_v5"
    # ... but a pod's GPUs are NVIDIA devices: CreateVM's intent refuses it, saying why
    intent = VMIntent(pod_name="p", pod_namespace="n", gpu=GpuIntent(gpus=8, models=("mi300x",)))
    with pytest.raises(InvalidRequest, match=r"AMD.*NVIDIA devices"):
        intent.to_request()
    # among alternatives (a DRA selector any GPU memory matches), only the NVIDIA ones remain
    either = VMIntent(
        pod_name="p", pod_namespace="n", gpu=GpuIntent(gpus=1, models=("mi300x", "h100"))
    )
    assert either.to_request().gpu_models == ("h100",)


def test_a_gpu_nvidia_com_claim_never_matches_the_amd_type() -> None:
    from adaptor.cli.pod_plan import plan_manifest
    from tests.providers.test_gpu_skus import _claim_pod

    # the MI300X (192 GB, AMD) is Azure's only GPU with 190Gi: no gpu.nvidia.com device has it
    selector = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('190Gi')) >= 0"
    report = plan_manifest(_claim_pod(selector, 1), "azure")
    assert report.failure is not None and report.failure.stage == "admission"
    assert "no catalog device matches" in report.failure.message


def test_g7_rtx_pro_4500_loads_and_an_unknown_gpu_is_recorded_not_dropped() -> None:
    # DescribeInstanceTypes record shape; G7's GPU is the RTX PRO 4500 Blackwell Server Edition
    # with 32 GB (AWS's G7 announcement), the name AWS reports for it as in the G7e's case.
    record: dict[str, Any] = {
        "InstanceType": "g7.8xlarge",
        "VCpuInfo": {"DefaultVCpus": 32},
        "MemoryInfo": {"SizeInMiB": 131072},
        "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
        "GpuInfo": {"Gpus": [{"Name": "RTX PRO Server 4500", "Manufacturer": "NVIDIA",
                              "Count": 1, "MemoryInfo": {"SizeInMiB": 32768}}]},
    }  # fmt: skip
    g7 = aws.instance_type(record, ("us-east-1a",))
    assert g7 is not None and g7.gpu is not None and g7.gpu.model == "rtx-pro-4500"
    record["GpuInfo"]["Gpus"][0]["Name"] = "RTX PRO Server 9900"  # a GPU newer than this code
    future = aws.instance_type(record, ("us-east-1a",))
    assert future is not None and future.gpu is not None
    assert (future.gpu.model, future.gpu.count, future.gpu.memory_mib) == (
        "unknown-rtx-pro-9900",
        1,
        32768,
    )


# --- category 6: prices everywhere -----------------------------------------------------------


@pytest.mark.parametrize(
    ("cloud", "region", "name", "price"),
    [
        ("aws", "us-east-1", "p5.48xlarge", 55.04),  # AWS Price List
        ("aws", "us-west-2", "g6.xlarge", 0.8048),  # Oregon lists Virginia's rate
        ("azure", "eastus", "Standard_NC24ads_A100_v4", 3.673),  # Azure Retail Prices
        ("azure", "eastus", "Standard_ND96isr_H100_v5", 98.32),
        ("gcp", "us-central1", "a2-highgpu-1g", 3.673385),  # machine + 1 A100 40GB
        ("gcp", "us-central1", "g2-standard-4", 0.706840),  # machine + 1 L4
    ],
)
def test_every_bundled_region_has_list_prices(
    cloud: str, region: str, name: str, price: float
) -> None:
    catalog = snapshots.load_catalog(cloud, region)
    assert catalog.by_name()[name].price_per_hour == pytest.approx(price, abs=1e-4)
    gpu_types = [t for t in catalog.types if t.gpu is not None]
    priced = [t for t in gpu_types if t.price_per_hour is not None]
    assert len(priced) >= len(gpu_types) / 2, "most GPU types are priced"


def test_gcp_n1_costs_the_machine_plus_its_attached_gpus() -> None:
    # GCP bills an N1 VM as its machine type plus each attached GPU: one T4 at $0.35/h on
    # n1-standard-4 (4 x $0.031611 + 15 GiB x $0.004237 = $0.189999/h)
    chosen = top("gcp", gpus=1, gpu_models=("t4",), vcpus=4)
    assert chosen.name == "n1-standard-4" and chosen.attach_gpus == 1
    assert chosen.price_per_hour == pytest.approx(0.189999 + 0.35, abs=1e-5)
    assert not chosen.price_estimated


def test_gcp_attaches_the_cheapest_gpu_that_serves() -> None:
    # any NVIDIA GPU, 5 vCPUs, 16.1 GiB: an N1 with one T4 ($0.35/h) beats one P4 ($0.60/h) and
    # a G2 with its L4 (g2-standard-8 $0.8536/h): n1-standard-8 $0.38 + $0.35
    chosen = top("gcp", gpus=1, vcpus=5, memory_mib=16512)
    assert (chosen.name, chosen.gpu_model, chosen.attach_gpus) == ("n1-standard-8", "t4", 1)
    assert chosen.price_per_hour == pytest.approx(8 * 0.031611 + 30 * 0.004237 + 0.35, abs=1e-5)


def test_an_unpriced_type_ranks_by_an_estimate_from_its_gpus_not_last() -> None:
    bundled = snapshots.load_catalog("gcp")
    # A3 Mega's list price is bundled now (host $9.46006 + 8 x H100 Mega $10.3443, skypilot-catalog
    # catalogs/v8/gcp/vms.csv @006059e0); without it, it is estimated from its GPUs
    assert bundled.by_name()["a3-megagpu-8g"].price_per_hour == 92.2143
    unpriced = {"price_per_hour": None, "spot_price_per_hour": None}
    types = tuple(
        t.model_copy(update=unpriced) if t.name == "a3-megagpu-8g" else t for t in bundled.types
    )
    gcp = bundled.model_copy(update={"types": types})
    mega = gcp.by_name()["a3-megagpu-8g"]
    # estimated at the region's own H100 list price (GCP prices GPUs apart from machines)
    selection = select(gcp, InstanceRequest(gpus=8, gpu_models=("h100",)))
    by = {c.name: c for c in selection.candidates}
    assert by["a3-megagpu-8g"].price_estimated
    rates = {**catalog_gpu_rates(gcp.types), **gcp.gpu_prices}
    estimate = estimate_price(mega, rates=rates)
    assert by["a3-megagpu-8g"].price_per_hour == estimate
    # GCP's H100 list price per GPU ($9.79655/h) on a host at the reference rates
    assert estimate == pytest.approx(208 * 0.0315 + 1872 * 0.0042 + 8 * 9.79655, abs=1e-3)
    assert "estimate" in by["a3-megagpu-8g"].reasons[1]
    # Azure's ND H200 v5 has no bundled price: it ranks between priced 8-GPU types by its
    # estimate, not after every priced type
    azure = select(snapshots.load_catalog("azure"), InstanceRequest(gpus=8, gpu_memory_mib=81920))
    names = [c.name for c in azure.candidates]
    assert names.index("Standard_ND96isr_H200_v5") < names.index("Standard_ND96isr_H100_v5")


# --- category 7: provisioning models ---------------------------------------------------------


def test_spot_or_flex_start_only_shapes_are_no_on_demand_candidates() -> None:
    gcp = snapshots.load_catalog("gcp")
    for name in ("a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g"):
        assert gcp.by_name()[name].provisioning == ("spot", "flex-start")
    assert gcp.by_name()["a3-highgpu-8g"].on_demand
    selection = select(gcp, InstanceRequest(gpus=1, gpu_models=("h100",)))
    assert selection.selected.gpus == 8  # the smallest H100 shape sold on demand
    rejected = {r.name: r.reason for r in selection.rejections}
    assert rejected["a3-highgpu-1g"] == "sold only as spot or flex-start, not on-demand"
    # a Spot pod may have it
    spot = select(gcp, InstanceRequest(gpus=1, gpu_models=("h100",), provisioning="spot"))
    assert spot.selected.name == "a3-highgpu-1g"
    only = InstanceRequest(gpus=1, gpu_models=("h100",), instance_type="a3-highgpu-1g")
    with pytest.raises(NoMatch, match="not sold on-demand"):
        _ = select(gcp, only).selected


@pytest.mark.parametrize(
    ("cloud", "expected"),
    [("aws", "p5.4xlarge"), ("azure", "Standard_NC40ads_H100_v5")],
)
def test_aws_and_azure_sell_one_h100_on_demand(cloud: str, expected: str) -> None:
    # p5.4xlarge (AWS) and NC40ads_H100_v5 (Azure) are sold on demand
    assert top(cloud, gpus=1, gpu_models=("h100",)).name == expected
