"""DRA translation on the bundled catalogs: the class is honoured, every match stays a candidate,
price decides, and KEP-5075 request policies round a share up.

Expected answers come from public facts: NVIDIA's DRA driver DeviceClasses (`gpu.nvidia.com`
admits `type == 'gpu'`, `mig.nvidia.com` `type == 'mig'`), NVIDIA's MIG user guide (profile
sizes), AWS's on-demand price list for us-east-1 (the bundled price CSV: g4dn.xlarge $0.526,
g6f.large $0.202, g6f.2xlarge $0.475, g6f.4xlarge $0.95, p5.4xlarge $6.88, p4d.24xlarge $21.96,
p6-b200.48xlarge $113.93), AWS's DescribeInstanceTypes (g6f shares of an L4: 1/8 = 2861 MiB,
1/4 = 5722, 1/2 = 11444) and Azure's NVadsA10 v5 sizes (1/6, 1/3, 1/2 of an A10), and the
Kubernetes API reference for CapacityRequestPolicy (validValues / validRange rounding).
"""

from __future__ import annotations

from typing import Any

import pytest

from adaptor.cli.pod_plan import PlanReport, plan_manifest
from providers.core.catalog import Catalog
from providers.core.contract import ContainerPlan
from providers.core.snapshots import load_catalog
from webhook._devices import RequestPolicy

Doc = dict[str, Any]
GPU_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == "
CLASSES = [
    {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"{kind}.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": GPU_CLASS + f"'{kind}'"}}]},
    }
    for kind in ("gpu", "mig")
]


def manifest(cls: str, *selectors: str, count: int = 1, memory: str = "") -> list[Doc]:
    body: Doc = {"deviceClassName": cls, "count": count}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if memory:
        body["capacity"] = {"requests": {"memory": memory}}
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "r", "exactly": body}]}}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "runtimeClassName": "kata-remote",
            "resourceClaims": [{"name": "c", "resourceClaimTemplateName": "t"}],
            "containers": [
                {"name": "main", "image": "x", "resources": {"claims": [{"name": "c"}]}}
            ],
        },
    }
    return [*CLASSES, template, pod]


def plan(provider: str, documents: list[Doc], catalog: Catalog | None = None) -> PlanReport:
    report = plan_manifest(documents, provider, catalog=catalog)
    assert report.ok, report.failure
    assert report.selection is not None and report.intent is not None
    return report


def unit_kind(report: PlanReport) -> str:
    assert report.container_plan is not None
    (unit,) = report.container_plan.units
    return unit.kind


def memory(selector_gib: int) -> str:
    return f"device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('{selector_gib}Gi')) >= 0"


# --- the class is honoured ---------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["aws", "azure", "gcp"])
def test_whole_gpu_class_with_a_capacity_request_is_never_mig(provider: str) -> None:
    report = plan(provider, manifest("gpu.nvidia.com", memory="10Gi"))
    assert unit_kind(report) == "gpu" and not report.intent.gpu.mig  # type: ignore[union-attr]
    chosen = report.selection.selected  # type: ignore[union-attr]
    assert chosen.mig_layout is None
    assert chosen.gpu_memory_mib >= 10 * 1024
    if provider == "aws":
        # cheapest GPU of >= 10 GiB: a T4 at $0.526/h (half an L4, 11444 MiB, costs $0.95/h)
        assert chosen.name == "g4dn.xlarge"


@pytest.mark.parametrize("provider", ["aws", "azure", "gcp"])
def test_mig_class_with_a_capacity_request_is_a_mig_device(provider: str) -> None:
    report = plan(provider, manifest("mig.nvidia.com", memory="10Gi"))
    assert unit_kind(report) == "mig"
    (profile,) = report.intent.gpu.mig  # type: ignore[union-attr]
    assert int(profile.split(".")[1].removesuffix("gb").split("+")[0]) >= 10


# --- every match a candidate, price decides -------------------------------------------------


def test_any_mig_device_of_22gib_is_the_cheapest_not_the_smallest() -> None:
    # H100 profiles of >= 22 GiB are 3g.40gb, 4g.40gb, 7g.80gb (1g.20gb and 2g.20gb are 20 GB);
    # B200's 1g.23gb is the smallest match, but a p5.4xlarge ($6.88/h) carries an H100 where the
    # B200 type costs $113.93/h. (RTX PRO 6000 types are left out: they have no list price.)
    full = load_catalog("aws", "us-east-1")
    catalog = full.model_copy(update={"types": tuple(t for t in full.types if t.family != "g7e")})
    report = plan("aws", manifest("mig.nvidia.com", memory(22)), catalog)
    assert report.selection is not None and report.selection.selected.name == "p5.4xlarge"
    assert report.intent is not None and report.intent.gpu.mig == {"3g.40gb": 1}


