"""How the daemon's parts are put together: the catalog a cloud provider selects from, and the
pod VM user data that must agree with the device plan CreateContainer will name."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from moto import mock_aws

from adaptor.devices import CdiConfig, CdiNaming
from adaptor.pki import AdaptorPKI
from adaptor.placement import Placement
from adaptor.state import SandboxRecord
from adaptor.wiring import placement_for, provider_region, user_data_builder
from providers import contract
from providers.base import Instance
from providers.catalogs import load_snapshot
from providers.errors import CatalogError
from tests.adaptor.daemon_proc import ANNOTATIONS

CDI = CdiConfig("annotations", CdiNaming(), None)


@dataclass
class Config:
    region: str = ""
    location: str = ""
    zones: tuple[str, ...] = ()
    allowed_instance_types: tuple[str, ...] = ()


@dataclass
class CloudProvider:
    name: str
    config: Config = field(default_factory=Config)


def test_region_from_each_cloud_config() -> None:
    assert provider_region(CloudProvider("aws", Config(region="us-west-2"))) == "us-west-2"
    assert provider_region(CloudProvider("azure", Config(location="eastus"))) == "eastus"
    gcp = CloudProvider("gcp", Config(zones=("us-central1-a", "us-central1-b")))
    assert provider_region(gcp) == "us-central1"


def test_static_providers_have_no_selection() -> None:
    placement = placement_for(CloudProvider("static"), CDI)  # type: ignore[arg-type]
    assert placement.catalog is None


def test_bundled_snapshot_for_a_known_region() -> None:
    provider = CloudProvider("aws", Config(region="us-east-1", allowed_instance_types=("g6.*",)))
    placement = placement_for(provider, CDI)  # type: ignore[arg-type]
    assert placement.catalog is not None and placement.catalog.region == "us-east-1"
    assert placement.allowed == ("g6.*",)


def test_a_region_without_snapshot_reads_the_cloud() -> None:
    with mock_aws():
        placement = placement_for(CloudProvider("aws", Config(region="eu-west-1")), CDI)  # type: ignore[arg-type]
    assert placement.catalog is not None and placement.catalog.region == "eu-west-1"
    assert any(t.gpu is not None for t in placement.catalog.types)


def test_no_snapshot_and_no_cloud_is_one_clear_error(tmp_path: Path) -> None:
    provider = CloudProvider("azure", Config(location="nowhere1"))
    with pytest.raises(CatalogError, match="cannot select instance types for azure nowhere1"):
        placement_for(provider, CDI, str(tmp_path))  # type: ignore[arg-type]


def test_user_data_carries_the_forwarder_tls_and_the_planned_mig_layout(tmp_path: Path) -> None:
    placement = Placement(catalog=load_snapshot("aws", "us-east-1"))
    pki = AdaptorPKI.load_or_create(tmp_path)
    annotations = {**ANNOTATIONS, contract.DEFAULT_GPUS: "1"}
    annotations[contract.DEFAULT_GPU_MODEL] = "v1:m=h100;mig=1g.10gb:2,3g.40gb:1"
    intent = contract.parse_vm_annotations(annotations)
    record = SandboxRecord(id="sb-ud", pod_namespace="default", pod_name="pod-a")
    candidates = placement.candidates(intent)
    text = user_data_builder("aws", placement, pki)(record, intent, candidates)

    assert text.startswith("#cloud-config\n")
    files = {f["path"]: f["content"] for f in yaml.safe_load(text)["write_files"]}
    apf = json.loads(files["/run/peerpod/apf.json"])
    assert (apf["pod-namespace"], apf["pod-name"]) == ("default", "pod-a")
    assert apf["tls-client-ca"] == pki.ca_pem and "BEGIN CERTIFICATE" in apf["tls-server-cert"]

    # What the VM is told to create is exactly what the device plan names for CreateContainer.
    devices = json.loads(files["/run/peerpod/devices.json"])
    chosen = Instance("i-1", "vm", ("10.0.0.1",), candidates[0])
    plan = placement.device_plan(intent, chosen)
    assert devices["gpu_model"] == plan.model
    told = [
        (gpu, slot["profile"], slot["start"])
        for gpu, slots in enumerate(devices["mig"])
        for slot in slots
    ]
    planned = [(m.gpu, m.profile, m.start) for m in plan.mig_layout]
    assert sorted(told) == sorted(planned)
    assert devices["mig"][0] == []  # GPU 0 is the whole GPU the pod asked for

    # apf.json (on CAA's allow-list) carries the same layout with every injected name
    layout = next(x for x in apf["peerpods-devices"]["layouts"] if x["model"] == plan.model)
    named = {m["name"]: (g["index"], m["profile"], m["start"])
             for g in layout["gpus"] for m in g.get("mig", [])}  # fmt: skip
    assert named == {m.name: (m.gpu, m.profile, m.start) for m in plan.mig}
    assert [g["name"] for g in layout["gpus"] if g.get("name")] == list(plan.gpus)


def test_user_data_carries_the_pod_network_and_keeps_an_operator_copy(tmp_path: Path) -> None:
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
    intent = contract.parse_vm_annotations(ANNOTATIONS)
    pods = tmp_path / "pods"
    build = user_data_builder("aws", placement, pki, pods)
    with_net = SandboxRecord(
        id="sb-net",
        pod_namespace="default",
        pod_name="pod-a",
        pod_network=Tunnel("/var/run/netns/cni-1", network).to_json(),
    )
    text = build(with_net, intent, ())
    files = {f["path"]: f["content"] for f in yaml.safe_load(text)["write_files"]}
    apf = json.loads(files["/run/peerpod/apf.json"])
    assert apf["pod-network"] == network.to_json()
    assert apf["pod-network"]["routes"] == [
        {"dst": "10.244.1.0/24", "gw": "", "dev": "eth0", "protocol": "kernel", "scope": "link"}
    ]
    copy = pods / "sb-net" / "apf.json"
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o600
    assert json.loads(copy.read_text()) == apf
    # No netns: pod-network null, as CAA sends it.
    plain = SandboxRecord(id="sb-plain", pod_namespace="default", pod_name="pod-b")
    files = {
        f["path"]: f["content"] for f in yaml.safe_load(build(plain, intent, ()))["write_files"]
    }
    assert json.loads(files["/run/peerpod/apf.json"])["pod-network"] is None
