"""End to end: `peerpods plan` of a mixed-MIG pod (a 3g and four 1g on one H100), the pod VM user
data the daemon builds for it, `podvm prepare` on the fake NVML in the VM, and the CreateContainer
requests the adaptor rewrites. Each container's injected names, resolved against the VM's spec by
the reference Go CDI library, give exactly the devices (UUIDs) planned for it and no other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from adaptor.cli.main import main
from adaptor.devices.rewrite import rewrite_create_container
from adaptor.planning.placement import Placement
from adaptor.planning.userdata import PodVmUserData
from adaptor.podvm.layout import APF_KEY
from adaptor.state import SandboxRecord
from adaptor.ttrpc.gen import agent_pb2
from providers.core import contract
from providers.core.base import Instance
from providers.core.snapshots import load_snapshot
from tests.cdi.conftest import Oracle
from tests.devices.requests import create_container
from tests.podvm.conftest import PodVM

pytestmark = pytest.mark.go
POD = """\
apiVersion: v1
kind: Pod
metadata: {name: mixed-mig, namespace: default}
spec:
  runtimeClassName: kata-remote
  containers:
    - {name: big, image: triton, resources: {limits: {nvidia.com/mig-3g.40gb: 1}}}
    - {name: small-a, image: triton, resources: {limits: {nvidia.com/mig-1g.10gb: 2}}}
    - {name: small-b, image: triton, resources: {limits: {nvidia.com/mig-1g.10gb: 2}}}
    - {name: sidecar, image: envoy}
