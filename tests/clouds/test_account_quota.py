"""The cloud account's quotas, read where the API offers them, rank candidates away.

Sources: AWS Service Quotas for EC2 (https://docs.aws.amazon.com/ec2/latest/instancetypes/
ec2-instance-quotas.html: On-Demand quotas count vCPUs of running instances per class, "Running
On-Demand P instances" L-417A185B, "G and VT" L-DB2E81BA, "Standard" L-1216C47A; the Spot
requests' "All P" L-7212CCBC, "All G and VT" L-3819A6DF, "All Standard" L-34B43A08; DL, the
Gaudi class: "Running On-Demand DL instances" L-6E869C2A, "All DL Spot Instance Requests"
L-85EED4F7, as skypilot-org/skypilot-catalog catalogs/v5/aws/instance_quota_mapping.csv maps
dl1.24xlarge); Azure
Compute usages (https://learn.microsoft.com/rest/api/compute/usage/list: per VM family
`currentValue`/`limit`, with `cores` the regional total and `lowPriorityCores` Spot's); GCP
region quotas (https://cloud.google.com/compute/resource-usage#gpu_quota: `NVIDIA_H100_GPUS`,
`PREEMPTIBLE_NVIDIA_H100_GPUS` per region). Offline: moto for EC2, botocore's Stubber for Service
Quotas (moto serves only VPC quotas), the fake HTTP transports for Azure and GCP.
"""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from adaptor.planning.placement import Placement
from providers.clouds.quotas import aws_quota, azure_quota, gcp_quota
from providers.core.account_quota import AccountQuota, AccountQuotaCache
from providers.core.capacity import CapacityType
from providers.core.contract import GpuIntent, VMIntent
from providers.core.snapshots import load_catalog
from tests.providers.fakes.azure import SUBSCRIPTION, compute_client
from tests.providers.fakes.gcp import PROJECT, client
from tests.providers.fakes.http import FakeCloud


def _quota_answer(code: str, value: float) -> dict[str, Any]:
    return {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "QuotaName": code, "Value": value}}


def test_aws_reads_service_quotas_and_counts_the_whole_accounts_instances() -> None:
    catalog = load_catalog("aws", "us-east-1")
    vcpus = {t.name: t.vcpus for t in catalog.types}
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        image = ec2.describe_images()["Images"][0]["ImageId"]
        # another node's VMs: the account's quota is shared by every node
        ec2.run_instances(ImageId=image, InstanceType="p5.48xlarge", MinCount=1, MaxCount=1)
        ec2.run_instances(ImageId=image, InstanceType="g6.xlarge", MinCount=2, MaxCount=2)
        quotas = boto3.client("service-quotas", region_name="us-east-1")
        with Stubber(quotas) as stub:
            for code, value in (("L-417A185B", 384.0), ("L-DB2E81BA", 16.0)):
                stub.add_response(
                    "get_service_quota", _quota_answer(code, value),
                    {"ServiceCode": "ec2", "QuotaCode": code},
                )  # fmt: skip
            stub.add_client_error("get_service_quota", "NoSuchResourceException")
            stub.add_response(
                "get_service_quota", _quota_answer("L-7212CCBC", 0.0),
                {"ServiceCode": "ec2", "QuotaCode": "L-7212CCBC"},
            )  # fmt: skip
            for _code in ("L-3819A6DF", "L-34B43A08"):
                stub.add_client_error("get_service_quota", "NoSuchResourceException")
            for code, value in (("L-6E869C2A", 96.0), ("L-85EED4F7", 0.0)):
                stub.add_response(
                    "get_service_quota", _quota_answer(code, value),
                    {"ServiceCode": "ec2", "QuotaCode": code},
                )  # fmt: skip
            account = aws_quota("us-east-1", ec2, quotas, vcpus)
    by_code = {limit.name.split()[0]: limit for limit in account.limits}
    assert (by_code["L-417A185B"].used, by_code["L-417A185B"].limit) == (192.0, 384.0)
    assert by_code["L-DB2E81BA"].used == 8.0  # two g6.xlarge, 4 vCPUs each
    assert "L-1216C47A" in account.notes[0]  # not readable: a note, not an error
    by_name = catalog.by_name()
    assert account.over(by_name["p5.48xlarge"], spot=False) == ""  # 192 + 192 <= 384
    reason = account.over(by_name["g6.12xlarge"], spot=False)  # 8 + 48 > 16
    assert "L-DB2E81BA Running On-Demand G and VT instances (8/16 vCPUs) exhausted" in reason
    # the on-demand P instance does not count against the P Spot quota, which is 0 here
    assert account.over(by_name["g6.12xlarge"], spot=True) == ""
    spot_p = account.over(by_name["p5.48xlarge"], spot=True)
    assert "L-7212CCBC All P Spot Instance Requests (0/0 vCPUs) exhausted" in spot_p
    # dl1 (Gaudi) is counted by the DL quotas, not by P, G and VT or Standard
    assert account.over(by_name["dl1.24xlarge"], spot=False) == ""  # 0 + 96 <= 96
    spot_dl = account.over(by_name["dl1.24xlarge"], spot=True)
    assert "L-85EED4F7 All DL Spot Instance Requests (0/0 vCPUs) exhausted" in spot_dl


