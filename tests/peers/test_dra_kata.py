"""The DRA-driver mode's whole chain through Kata, with real peers: a kata-remote pod whose
ResourceClaim asks an H100 is allocated and bound by kube-scheduler v1.36.2 to a real kubelet's
node; the kubelet prepares the claim through `peerpods serve --dra-plugin`; containerd 2.x runs
the sandbox with Kata's Go shim as `peerpods node install` configured it; the shim's CreateVM
reaches the same serve, which plans the VM from the prepared claim and launches, on the aws
provider against moto, an instance type with the allocated GPU model and count; the container's
OCI spec reaches the pod VM's agent with the claim's CDI environment edit and serve's device
annotation for the VM's GPU. The pod uses the host's network, so no tunnel is made.
Deleting the pod stops the VM, unprepares the claim and leaves nothing: no running VM, no
sandbox, no shim, no CDI spec, no checkpoint entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from adaptor.dra import Checkpoint, devices_in_env
from adaptor.node.install import NodeInstall, install
from adaptor.ttrpc.gen import agent_pb2, ttrpc_pb2
from providers.clouds.kube import KubeClient, kubeconfig_config
from providers.core.snapshots import CatalogLoader
from providers.dra import build_pool
from providers.dra.publisher import delete_pool, publish
from tests.peers.conftest import peer_binary
from tests.peers.dra_kata_daemon import OWNER
from tests.peers.kube import KubeCluster, free_port, import_sleep_images, start_containerd
from tests.peers.test_kata_shim_install import (
    KATA_DEPLOY_GO,
    kata_generated,
    shim_processes,
    syslog_socket,
)
from tests.shim_emulator import PodVMAgent

ROOT = Path(__file__).resolve().parents[2]
NODE = "dra-kata"
NS = "dra-kata"
NODE_CDI_DIR = Path("/var/run/cdi")  # where containerd 2.x reads CDI specs by default
H100 = "device.attributes['gpu.peerpods.io'].productName == 'NVIDIA H100 80GB HBM3'"


@pytest.fixture
def needs_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the kubelet test needs root under CI")
        pytest.skip("the kubelet needs root")


class SignalledAgent(PodVMAgent):
    """The pod VM's kata-agent, whose containers end when the shim signals them (as `sleep`
    does on SIGTERM or SIGKILL in a real VM): stdout and stderr reach EOF, the process exits."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[agent_pb2.CreateContainerRequest] = []

    async def _answer(
        self, writer: asyncio.StreamWriter, stream_id: int, request: ttrpc_pb2.Request
    ) -> None:
        if request.method == "CreateContainer":
            self.created.append(agent_pb2.CreateContainerRequest.FromString(request.payload))
        if request.method == "SignalProcess":
            # SignalProcessRequest starts as WaitProcessRequest does (container_id, exec_id)
            signalled = agent_pb2.WaitProcessRequest.FromString(request.payload)
            done = self._exit(signalled.container_id)
            if not done.done():
                # its output streams end (the shim waits for them before WaitProcess), then it
                self.write(signalled.container_id, b"")
                self.write(signalled.container_id, b"")
                done.set_result(137)
        await super()._answer(writer, stream_id, request)