"""
BASE_OCI = {"ociVersion": "1.0.2", "process": {"user": {"uid": 0, "gid": 0}, "cwd": "/"}}


def plan_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(POD)
    args = ["plan", str(manifest), "--provider", "aws", "--region", "us-east-1"]
    assert main([*args, "--output", "json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def injected(request: agent_pb2.CreateContainerRequest, stored: Any) -> list[str]:
    out = agent_pb2.CreateContainerRequest()
    out.ParseFromString(rewrite_create_container(request.SerializeToString(), stored))
    cdi = {k: v for k, v in out.OCI.Annotations.items() if k.startswith("cdi.k8s.io/")}
    return [n for v in cdi.values() for n in v.split(",")]


def resolve(oracle: Oracle, vm: PodVM, names: list[str]) -> set[str]:
    """The MIG UUIDs a container gets: its names injected by the Go CDI library, then the
    nodes it was given read back through mig-minors to the hardware's devices."""
    got = oracle(vm.spec_texts(), BASE_OCI, names)
    assert not got.get("error") and not got["spec_errors"], got
    nodes = [(d["path"], d["minor"]) for d in (got["oci"].get("linux") or {}).get("devices", [])]
    caps = [(p, m) for p, m in nodes if p.startswith("/dev/nvidia-caps/")]
    parents = [(p, m) for p, m in nodes if p.startswith("/dev/nvidia") and (p, m) not in caps]
    common = {"/dev/nvidiactl", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    gpus = [(p, m) for p, m in parents if p not in common]
    truth = vm.machine.truth()
    uuids: set[str] = set()
    for _, minor in caps:
        cap = vm.cap_of(minor)
        if "/ci" not in cap:
            continue
        gpu, gi, ci = (int(part.lstrip("gpuic")) for part in cap.split("/")[:3])
        assert f"gpu{gpu}/gi{gi}/access" in {vm.cap_of(m) for _, m in caps}
        assert (f"/dev/nvidia{gpu}", gpu) in gpus
        uuids |= {t["uuid"] for t in truth if (t["minor"], t["gi"], t["ci"]) == (gpu, gi, ci)}
    assert len(caps) == 2 * len(uuids)  # nothing but each device's GI and CI access
    return uuids


async def test_a_mixed_mig_pod_gets_exactly_its_planned_devices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make_vm: Any, oracle: Oracle
) -> None:
    report = plan_cli(tmp_path, capsys)
    assert report["ok"] and report["selected"] == "p5.4xlarge"
    annotations = report["annotations"]

    # StartVM: the intent from CreateVM's annotations, the user data, the VM, the stored plan
    # (the runtime sends the hypervisor annotations and the sandbox's name, not the pod's others)
    sent = {k: v for k, v in annotations.items() if k.startswith(contract.KATA_HYPERVISOR_PREFIX)}
    sent |= {contract.SANDBOX_NAME: "mixed-mig", contract.SANDBOX_NAMESPACE: "default"}
    intent = contract.parse_vm_annotations(sent)
    placement = Placement(catalog=load_snapshot("aws", "us-east-1"))
    plan = await placement.plan(intent, "sb-e2e")
    first = plan.candidates[0].instance_type
    assert first == "p5.4xlarge"
    record = SandboxRecord(id="sb-e2e", pod_namespace="default", pod_name="mixed-mig")
    user_data = PodVmUserData("aws").build(record, plan)
    stored = plan.devices_for(Instance("i-1", "vm-1", ("10.0.0.9",), first))
    assert [m.name for m in stored.mig] == report["devices"]["mig"]

    files = {f["path"]: f["content"] for f in yaml.safe_load(user_data)["write_files"]}
    apf = json.loads(files["/run/peerpod/apf.json"])
    assert {layout["model"] for layout in apf[APF_KEY]["layouts"]} >= {"h100-80gb"}
    vm = make_vm(model="h100-80gb", gpus=1, seed=11)
    vm.write_apf(apf)
    assert vm.prepare().exit_code == 0, vm.lines
    assert vm.prepare().changed is False

    # what each container was planned: its MIG devices, by placement, as the hardware has them
    by_place = {(t["gpu"], t["start"]): t["uuid"] for t in vm.machine.truth()}
    by_name = {m.name: by_place[(m.gpu, m.start)] for m in stored.mig}
    devices_plan = annotations[contract.DEVICES]
    seen: set[str] = set()
    for container in report["containers"]:
        request = create_container(container["name"], plan_json=devices_plan)
        names = injected(request, stored)
        assert names == container["cdi"]  # what `peerpods plan` showed is what is injected
        planned = {by_name[n] for n in names}
        assert resolve(oracle, vm, names) == planned
        assert not planned & seen  # no container gets another's slice
        seen |= planned
    assert len(seen) == 5
    big = next(c for c in report["containers"] if c["name"] == "big")
    (big_uuid,) = {by_name[n] for n in big["cdi"]}
    assert next(t for t in vm.machine.truth() if t["uuid"] == big_uuid)["profile"] == "3g.40gb"


def test_the_written_specs_are_valid_for_the_go_cdi_library(make_vm: Any, oracle: Oracle) -> None:
    from tests.podvm.test_prepare import MIXED

    vm = make_vm(gpus=2, rdma=1)
    vm.send(MIXED.model_copy(update={"rdma": ("rdma.peerpods.io/hca=0",)}))
    assert vm.prepare().exit_code == 0, vm.lines
    got = oracle(vm.spec_texts(), BASE_OCI, ["peerpods.io/gpu=gpu0", "rdma.peerpods.io/hca=0"])
    assert got["spec_errors"] == {} and not got.get("error"), got
    assert sorted(got["devices"]) == sorted([*MIXED.names(), "rdma.peerpods.io/hca=0"])
    paths = [d["path"] for d in got["oci"]["linux"]["devices"]]
    gpu0 = vm.machine.gpus[0].minor
    assert f"/dev/nvidia{gpu0}" in paths and "/dev/infiniband/uverbs0" in paths
    assert "/dev/nvidia-caps" not in " ".join(paths)  # a whole GPU has no MIG capability
    assert got["oci"]["hooks"]["createContainer"][0]["path"] == "/usr/bin/nvidia-cdi-hook"
