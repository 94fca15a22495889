"""End to end with real ttrpc peers: a Go ttrpc client playing the Kata shim sends a GPU pod's
CreateContainer requests (as containerd builds them) through the agent proxy with our hook to the
Go ttrpc server playing the pod VM, which echoes what it received."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adaptor.devices import make_hook, plan_devices
from adaptor.proxy import AgentProxy, tcp_dialer
from adaptor.ttrpc.gen import agent_pb2, ttrpc_pb2
from providers.core.catalog import GpuSpec, InstanceType
from providers.core.contract import ContainerPlan, DeviceUnit
from tests.devices.requests import create_container, raw_field
from tests.go.peers import echo_server, go_call, proxy_connected

pytestmark = pytest.mark.go
AGENT = "grpc.AgentService"
A100X4 = InstanceType(
    name="NC96ads_A100_v4",
    vcpus=96,
    memory_mib=901120,
    gpu=GpuSpec(model="a100-80gb", count=4, memory_mib=81920),
)
PLAN = ContainerPlan(
    units=(
        DeviceUnit(id="train", kind="gpu", count=2),
        DeviceUnit(id="mig", kind="mig", profile="3g.40gb", count=2),
    ),
    containers={"trainer": ("train",), "server": ("mig",), "proxy": ()},
)
UNKNOWN = raw_field(31, b"newer shim field") + raw_field(6, raw_field(12, b"oci extension"))


@pytest.fixture
async def proxy() -> AsyncIterator[AgentProxy]:
    # StartVM: the stored plan comes from CreateVM's GPU intent and the chosen instance
    stored = plan_devices(None, PLAN.gpu_intent(), A100X4)
    async with echo_server() as vm:
        with tempfile.TemporaryDirectory(prefix="pp-") as d:
            p = AgentProxy(
                str(Path(d) / "agent.ttrpc"),
                tcp_dialer(vm.host, vm.port, None),
                sandbox_id="sb",
                create_container_hook=make_hook(stored),
            )
            async with proxy_connected(p):
                yield p


async def create(
    proxy: AgentProxy, payload: bytes
) -> tuple[agent_pb2.CreateContainerRequest, bytes]:
    result = await go_call(proxy.socket_path, AGENT, "CreateContainer", payload, call_timeout="60s")
    echoed = ttrpc_pb2.Request.FromString(result["payload"])
    assert (echoed.service, echoed.method) == (AGENT, "CreateContainer")
    return agent_pb2.CreateContainerRequest.FromString(echoed.payload), echoed.payload


def cdi(req: agent_pb2.CreateContainerRequest) -> dict[str, str]:
    return {k: v for k, v in req.OCI.Annotations.items() if k.startswith("cdi.k8s.io/")}


async def test_gpu_pod_containers_get_their_devices(proxy: AgentProxy) -> None:
    user = {"cdi.k8s.io/x": "nvidia.com/gpu=all"}
    pause = create_container("pause", sandbox=True, plan_json=PLAN.encode(), extra_annotations=user)
    got, _ = await create(proxy, pause.SerializeToString())
    assert cdi(got) == {}

    expected = {
        "trainer": "peerpods.io/gpu=gpu0,peerpods.io/gpu=gpu1",
        "server": "peerpods.io/gpu=gpu2-mig0,peerpods.io/gpu=gpu2-mig1",
        "proxy": None,
    }
    for name, want in expected.items():
        req = create_container(name, plan_json=PLAN.encode(), extra_annotations=user)
        got, raw = await create(proxy, req.SerializeToString() + UNKNOWN)
        assert cdi(got) == ({f"cdi.k8s.io/peerpods_{name}": want} if want else {})
        assert got.OCI.Process.Env == req.OCI.Process.Env
        assert got.OCI.Mounts == req.OCI.Mounts
        assert raw_field(31, b"newer shim field") in raw
        assert raw_field(12, b"oci extension") in raw


async def test_undecodable_create_container_is_refused(proxy: AgentProxy) -> None:
    bad = b"\x32\xff\xff\xff\xff\x0f"
    result = await go_call(proxy.socket_path, AGENT, "CreateContainer", bad, call_timeout="10s")
    assert result["code"] == 3  # INVALID_ARGUMENT, never a device-less container
    assert "cannot decode CreateContainerRequest" in result["message"]


def _grab_every_gpu(req: agent_pb2.CreateContainerRequest) -> None:
    """What a tenant writes to reach GPUs outside the plan (image env, device and cgroup entries,
    the legacy hook's device-list mount)."""
    spec = req.OCI
    spec.Process.Env.extend(["NVIDIA_VISIBLE_DEVICES=all", "CUDA_VERSION=12.4"])
    for path, major, minor in [("/dev/nvidia0", 195, 0), ("/dev/nvidiactl", 195, 255),
                               ("/dev/nvidia-uvm", 507, 0), ("/dev/fuse", 10, 229)]:  # fmt: skip
        spec.Linux.Devices.add(Path=path, Type="c", Major=major, Minor=minor)
        spec.Linux.Resources.Devices.add(
            Allow=True, Type="c", Major=major, Minor=minor, Access="rwm"
        )
    spec.Mounts.add(destination="/var/run/nvidia-container-devices/all", source="/dev/null")


async def test_gpu_access_outside_the_plan_is_removed(proxy: AgentProxy) -> None:
    for name in ("proxy", "trainer"):  # no devices in the plan; devices in the plan
        req = create_container(name, plan_json=PLAN.encode())
        _grab_every_gpu(req)
        got, _ = await create(proxy, req.SerializeToString())
        env = list(got.OCI.Process.Env)
        assert "NVIDIA_VISIBLE_DEVICES=all" not in env
        assert env.count("NVIDIA_VISIBLE_DEVICES=void") == 1 and "CUDA_VERSION=12.4" in env
        assert [d.Path for d in got.OCI.Linux.Devices] == ["/dev/fuse"]
        assert [(r.Major, r.Minor) for r in got.OCI.Linux.Resources.Devices] == [(10, 229)]
        assert not [m for m in got.OCI.Mounts if "nvidia" in m.destination]
        # what the trainer gets is exactly its CDI names, resolved in the guest
        want = {"cdi.k8s.io/peerpods_trainer": "peerpods.io/gpu=gpu0,peerpods.io/gpu=gpu1"}
        assert cdi(got) == (want if name == "trainer" else {})