@pytest.fixture
def agent() -> Iterator[tuple[SignalledAgent, int]]:
    """The pod VM's agent on loopback, on an event loop of its own in a thread."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = int(listener.getsockname()[1])
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    started = asyncio.run_coroutine_threadsafe(SignalledAgent.start(listener), loop).result(10)
    assert isinstance(started, SignalledAgent)
    try:
        yield started, port
    finally:
        asyncio.run_coroutine_threadsafe(started.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def moto_port() -> Iterator[int]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        yield int(server.get_host_and_port()[1])
    finally:
        server.stop()


def ec2_instances(moto_port: int) -> list[dict[str, Any]]:
    """The serve owner's instances on the moto server, whatever their state."""
    import boto3

    client = boto3.session.Session().client(
        "ec2", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{moto_port}",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip
    out = client.describe_instances(Filters=[{"Name": "tag:peerpods-owner", "Values": [OWNER]}])
    return [vm for r in out["Reservations"] for vm in r["Instances"]]


def installer(base: Path, serve_socket: Path) -> Callable[[Path], None]:
    """`peerpods node install` over containerd's config (Kata's generated file as its source,
    the runtime `kata-remote` with the Go shim, the hypervisor socket of the test's serve)."""
    shim = peer_binary("containerd-shim-kata-v2")
    containerd = peer_binary("containerd")

    def configure(config: Path) -> None:
        kata_source = base / KATA_DEPLOY_GO
        kata_source.parent.mkdir(parents=True)
        shutil.copy(kata_generated(), kata_source)
        settings = NodeInstall.build(
            containerd_config=str(config),
            dropin=f"{base}/etc/containerd/conf.d/50-peerpods-kata-remote.toml",
            kata_config=f"{base}/opt/peerpods/share/kata/configuration-remote.toml",
            record=f"{base}/var/lib/peerpods/node-install.json",
            kata_source=str(kata_source),
            socket=str(serve_socket),
            shim_path=str(shim),
            snapshotter="",
            version_command=f"{containerd} --version",
        )
        install(settings)

    return configure


def wait_for(what: str, check: Callable[[], Any], seconds: float, why: Callable[[], str]) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{why()}")
        time.sleep(0.5)


def status(port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/sandboxes", timeout=5) as answer:
        body = json.loads(answer.read())
    return list(body["sandboxes"] if isinstance(body, dict) else body)


@contextlib.contextmanager
def serve_process(
    base: Path, moto_port: int, agent_port: int, status_port: int, kubelet_root: Path,
    kubeconfig: Path,
) -> Iterator[Path]:  # fmt: skip
    log = base / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PEERPODS_", "AWS_"))}
    env |= {"KUBECONFIG": str(kubeconfig), "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.peers.dra_kata_daemon", str(base / "serve"),
             str(moto_port), str(agent_port), str(status_port), str(kubelet_root),
             str(NODE_CDI_DIR)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield log
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def claim_and_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    exactly = {"deviceClassName": "gpu.peerpods.io", "selectors": [{"cel": {"expression": H100}}]}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "h100"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu"},
           "spec": {"runtimeClassName": "kata-remote", "hostNetwork": True,
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 5,
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "h100"}],
                    "containers": [{"name": "main", "image": "peerpods.test/sleep:1",
                                    "imagePullPolicy": "Never",
                                    "resources": {"claims": [{"name": "gpu"}]}}]}}  # fmt: skip
    return claim, pod


@pytest.mark.usefixtures("needs_root")
@pytest.fixture
def own_cluster() -> Iterator[KubeCluster]:
    """A control plane of this test's own: the session's holds other tests' nodes labelled for
    peer pods and their claims on the pool's devices, which this test's one H100 must not meet."""
    for name in ("etcd", "kube-apiserver", "kube-scheduler", "kubectl"):
        peer_binary(name)
    with KubeCluster(scheduler=True) as cluster:
        yield cluster


