"""How the daemon's parts are put together: the catalog a cloud provider selects from, and the
pod VM user data that must agree with the device plan CreateContainer will name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from moto import mock_aws

from adaptor.devices import CdiConfig, CdiNaming
from adaptor.node.wiring import placement_for
from adaptor.planning.placement import Placement
from adaptor.planning.userdata import PodVmUserData
from adaptor.proxy.pki import AdaptorPKI
from adaptor.state import SandboxRecord
from providers.clouds.aws import AwsConfig, AwsProvider
from providers.clouds.azure import AzureConfig, AzureProvider
from providers.clouds.gcp import GcpConfig, GcpProvider
from providers.clouds.retry import sites
from providers.clouds.static import Endpoint, StaticProvider
from providers.core import contract
from providers.core.base import Accelerator, Instance
from providers.core.contract import GpuIntent, VMIntent
from providers.core.errors import CatalogError, NoMatch
from providers.core.snapshots import load_snapshot
from tests.adaptor.daemon_proc import ANNOTATIONS

CDI = CdiConfig("annotations", CdiNaming(), None)


OWNER = "node-a"


def aws(**config: Any) -> AwsProvider:
    return AwsProvider(AwsConfig(**{"region": "us-east-1", **config}), OWNER, client=object())


def azure(**config: Any) -> AzureProvider:
    settings = {
        "subscription_id": "sub",
        "resource_group": "rg",
        "location": "eastus",
        "subnet_id": "/subscriptions/sub/subnet",
        **config,
    }
    return AzureProvider(AzureConfig(**settings), OWNER, compute=object(), network=object())


def gcp(**config: Any) -> GcpProvider:
    settings = {"project": "p", "zones": ("us-central1-a", "us-central1-b"), **config}
    return GcpProvider(GcpConfig(**settings), OWNER, client=object())


def intent(gpus: int, *models: str, **fields: Any) -> VMIntent:
    gpu = GpuIntent(gpus=gpus, models=models)
    return VMIntent(pod_name="p", pod_namespace="ns", gpu=gpu, **fields)


def test_each_cloud_declares_where_it_creates() -> None:
    assert (aws().region, azure().region, gcp().region) == ("us-east-1", "eastus", "us-central1")
    assert gcp().zones == ("us-central1-a", "us-central1-b")
    assert aws(instance_type="m5.large").default_type == "m5.large"
    assert azure(allowed_instance_types=("Standard_NC*",)).allowed_types == ("Standard_NC*",)


def test_static_providers_have_no_selection() -> None:
    provider = StaticProvider([Endpoint("127.0.0.1", 15150)])
    placement = placement_for(provider, CDI)
    assert placement.catalog is None and placement.candidates(intent(0)) == ()


async def test_aws_allow_list_globs_reach_the_provider_as_typed_candidates() -> None:
    provider = aws(allowed_instance_types=("g6.*",), zones=("us-east-1a", "us-east-1b"))
    placement = placement_for(provider, CDI)
    assert placement.catalog is not None and placement.catalog.region == "us-east-1"
    plan = await placement.plan(intent(1, "l4"), "sb")
    assert plan.candidates and all(c.instance_type.startswith("g6.") for c in plan.candidates)
    spec = plan.vm_spec()
    assert spec.candidates == plan.vm_candidates()
    assert all(c.price_per_hour is not None for c in spec.candidates)
    # the provider takes them as they are: sites over its zones, no re-check
    order = sites(spec.candidates, provider.zones)
    assert order[0].instance_type == plan.candidates[0].instance_type
    with pytest.raises(NoMatch, match="allow"):
        await placement.plan(intent(1, "h100"), "sb2")


async def test_azure_globs_and_zones() -> None:
    provider = azure(allowed_instance_types=("Standard_NC*ads_A100_v4",), zones=("1", "2"))
    plan = await placement_for(provider, CDI).plan(intent(1, "a100"), "sb")
    assert plan.candidates
    assert all(c.instance_type.startswith("Standard_NC") for c in plan.candidates)


async def test_gcp_n1_with_t4_and_zones_per_candidate() -> None:
    provider = gcp(zones=("us-central1-a", "us-central1-f"), allowed_instance_types=("n1-*",))
    placement = placement_for(provider, CDI)
    t4 = await placement.plan(intent(2, "t4"), "sb")
    assert t4.candidates
    for candidate in t4.candidates:
        assert candidate.instance_type.startswith("n1-")
        assert candidate.accelerator == Accelerator("t4", 2)
    p100 = await placement.plan(intent(1, "p100"), "sb2")
    restricted = [c for c in p100.candidates if c.zones]
    assert restricted, "P100 attaches in some zones only"
    order = sites(p100.vm_candidates(), provider.zones)
    for site in order:
        assert not site.candidate.zones or site.zone in site.candidate.zones
    # what the GCP provider sends for it
    body = provider._body(t4.vm_spec(), "img", t4.candidates[0].vm, "us-central1-a")
    assert body.guest_accelerators[0].accelerator_type.endswith("/nvidia-tesla-t4")
    assert body.guest_accelerators[0].accelerator_count == 2


async def test_no_catalog_uses_the_default_type_and_the_allow_list() -> None:
    placement = Placement(default_type="t3.small", allowed=("t3.*",))
    assert [c.instance_type for c in placement.candidates(intent(0))] == ["t3.small"]
    explicit = placement.candidates(intent(0, machine_type="t3.large"))
    assert [c.instance_type for c in explicit] == ["t3.large"]
    with pytest.raises(NoMatch, match="not in the allowed list"):
        placement.candidates(intent(0, machine_type="p5.48xlarge"))


def test_a_region_without_snapshot_reads_the_cloud() -> None:
    with mock_aws():
        placement = placement_for(aws(region="eu-west-1"), CDI)
    assert placement.catalog is not None and placement.catalog.region == "eu-west-1"
    assert any(t.gpu is not None for t in placement.catalog.types)


def test_no_snapshot_and_no_cloud_is_one_clear_error(tmp_path: Path) -> None:
    provider = azure(location="nowhere1")
    with pytest.raises(CatalogError, match="cannot select instance types for azure nowhere1"):
        placement_for(provider, CDI, str(tmp_path))


async def test_user_data_carries_the_forwarder_tls_and_the_planned_mig_layout(
    tmp_path: Path,
) -> None:
    placement = Placement(catalog=load_snapshot("aws", "us-east-1"))
    pki = AdaptorPKI.load_or_create(tmp_path)
    annotations = {**ANNOTATIONS, contract.DEFAULT_GPUS: "1"}
    annotations[contract.DEFAULT_GPU_MODEL] = "v1:m=h100;mig=1g.10gb:2,3g.40gb:1"
    wanted = contract.parse_vm_annotations(annotations)
    plan = await placement.plan(wanted, "sb-ud")
    record = SandboxRecord(id="sb-ud", pod_namespace="default", pod_name="pod-a")
    text = PodVmUserData("aws", pki).build(record, plan)

    assert text.startswith("#cloud-config\n")
    files = {f["path"]: f["content"] for f in yaml.safe_load(text)["write_files"]}
    apf = json.loads(files["/run/peerpod/apf.json"])
    assert (apf["pod-namespace"], apf["pod-name"]) == ("default", "pod-a")
    assert apf["tls-client-ca"] == pki.ca_pem and "BEGIN CERTIFICATE" in apf["tls-server-cert"]

    # What the VM is told to create is exactly what the device plan names for CreateContainer.
    devices = json.loads(files["/run/peerpod/devices.json"])
    chosen = Instance("i-1", "vm", ("10.0.0.1",), plan.candidates[0].instance_type)
    planned_devices = plan.devices_for(chosen)
    assert devices["gpu_model"] == planned_devices.model
    told = [
        (gpu, slot["profile"], slot["start"])
        for gpu, slots in enumerate(devices["mig"])
        for slot in slots
    ]
    planned = [(m.gpu, m.profile, m.start) for m in planned_devices.mig]
    assert sorted(told) == sorted(planned)
    assert devices["mig"][0] == []  # GPU 0 is the whole GPU the pod asked for

    # apf.json (on CAA's allow-list) carries the same layout with every injected name
    layouts = apf["peerpods-devices"]["layouts"]
    layout = next(x for x in layouts if x["model"] == planned_devices.model)
    named = {m["name"]: (g["index"], m["profile"], m["start"])
             for g in layout["gpus"] for m in g.get("mig", [])}  # fmt: skip
    assert named == {m.name: (m.gpu, m.profile, m.start) for m in planned_devices.mig}
    whole = [g["name"] for g in layout["gpus"] if g.get("name")]
    assert whole == list(planned_devices.gpus)


async def test_user_data_carries_the_pod_network_and_keeps_an_operator_copy(
    tmp_path: Path,
) -> None:
    import os
    import stat

    from adaptor.podnet import PodNetwork, Route, Tunnel

    network = PodNetwork(
        pod_ip="10.244.1.21/24",
        pod_hw_addr="32:b9:59:6b:f0:d5",
        interface="eth0",
        worker_node_ip="10.224.0.5/16",
        routes=(Route("10.244.1.0/24", "", "eth0", "kernel", "link"),),
        neighbors=(),
        mtu=1500,
        index=2,
        vxlan_port=4789,
        vxlan_id=555002,
    )
    placement = Placement(catalog=load_snapshot("aws", "us-east-1"))
    pki = AdaptorPKI.load_or_create(tmp_path / "state")
    plan = await placement.plan(contract.parse_vm_annotations(ANNOTATIONS), "sb-net")
    pods = tmp_path / "pods"
    build = PodVmUserData("aws", pki, pods).build
    with_net = SandboxRecord(
        id="sb-net",
        pod_namespace="default",
        pod_name="pod-a",
        pod_network=Tunnel("/var/run/netns/cni-1", network).to_json(),
    )
    text = build(with_net, plan)
    files = {f["path"]: f["content"] for f in yaml.safe_load(text)["write_files"]}
    apf = json.loads(files["/run/peerpod/apf.json"])
    assert apf["pod-network"] == network.to_dict()
    assert apf["pod-network"]["routes"] == [
        {"dst": "10.244.1.0/24", "gw": "", "dev": "eth0", "protocol": "kernel", "scope": "link"}
    ]
    copy = pods / "sb-net" / "apf.json"
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o600
    assert json.loads(copy.read_text()) == apf
    # No netns: pod-network null, as CAA sends it.
    plain = SandboxRecord(id="sb-plain", pod_namespace="default", pod_name="pod-b")
    files = {f["path"]: f["content"] for f in yaml.safe_load(build(plain, plan))["write_files"]}
    assert json.loads(files["/run/peerpod/apf.json"])["pod-network"] is None


async def test_pods_of_one_shape_are_selected_for_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A StartVM of a shape the placement has seen reuses its candidates (other pods, same
    request); another shape is selected for, and a refused request is refused (and counted)
    every time, never remembered."""
    placement = placement_for(aws(zones=("us-east-1a", "us-east-1b")), CDI)
    selections: list[VMIntent] = []
    explain = Placement.explain

    def counted(self: Placement, wanted: VMIntent) -> Any:
        selections.append(wanted)
        return explain(self, wanted)

    monkeypatch.setattr(Placement, "explain", counted)
    first = await placement.plan(intent(1, "l4"), "sb1")
    other_pod = VMIntent(pod_name="q", pod_namespace="ns2", gpu=GpuIntent(gpus=1, models=("l4",)))
    second = await placement.plan(other_pod, "sb2")
    assert second.candidates == first.candidates and len(selections) == 1
    bigger = await placement.plan(intent(1, "l4", vcpus=16), "sb3")
    assert len(selections) == 2 and bigger.candidates != first.candidates
    for sandbox in ("sb4", "sb5"):
        with pytest.raises(NoMatch):
            await placement.plan(intent(1, "l4", vcpus=100_000), sandbox)
    assert len(selections) == 4