def test_aws_without_the_service_is_no_limit() -> None:
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        quotas = boto3.client("service-quotas", region_name="us-east-1")
        account = aws_quota("us-east-1", ec2, quotas, {})
    assert account.limits == () and len(account.notes) == 8


def test_azure_reads_family_usages() -> None:
    fake = FakeCloud()
    usages = [
        {"unit": "Count", "currentValue": 80, "limit": 100,
         "name": {"value": "standardNCadsH100v5Family", "localizedValue": "NCadsH100v5"}},
        {"unit": "Count", "currentValue": 10, "limit": 350,
         "name": {"value": "cores", "localizedValue": "Total Regional vCPUs"}},
        {"unit": "Count", "currentValue": 0, "limit": 0,
         "name": {"value": "lowPriorityCores", "localizedValue": "Total Regional Spot vCPUs"}},
    ]  # fmt: skip
    path = rf"/subscriptions/{SUBSCRIPTION}/providers/Microsoft\.Compute/locations/eastus/usages"
    fake.reply("GET", path, {"value": usages})
    account = azure_quota("eastus", compute_client(fake))
    by_name = load_catalog("azure", "eastus").by_name()
    nc40 = by_name["Standard_NC40ads_H100_v5"]  # 40 vCPUs of standardNCadsH100v5Family
    assert "standardNCadsH100v5Family (80/100 vCPUs) exhausted" in account.over(nc40, spot=False)
    assert "lowPriorityCores (0/0 vCPUs)" in account.over(nc40, spot=True)
    assert account.over(by_name["Standard_NC4as_T4_v3"], spot=False) == ""


def test_gcp_reads_region_gpu_quotas() -> None:
    from google.cloud import compute_v1

    fake = FakeCloud()
    region = {
        "kind": "compute#region",
        "name": "us-central1",
        "quotas": [
            {"metric": "NVIDIA_H100_GPUS", "limit": 8.0, "usage": 8.0},
            {"metric": "PREEMPTIBLE_NVIDIA_H100_GPUS", "limit": 16.0, "usage": 0.0},
            {"metric": "CPUS", "limit": 2400.0, "usage": 10.0},
        ],
    }
    fake.reply("GET", rf"/compute/v1/projects/{PROJECT}/regions/us-central1", region)
    account = gcp_quota(PROJECT, "us-central1", client(fake, compute_v1.RegionsClient))
    a3 = load_catalog("gcp", "us-central1").by_name()["a3-highgpu-8g"]
    assert "NVIDIA_H100_GPUS (8/8 GPUs) exhausted" in account.over(a3, spot=False)
    assert account.over(a3, spot=True) == ""  # Spot VMs take the preemptible quota