def test_a_kata_pod_with_an_h100_claim_gets_a_vm_with_that_gpu_and_leaves_nothing(
    own_cluster: KubeCluster, agent: tuple[SignalledAgent, int], moto_port: int
) -> None:
    cluster = own_cluster
    pod_vm, agent_port = agent
    kube = KubeClient(kubeconfig_config({"KUBECONFIG": str(cluster.admin_kubeconfig)}))
    pool = build_pool(CatalogLoader(None).load("aws", "us-east-1"), {"h100-80gb": 1})
    deviceclasses = (ROOT / "config" / "deploy" / "dra" / "deviceclasses.yaml").read_text()
    cluster.apply(deviceclasses)
    cluster.apply((ROOT / "config" / "deploy" / "runtimeclass.yaml").read_text())
    publish(kube, pool)
    cluster.ensure_namespace(NS)
    base = Path(tempfile.mkdtemp(prefix="ppdk", dir="/tmp"))
    (base / "serve").mkdir()
    status_port = free_port()
    existed = NODE_CDI_DIR.exists()
    before = set(NODE_CDI_DIR.iterdir()) if existed else set()
    made: list[Path] = []  # the claim's CDI spec: a failure may stop the kubelet before unprepare
    claims = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
    pods = f"/api/v1/namespaces/{NS}/pods"
    configure = installer(base, base / "serve" / "hv.sock")
    try:
        with (
            syslog_socket(),
            start_containerd(peer_binary("containerd"), configure=configure) as runtime,
            cluster.kubelet(NODE, runtime.endpoint) as kubelet,
        ):
            import_sleep_images(runtime)
            root = kubelet.log_path.parent / "root"
            peer_node = {"metadata": {"labels": {"node.kubernetes.io/peerpods": "true"}}}
            cluster.api_request("PATCH", f"/api/v1/nodes/{NODE}", peer_node)
            cluster.untaint_node(NODE)
            with serve_process(base, moto_port, agent_port, status_port, root,
                               cluster.admin_kubeconfig) as serve_log:  # fmt: skip
                checkpoint = Checkpoint(root / "plugins" / "gpu.peerpods.io" / "checkpoint.json")

                def why() -> str:
                    text = serve_log.read_text(errors="replace")[-5000:]
                    return (
                        f"serve:\n{text}\nkubelet:\n{kubelet.log_tail(40)}\n"
                        f"containerd:\n{runtime.process.log_tail(30)}\nagent: {pod_vm.calls}"
                    )

                def serve_says(text: str) -> bool:
                    return text in serve_log.read_text(errors="replace")

                registered = "the kubelet registered plugin gpu.peerpods.io"
                wait_for("the plugin to register", lambda: serve_says(registered), 60, why)
                claim, pod = claim_and_pod()
                claim = cluster.api_request("POST", claims, claim)
                cluster.api_request("POST", pods, pod)

                def node_name() -> str:
                    return str(cluster.api_get(f"{pods}/gpu")["spec"].get("nodeName") or "")

                # the real scheduler allocates the claim and binds the pod to the kubelet's node
                assert wait_for("the pod to be bound", node_name, 60, why) == NODE
                allocation = cluster.api_get(f"{claims}/h100")["status"]["allocation"]
                results = allocation["devices"]["results"]
                assert [(r["driver"], r["pool"]) for r in results] == [
                    ("gpu.peerpods.io", pool.name)
                ]
                uid = claim["metadata"]["uid"]
                made.append(NODE_CDI_DIR / f"k8s.gpu.peerpods.io-claim_{uid}.json")
                prepared = wait_for(
                    "the kubelet to prepare the claim", lambda: checkpoint.get(uid), 90, why
                )
                assert prepared.cdi_ids == (f"k8s.gpu.peerpods.io/claim={uid}-0",)

                def with_vm() -> list[dict[str, Any]]:
                    return [b for b in status(status_port) if b["vm_id"]]

                # the shim's CreateVM reached serve, which planned the VM from the claim
                [box] = wait_for("a sandbox with its VM", with_vm, 120, why)
                assert box["pod"] == {"namespace": NS, "name": "gpu"}
                assert serve_says(f"pod {NS}/gpu: VM planned from 1 allocated devices of 1 claims")
                assert box["pod_network"] is None  # host network: no tunnel
                [vm] = [vm for vm in ec2_instances(moto_port) if vm["InstanceId"] == box["vm_id"]]
                assert vm["InstanceType"] == box["instance_type"] == "p5.4xlarge"
                catalog = CatalogLoader(None).load("aws", "us-east-1")
                gpu = catalog.by_name()[vm["InstanceType"]].gpu
                assert gpu is not None and (gpu.model, gpu.count) == ("h100-80gb", len(results))
                wait_for(
                    "the pod's container to start in the VM",
                    lambda: pod_vm.calls.count("StartContainer") >= 2,
                    90,
                    why,
                )

                # containerd applied the claim's CDI edit; the shim carried it to serve, whose
                # rewrite gives the container the VM's GPU 0 (the allocated device)
                [main] = [
                    c
                    for c in pod_vm.created
                    if c.OCI.Annotations.get("io.kubernetes.cri.container-name") == "main"
                ]
                allocated = [(pool.name, results[0]["device"])]
                assert devices_in_env(main.OCI.Process.Env) == allocated
                assert main.OCI.Annotations["cdi.k8s.io/peerpods_main"] == "peerpods.io/gpu=gpu0"

                def phase() -> str:
                    return str(cluster.api_get(f"{pods}/gpu").get("status", {}).get("phase"))

                wait_for("the pod to run", lambda: phase() == "Running", 90, why)

                cluster.api_request("DELETE", f"{pods}/gpu", None)
                wait_for("the pod to go", lambda: not cluster.api_get(pods)["items"], 120, why)
                wait_for("the claim to be unprepared", lambda: not checkpoint.get(uid), 60, why)

                def vms_gone() -> bool:
                    states = [vm["State"]["Name"] for vm in ec2_instances(moto_port)]
                    return bool(states) and all(
                        s in ("shutting-down", "terminated") for s in states
                    )

                wait_for("the VM to be deleted", vms_gone, 60, why)
                wait_for("no sandbox", lambda: status(status_port) == [], 30, why)
                wait_for("no shim", lambda: not shim_processes(runtime.socket), 30, why)
                assert serve_says(f"sandbox {box['id']} stopped")  # StopVM ran its course
                assert set(NODE_CDI_DIR.iterdir()) == before
                assert "Traceback" not in serve_log.read_text()
    finally:
        with contextlib.suppress(Exception):
            cluster.kubectl(
                "delete", "pod", "-n", NS, "gpu", "--grace-period=0", "--force", check=False
            )
            cluster.kubectl("delete", "resourceclaim", "-n", NS, "h100", check=False)
        delete_pool(kube, pool.name)
        kube.close()
        shutil.rmtree(base, ignore_errors=True)
        for spec in made:
            spec.unlink(missing_ok=True)
        if not existed and NODE_CDI_DIR.exists() and not any(NODE_CDI_DIR.iterdir()):
            NODE_CDI_DIR.rmdir()
