"""The kubelet plugin of gpu.peerpods.io with a real kubelet v1.36.2: the kubelet's plugin
watcher finds the registration socket and registers the plugin (NotifyRegistrationStatus), and
for a pod bound to its node whose claim is allocated on gpu.peerpods.io it calls
NodePrepareResources, which returns the claim's CDI IDs (the per-claim spec and the checkpoint
hold them); containerd 2.x resolves them, so the container's OCI spec carries the environment
edit; deleting the pod unprepares it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adaptor.cdi import load_spec
from adaptor.dra import Checkpoint, DeviceState, devices_in_env
from adaptor.dra.server import PluginServer
from providers.clouds.kube import KubeClient, kubeconfig_config
from providers.core.snapshots import CatalogLoader
from providers.dra import build_pool
from providers.dra.publisher import delete_pool, publish
from tests.peers.conftest import peer_binary
from tests.peers.kube import Containerd, KubeCluster, import_sleep_images, start_containerd
from tests.peers.test_kubelet import _containerd

NODE = "dra-kubelet"
NS = "dra-kubelet"
# where containerd 2.x reads CDI specs by default (cdi_spec_dirs): the node's real place
NODE_CDI_DIR = Path("/var/run/cdi")


@pytest.fixture
def needs_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the kubelet test needs root under CI")
        pytest.skip("the kubelet needs root")


class PluginThread:
    """The plugin's gRPC servers on an event loop of their own, in a thread."""

    def __init__(self, state: DeviceState, registry: Path, plugin_dir: Path) -> None:
        self.server = PluginServer(state, registry, plugin_dir)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> PluginServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self.server

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(1), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def wait_for(what: str, check: Any, timeout_seconds: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def client(kube_cluster: KubeCluster) -> Iterator[KubeClient]:
    config = kubeconfig_config({"KUBECONFIG": str(kube_cluster.admin_kubeconfig)})
    kube = KubeClient(config)
    yield kube
    kube.close()


@pytest.mark.usefixtures("needs_root")
def test_the_kubelet_registers_the_plugin_and_prepare_returns_cdi_ids(
    kube_cluster: KubeCluster, client: KubeClient, tmp_path: Path
) -> None:
    cluster = kube_cluster
    pool = build_pool(CatalogLoader(None).load("aws", "us-east-1"), {"h100-80gb": 1})
    publish(client, pool)
    cluster.ensure_namespace(NS)
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    state = DeviceState(client.get, checkpoint, NODE_CDI_DIR)
    existed = NODE_CDI_DIR.exists()
    before = set(NODE_CDI_DIR.iterdir()) if existed else set()
    try:
        with (
            start_containerd(_containerd()) as runtime,
            cluster.kubelet(NODE, runtime.endpoint) as kubelet,
        ):
            image = import_sleep_images(runtime)
            root = kubelet.log_path.parent / "root"
            registry = root / "plugins_registry"
            with PluginThread(state, registry, root / "plugins" / "gpu.peerpods.io") as server:
                wait_for("the kubelet to register the plugin", server.registered.is_set, 60)
                assert server.registration_error == ""
                try:
                    prepared = run_pod(cluster, checkpoint, image)
                except BaseException:
                    print(about_dra(kubelet.log_path))
                    raise
                assert prepared.cdi_ids == ("k8s.gpu.peerpods.io/claim=" + prepared.uid + "-0",)
                [spec_file] = set(NODE_CDI_DIR.iterdir()) - before
                env = [e for d in load_spec(str(spec_file)).devices for e in d.edits.env]
                assert devices_in_env(env) == [(pool.name, "nvidia-h100-80gb-hbm3-0")]
                # containerd resolved the CDI ID: the container's OCI spec carries the edit
                oci_env = wait_for("the container", lambda: container_env(runtime), 90)
                assert env[0] in oci_env
                cluster.kubectl("delete", "pod", "-n", NS, "gpu", "--wait=false")
                wait_for(
                    "the kubelet to unprepare the claim", lambda: not checkpoint.get(prepared.uid)
                )
                assert set(NODE_CDI_DIR.iterdir()) == before
                # the optional health stream is served (held open), not answered Unimplemented
                assert "Method not found" not in about_dra(kubelet.log_path)
    finally:
        delete_pool(client, pool.name)
        if not existed and NODE_CDI_DIR.exists() and not any(NODE_CDI_DIR.iterdir()):
            NODE_CDI_DIR.rmdir()


def container_env(runtime: Containerd) -> list[str]:
    """The environment of the pod's app container in its OCI spec, once containerd made it."""
    ctr = [str(peer_binary("ctr")), "-a", str(runtime.socket), "-n", "k8s.io"]
    listed = subprocess.run([*ctr, "containers", "ls", "-q"], capture_output=True, text=True)
    for cid in listed.stdout.split():
        info = subprocess.run([*ctr, "containers", "info", cid], capture_output=True, text=True)
        if info.returncode != 0:
            continue
        data = json.loads(info.stdout)
        labels = data.get("Labels") or {}
        if labels.get("io.kubernetes.container.name") == "main":
            env: list[str] = data["Spec"]["process"]["env"]
            return env
    return []


def about_dra(log: Path) -> str:
    """The kubelet's log lines about DRA, claims and this driver."""
    lines = log.read_text(errors="replace").splitlines()
    words = ("dra", "claim", "gpu.peerpods.io")
    return "\n".join(line for line in lines if any(w in line.lower() for w in words))[-6000:]


def run_pod(cluster: KubeCluster, checkpoint: Checkpoint, image: str) -> Any:
    """A claim allocated (as the scheduler would, written here) to a pod bound to the kubelet's
    node; the kubelet prepares it before it creates the sandbox."""
    claims = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.peerpods.io"}}
    claim = cluster.api_request(
        "POST",
        claims,
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "gpu"},
         "spec": {"devices": {"requests": [request]}}},
    )  # fmt: skip
    pod = cluster.api_request(
        "POST",
        f"/api/v1/namespaces/{NS}/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu"},
         "spec": {"nodeName": NODE, "hostNetwork": True, "automountServiceAccountToken": False,
                  "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
                  "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                  "resources": {"claims": [{"name": "gpu"}]}}]}},
    )  # fmt: skip
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.peerpods.io", "pool": "aws-us-east-1",
                     "device": "nvidia-h100-80gb-hbm3-0"}
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": "gpu", "uid": pod["metadata"]["uid"]}],
    }  # fmt: skip
    claim["status"] = status
    cluster.api_request("PUT", f"{claims}/gpu/status", claim)
    uid = claim["metadata"]["uid"]
    return wait_for("the kubelet to prepare the claim", lambda: checkpoint.get(uid))