@pytest.mark.parametrize("provider", ["aws", "azure", "gcp"])
def test_any_mig_device_of_22gib_ranks_no_worse_than_each_alternative(provider: str) -> None:
    report = plan(provider, manifest("mig.nvidia.com", memory(22)))
    chosen = report.selection.selected  # type: ignore[union-attr]
    assert chosen.mig_layout is not None and unit_kind(report) == "mig"
    assert "b200" not in report.intent.gpu.models  # type: ignore[union-attr]
    # no single profile on its own would have found a better-ranked VM
    from providers.core.mig import profiles_for
    from providers.core.request import InstanceRequest
    from providers.core.selection import select

    catalog = report.catalog
    for model in {t.gpu.model for t in catalog.types if t.gpu is not None}:
        for name in profiles_for(model):
            size = int(name.split(".")[1].split("gb")[0])
            if size < 22:
                continue
            ask = InstanceRequest(mig={name: 1}, gpu_models=(model,))
            other = select(catalog, ask)
            if other.count:
                assert chosen.rank <= other.selected.rank, (model, name)


# --- KEP-5075 request policies ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "product", "ask", "share_mib", "expected"),
    [
        # an L4's g6f shares: 2Gi rounds up to 1/8 (2861 MiB), 3Gi to 1/4 (5722 MiB)
        ("aws", "NVIDIA L4", "2Gi", 2861, "g6f.large"),
        ("aws", "NVIDIA L4", "3Gi", 5722, "g6f.2xlarge"),
        # an A10's NVadsA10 v5 shares (4, 8, 12 GiB): 5Gi rounds up to 1/3 (8 GiB)
        ("azure", "NVIDIA A10", "5Gi", 8192, "Standard_NV12ads_A10_v5"),
    ],
)
def test_capacity_request_rounds_up_to_the_next_share(
    provider: str, product: str, ask: str, share_mib: int, expected: str
) -> None:
    selector = f"device.attributes['gpu.nvidia.com'].productName == '{product}'"
    report = plan(provider, manifest("gpu.nvidia.com", selector, memory=ask))
    gpu = report.intent.gpu  # type: ignore[union-attr]
    assert gpu.fractional and gpu.memory_mib == share_mib
    assert report.selection.selected.name == expected  # type: ignore[union-attr]


def test_gcp_has_no_shares_so_a_capacity_request_takes_a_whole_l4() -> None:
    selector = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA L4'"
    report = plan("gcp", manifest("gpu.nvidia.com", selector, memory="3Gi"))
    gpu = report.intent.gpu  # type: ignore[union-attr]
    assert not gpu.fractional and gpu.models == ("l4",)
    assert report.selection.selected.instance_type.family == "g2"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("policy", "request_mib", "consumed"),
    [
        (RequestPolicy(100, valid_values=(100, 200, 400)), 150, 200),
        (RequestPolicy(100, valid_values=(100, 200, 400)), 400, 400),
        (RequestPolicy(100, valid_values=(100, 200, 400)), 401, None),  # over every value
        (RequestPolicy(100, valid_values=(100, 200, 400)), None, 100),  # no request: default
        (RequestPolicy(10, valid_range=(10, 100, 5)), 3, 10),  # below min: min
        (RequestPolicy(10, valid_range=(10, 100, 5)), 12, 15),  # min + n * step
        (RequestPolicy(10, valid_range=(10, 100, 5)), 99, 100),
        (RequestPolicy(10, valid_range=(10, 100, 5)), 101, None),  # over max
        (RequestPolicy(10, valid_range=(10, None, None)), 37, 37),  # no step: as asked
    ],
)
def test_request_policy_rounding(
    policy: RequestPolicy, request_mib: int | None, consumed: int | None
) -> None:
    assert policy.consumed(request_mib) == consumed


def test_claim_units_are_held_for_the_pod() -> None:
    report = plan("aws", manifest("gpu.nvidia.com"))
    assert isinstance(report.container_plan, ContainerPlan)
    assert all(u.lifetime == "pod" for u in report.container_plan.units)
