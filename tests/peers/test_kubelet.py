"""A real kubelet joins the real control plane through a private containerd: its Node appears,
carries what the kubelet reports, and its client certificate only lets it touch its own Node."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.peers.conftest import peer_binary, peers_dir
from tests.peers.kube import KubeCluster, import_sleep_images, start_containerd


def _containerd() -> Path:
    folder = peers_dir()
    if folder is not None and (folder / "containerd").is_file():
        return folder / "containerd"
    found = shutil.which("containerd")
    if found is None:
        pytest.skip("no containerd in PEERPODS_PEERS_DIR or PATH")
    return Path(found)


def _kube_chains() -> list[str]:
    """KUBE-* chains in the machine's iptables tables (none where iptables is missing)."""
    found: list[str] = []
    for command in ("iptables", "ip6tables"):
        if shutil.which(command) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            listing = subprocess.run(
                [command, "-t", table, "-S"], capture_output=True, text=True, check=False
            )
            found += [line for line in listing.stdout.splitlines() if "KUBE-" in line]
    return found


@pytest.fixture
def needs_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the kubelet test needs root under CI")
        pytest.skip("the kubelet needs root")


@pytest.fixture
def kubelet_binary() -> Path:
    return peer_binary("kubelet")


@pytest.mark.usefixtures("needs_root", "kubelet_binary")
def test_kubelet_registers_its_node(kube_cluster: KubeCluster) -> None:
    panic_before = Path("/proc/sys/kernel/panic").read_text()
    with (
        start_containerd(_containerd()) as runtime,
        kube_cluster.kubelet("harness-kubelet", runtime.endpoint) as kubelet,
    ):
        node = kube_cluster.api_get("/api/v1/nodes/harness-kubelet")
        assert kubelet.alive()
        # It ran in its own mount namespace: the machine's firewall and kernel tunables are as
        # they were (a kubelet adds KUBE-* chains and sets kernel.panic=10 when it can).
        assert _kube_chains() == []
        assert Path("/proc/sys/kernel/panic").read_text() == panic_before
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.36.2"
        assert info["containerRuntimeVersion"].startswith("containerd://")
        assert node["status"]["allocatable"]["pods"] == "110"
        addresses = {a["type"]: a["address"] for a in node["status"].get("addresses", [])}
        assert addresses.get("Hostname") == "harness-kubelet"
        # No CNI config in the private containerd: the kubelet says why it is not Ready.
        deadline = time.monotonic() + 60
        while True:
            node = kube_cluster.api_get("/api/v1/nodes/harness-kubelet")
            ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
            if "network" in ready["message"].lower() or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert ready["status"] == "False"
        assert "NetworkPluginNotReady" in ready["message"]
        # NodeRestriction: the kubelet's identity may not change another Node.
        kube_cluster.create_fake_node("harness-kubelet-other")
        try:
            own = kube_cluster.node_kubeconfig("harness-kubelet")
            refused = kube_cluster.kubectl(
                "label", "node", "harness-kubelet-other", "a=b", kubeconfig=own, check=False
            )
            assert refused.returncode != 0
        finally:
            kube_cluster.kubectl("delete", "node", "harness-kubelet-other")
    kube_cluster.kubectl("delete", "node", "harness-kubelet")


def _ctr(containerd: Path) -> Path:
    ctr = containerd.parent / "ctr"
    if not ctr.is_file():
        pytest.skip(f"no ctr beside {containerd}")
    return ctr


@pytest.mark.usefixtures("needs_root", "kubelet_binary")
def test_kubelet_runs_a_host_network_pod(kube_cluster: KubeCluster) -> None:
    containerd = _containerd()
    with (
        start_containerd(containerd) as runtime,
        kube_cluster.kubelet("harness-runner", runtime.endpoint),
    ):
        image = import_sleep_images(runtime, _ctr(containerd))
        kube_cluster.apply(
            f"""
apiVersion: v1
kind: Pod
metadata: {{name: harness-sleeper, namespace: default}}
spec:
  nodeName: harness-runner
  hostNetwork: true
  terminationGracePeriodSeconds: 2
  containers:
  - name: sleep
    image: {image}
    imagePullPolicy: Never
"""
        )
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                pod = kube_cluster.api_get("/api/v1/namespaces/default/pods/harness-sleeper")
                if pod["status"].get("phase") == "Running":
                    break
                time.sleep(1)
            statuses = pod["status"].get("containerStatuses", [])
            assert pod["status"].get("phase") == "Running", statuses
            assert statuses[0]["state"]["running"]["startedAt"]
            assert statuses[0]["containerID"].startswith("containerd://")
        finally:
            kube_cluster.kubectl(
                "delete", "pod", "harness-sleeper", "--wait=true", "--timeout=60s", check=False
            )
    kube_cluster.kubectl("delete", "node", "harness-runner")
