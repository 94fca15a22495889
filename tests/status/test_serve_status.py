"""The status API of a running `peerpods serve` (static provider, real Go ttrpc peers) follows a
sandbox through CreateVM, StartVM, a CreateContainer whose device the pod VM refuses, a good one,
and StopVM; its metrics parse with prometheus-client's parser."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adaptor.ttrpc.gen import agent_pb2, hypervisor_pb2
from providers.core import contract
from tests.adaptor.daemon_proc import ANNOTATIONS, ServeProcess
from tests.go.peers import GoServer, echo_server, go_call

pytestmark = pytest.mark.go

SID = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
GPU_POD = {
    **ANNOTATIONS,
    contract.SANDBOX_NAME: "cuda-train",
    contract.DEFAULT_GPUS: "2",
    contract.DEFAULT_GPU_MODEL: "v1:m=l4",
}


@pytest.fixture
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        yield Path(directory)


@pytest.fixture
async def serve(root: Path) -> AsyncIterator[tuple[ServeProcess, GoServer]]:
    async with echo_server() as pod_vm:
        proc = ServeProcess(
            root,
            [
                "--provider",
                "static",
                "--static-endpoints",
                pod_vm.address,
                "--no-agent-tls",
                "--proxy-timeout",
                "20s",
                "--shutdown-grace",
                "1s",
            ],
        )
        await proc.start()
        try:
            yield proc, pod_vm
        finally:
            await proc.kill()


def create_container(name: str) -> bytes:
    request = agent_pb2.CreateContainerRequest(container_id=f"c-{name}")
    request.OCI.Annotations[contract.CONTAINER_NAME] = name
    request.OCI.Annotations[contract.CONTAINER_TYPE] = "container"
    plan = contract.ContainerPlan(
        units=(
            contract.DeviceUnit(id="gpu-trainer", kind="gpu", count=1),
            contract.DeviceUnit(id="gpu-eval", kind="gpu", count=1),
        ),
        containers={"trainer": ("gpu-trainer",), "evaluator": ("gpu-eval",), "logger": ()},
    )
    request.OCI.Annotations[contract.DEVICES] = plan.encode()
    return request.SerializeToString()


async def _create_one_refused_one_accepted(socket: str) -> None:
    """The pod VM refuses the evaluator's device (failed, with the agent's reason) and takes the
    trainer's."""
    refused = await go_call(
        socket,
        "grpc.AgentService",
        "CreateContainer",
        create_container("evaluator"),
        metadata=[("x-fail", "5:CDI device peerpods.io/gpu=gpu1 not found")],
        call_timeout="10s",
    )
    assert refused["code"] == 5
    accepted = await go_call(
        socket,
        "grpc.AgentService",
        "CreateContainer",
        create_container("trainer"),
        call_timeout="10s",
    )
    assert accepted["code"] == 0


async def _check_metrics_count_the_sandbox_and_its_calls(http: httpx.AsyncClient) -> None:
    """One running sandbox, one refused and one accepted CreateContainer, one VM created."""
    metrics = {f.name: f for f in text_string_to_metric_families((await http.get("/metrics")).text)}
    running = {s.labels["state"]: s.value for s in metrics["peerpods_sandboxes"].samples}
    assert running["running"] == 1
    calls = {
        (s.labels["method"], s.labels["code"]): s.value
        for s in metrics["peerpods_proxy_calls"].samples
        if s.name.endswith("_total")
    }
    assert calls[("grpc.AgentService/CreateContainer", "5")] == 1
    assert calls[("grpc.AgentService/CreateContainer", "0")] == 1
    created_hist = [
        s for s in metrics["peerpods_vm_create_seconds"].samples if s.name.endswith("_count")
    ]
    assert created_hist[0].value == 1


async def test_states_and_devices_follow_the_sandbox(serve: tuple[ServeProcess, GoServer]) -> None:
    proc, pod_vm = serve
    assert proc.status_url.startswith("http://127.0.0.1:")
    async with httpx.AsyncClient(base_url=proc.status_url, timeout=10) as http:
        assert (await http.get("/healthz")).text == "ok"
        assert (await http.get("/v1/sandboxes")).json() == {"sandboxes": [], "abandoned": []}

        created = await proc.create_vm(SID, GPU_POD)
        assert created["code"] == 0, proc.log()
        socket = hypervisor_pb2.CreateVMResponse.FromString(created["payload"]).agentSocketPath
        view = (await http.get(f"/v1/sandboxes/{SID}")).json()
        assert (view["state"], view["vm_id"], view["pod"]["name"]) == ("created", "", "cuda-train")

        assert (await proc.start_vm(SID))["code"] == 0, proc.log()
        view = (await http.get(f"/v1/sandboxes/{SID}")).json()
        assert (view["state"], view["vm_id"]) == ("running", pod_vm.address)
        assert view["containers"] == {}

        await _create_one_refused_one_accepted(socket)
        containers = (await http.get(f"/v1/sandboxes/{SID}")).json()["containers"]
        assert containers["trainer"] == {
            "devices": ["peerpods.io/gpu=gpu0"],
            "state": "ready",
            "reason": "",
        }
        assert containers["evaluator"]["devices"] == ["peerpods.io/gpu=gpu1"]
        assert containers["evaluator"]["state"] == "failed"
        assert "NOT_FOUND" in containers["evaluator"]["reason"]
        assert "peerpods.io/gpu=gpu1 not found" in containers["evaluator"]["reason"]

        await _check_metrics_count_the_sandbox_and_its_calls(http)

        assert (await proc.stop_vm(SID))["code"] == 0, proc.log()
        gone = await http.get(f"/v1/sandboxes/{SID}")
        assert gone.status_code == 404 and gone.json()["code"] == "not_found"
        assert (await http.get("/v1/sandboxes")).json() == {"sandboxes": [], "abandoned": []}