@pytest.mark.parametrize(("capacity", "first"), [
    (CapacityType.ON_DEMAND, "p5.4xlarge"),
    (CapacityType.SPOT, "g6e.xlarge"),
])  # fmt: skip
async def test_placement_ranks_exhausted_families_last_and_says_why(
    capacity: CapacityType, first: str
) -> None:
    """An L40S-or-H100 pod: the G types are cheaper, but the account's On-Demand G and VT quota
    is used up, so on demand the P type goes first and the G types last, each with the reason;
    a Spot pod is not held back by the On-Demand quota."""
    from providers.core.account_quota import AccountLimit

    catalog = load_catalog("aws", "us-east-1")
    classes = ("g", "gr", "vt")
    g_full = AccountLimit("L-DB2E81BA G and VT", "vcpus", "class", classes, 16.0, 16.0, False)
    account = AccountQuota("aws", "us-east-1", (g_full,))
    placement = Placement(catalog=catalog, account_quota=AccountQuotaCache(lambda: account))
    intent = VMIntent(
        pod_name="p", pod_namespace="n", gpu=GpuIntent(gpus=1, models=("l40s", "h100")),
        capacity_type=capacity,
    )  # fmt: skip
    plan = await placement.plan(intent, "sandbox-1")
    names = [c.instance_type for c in plan.candidates]
    assert names[0] == first
    unranked = [c.name for c in placement.ranked(intent)]
    assert unranked[0].startswith("g6e.")  # what price alone would try first
    if capacity is CapacityType.SPOT:
        assert plan.ranked_away == ()
    else:
        away = dict(plan.ranked_away)
        assert away and all(name.startswith("g6e.") for name in away)
        assert names[-len(away) :] == [n for n in unranked if n in away]
        assert all("L-DB2E81BA G and VT (16/16 vCPUs) exhausted" in r for r in away.values())


async def test_the_status_api_shows_the_account_quota(tmp_path: Any) -> None:
    import httpx

    from adaptor.state import StateStore
    from adaptor.status import DeviceBook, build_app
    from providers.core.account_quota import AccountLimit

    p_full = AccountLimit("L-417A185B P", "vcpus", "class", ("p",), 192.0, 192.0, False)
    cache = AccountQuotaCache(lambda: AccountQuota("aws", "us-east-1", (p_full,), 1.0))
    store = await StateStore.open(tmp_path)
    app = build_app(store, DeviceBook(), account_quota=lambda: cache.value)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8006"
    ) as http:
        assert (await http.get("/v1/quota")).json() == {"account": None}  # not read yet
        await cache.get()
        body = (await http.get("/v1/quota")).json()["account"]
    assert body["limits"] == [
        {"name": "L-417A185B P", "counts": "vcpus", "of": ["p"], "market": "on-demand",
         "limit": 192.0, "used": 192.0, "exhausted": True},
    ]  # fmt: skip


async def test_a_failed_read_keeps_the_last_answer_and_rereads_after_the_ttl() -> None:
    now = [0.0]
    answers: list[AccountQuota | Exception] = [
        AccountQuota("gcp", "r", read_at=1.0),
        RuntimeError("quota API down"),
    ]
    calls = 0

    def read() -> AccountQuota:
        nonlocal calls
        calls += 1
        answer = answers[min(calls - 1, len(answers) - 1)]
        if isinstance(answer, Exception):
            raise answer
        return answer

    cache = AccountQuotaCache(read, ttl_seconds=60, clock=lambda: now[0])
    first = await cache.get()
    assert first is not None and (await cache.get()) is first and calls == 1
    now[0] = 61.0
    assert (await cache.get()) is first and calls == 2  # the failure kept the last answer


def test_no_reader_where_the_cloud_offers_none() -> None:
    from providers.clouds.quotas import account_reader

    class Static:
        name = "static"
        region = ""

    assert account_reader(Static(), None) is None


def test_plan_prints_the_candidates_tried_last() -> None:
    import io

    from adaptor.cli.plan import print_report
    from adaptor.cli.pod_plan import plan_manifest
    from providers.core.account_quota import AccountLimit

    catalog = load_catalog("aws", "us-east-1")
    g_full = AccountLimit("L-DB2E81BA G and VT", "vcpus", "class", ("g", "gr", "vt"), 16, 16, False)
    placement = Placement(
        catalog=catalog,
        account_quota=AccountQuotaCache(lambda: AccountQuota("aws", "us-east-1", (g_full,))),
    )
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"runtimeClassName": "kata-remote", "containers": [
            {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }  # fmt: skip
    report = plan_manifest([pod], "aws", placement=placement)
    assert report.ok, report.failure
    out = io.StringIO()
    print_report(report, 5, out)
    assert (
        "tried last: g4dn.xlarge: account quota L-DB2E81BA G and VT (16/16 vCPUs)" in out.getvalue()
    )
