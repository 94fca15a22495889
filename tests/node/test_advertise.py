"""The adaptor advertises its node's peer-pod capacity itself: `serve` patches its own Node's
status through the Kubernetes API (a fake API server on loopback, reached through a kubeconfig
as the client finds it), restores the count a kubelet restart zeroed, writes nothing while the
count is right, survives an API that refuses it, advertises no peer pod while /readyz fails
(and its capacity once it passes), and the manifests grant exactly the two calls it makes."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from adaptor.node.advertise import RESOURCE, CapacityAdvertiser, KubeNodeApi, NodeApiError
from adaptor.node.daemon import Daemon
from providers.core.base import Instance
from providers.core.contract import GPU_QUOTA_RESOURCE, MIG_QUOTA_RESOURCE
from providers.core.errors import PeerpodsError, ProviderError
from tests.adaptor.daemon_proc import daemon_settings
from tests.adaptor.fakes import FakeProvider
from tests.node.fake_nodes import FakeNodes, fake_nodes

ROOT = Path(__file__).resolve().parents[2]
ADAPTOR = ROOT / "config" / "deploy" / "adaptor"


@pytest.fixture
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        yield Path(directory)


@pytest.fixture
def api(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNodes]:
    with fake_nodes("worker-1", "worker-2") as fake:
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(root)))
        yield fake


async def _until(check: Callable[[], bool]) -> None:
    """Poll `check` for up to 10 s."""
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met within 10 s")


async def test_serve_advertises_and_restores_its_nodes_capacity(root: Path, api: FakeNodes) -> None:
    settings = daemon_settings(
        root, node_name="worker-1", vm_capacity=4, capacity_check_interval_seconds=0.1
    )
    daemon = Daemon(settings, provider=FakeProvider())
    await daemon.start()
    try:
        await _until(lambda: api.capacity("worker-1").get(RESOURCE) == "4")
        (patch,) = api.writes()
        assert (patch.method, patch.path) == ("PATCH", "/api/v1/nodes/worker-1/status")
        assert patch.content_type == "application/json-patch+json"
        assert patch.authorization == "Bearer node-token"
        assert patch.body == [
            {"op": "add", "path": "/status/capacity/kata.peerpods.io~1vm", "value": "4"},
            # what peer pods keep for namespace quotas, in plenty (never the bound)
            {"op": "add", "path": "/status/capacity/kata.peerpods.io~1gpu", "value": "4096"},
            {"op": "add", "path": "/status/capacity/kata.peerpods.io~1mig", "value": "4096"},
        ]
        # only its own resources on its own node change
        assert api.capacity("worker-1") == {
            "cpu": "8", "memory": "32Gi", "pods": "110", RESOURCE: "4",
            GPU_QUOTA_RESOURCE: "4096", MIG_QUOTA_RESOURCE: "4096",
        }  # fmt: skip
        assert RESOURCE not in api.capacity("worker-2")

        # a right count is only read, never rewritten
        reads = len(api.requests)
        await _until(lambda: len(api.requests) >= reads + 3)
        assert len(api.writes()) == 1

        # a kubelet restart zeroes extended resources it does not manage: put back
        api.set_capacity("worker-1", RESOURCE, "0")
        await _until(lambda: api.capacity("worker-1").get(RESOURCE) == "4")
        assert len(api.writes()) == 2
        assert [op["value"] for op in api.writes()[1].body] == ["4"]  # only what was wrong
    finally:
        await daemon.close()
    after = len(api.requests)
    await asyncio.sleep(0.3)
    assert len(api.requests) == after, "the advertiser outlived the daemon"


async def test_an_api_that_refuses_does_not_stop_serving(root: Path, api: FakeNodes) -> None:
    api.fail_with = 403
    settings = daemon_settings(
        root, node_name="worker-1", vm_capacity=2, capacity_check_interval_seconds=0.1
    )
    daemon = Daemon(settings, provider=FakeProvider())
    await daemon.start()
    try:
        assert settings.socket.exists()
        await _until(lambda: len(api.requests) >= 2)  # retried
        assert RESOURCE not in api.capacity("worker-1")
        api.fail_with = None  # RBAC fixed: advertised without a restart
        await _until(lambda: api.capacity("worker-1").get(RESOURCE) == "2")
    finally:
        await daemon.close()


async def test_without_a_node_name_the_api_is_never_called(root: Path, api: FakeNodes) -> None:
    daemon = Daemon(daemon_settings(root), provider=FakeProvider())
    await daemon.start()
    try:
        assert daemon.advertiser is None
    finally:
        await daemon.close()
    assert api.requests == []


async def test_advertise_reports_what_it_did(api: FakeNodes) -> None:
    advertiser = CapacityAdvertiser(KubeNodeApi(), "worker-2", 0)
    assert await advertiser.advertise() is True
    assert api.capacity("worker-2")[RESOURCE] == "0"
    assert await advertiser.advertise() is False
    missing = CapacityAdvertiser(KubeNodeApi(), "no-such-node", 1)
    with pytest.raises(NodeApiError, match="reading node no-such-node: HTTP 404"):
        await missing.advertise()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(PeerpodsError, match="no node name"):
        CapacityAdvertiser(KubeNodeApi(), "", 1)
    with pytest.raises(PeerpodsError, match="0 or more"):
        CapacityAdvertiser(KubeNodeApi(), "n", -1)
    with pytest.raises(PeerpodsError, match="vm_capacity"):
        daemon_settings(Path("/tmp/x"), vm_capacity=-1)


def test_no_kubernetes_configuration_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, root: Path
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(root / "missing"))
    with pytest.raises(NodeApiError, match="no Kubernetes configuration"):
        KubeNodeApi().capacity("worker-1")


def _docs(path: Path) -> list[dict[str, object]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_daemonset_advertises_through_the_adaptor_with_the_narrowest_rbac() -> None:
    (daemonset,) = _docs(ADAPTOR / "daemonset.yaml")
    spec = daemonset["spec"]["template"]["spec"]  # type: ignore[index]
    # no shell in someone else's image: nothing runs before the adaptor to advertise
    for container in spec.get("initContainers", []):
        assert "kubectl" not in container["image"], container
        assert container.get("command", [""])[0] not in ("/bin/sh", "sh"), container
    (adaptor,) = [c for c in spec["containers"] if c["name"] == "adaptor"]
    env = {e["name"]: e for e in adaptor["env"]}
    assert env["PEERPODS_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    config = next(d for d in _docs(ADAPTOR / "config.yaml") if d["kind"] == "ConfigMap")
    assert int(config["data"]["PEERPODS_VM_CAPACITY"]) > 0  # type: ignore[index]
    role = next(d for d in _docs(ADAPTOR / "rbac.yaml") if d["kind"] == "ClusterRole")
    rules = role["rules"]
    assert sorted(
        (tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"]))  # type: ignore[index]
        for r in rules  # type: ignore[attr-defined]
    ) == [(("",), ("nodes",), ("get",)), (("",), ("nodes/status",), ("patch",))]


class Unanswering(FakeProvider):
    """A cloud whose listing fails while `error` is set (no credentials, then fixed)."""

    def __init__(self) -> None:
        super().__init__()
        self.error: Exception | None = ProviderError("no credentials (AuthFailure)")

    async def list_owned(self) -> list[Instance]:
        if self.error is not None:
            raise self.error
        return await super().list_owned()


def _vm_values(api: FakeNodes) -> list[str]:
    """Every value the node's status patches gave kata.peerpods.io/vm, in order."""
    return [op["value"] for w in api.writes() for op in w.body if op["path"].endswith("~1vm")]


async def test_no_peer_pods_are_advertised_while_not_ready(root: Path, api: FakeNodes) -> None:
    api.set_capacity("worker-1", RESOURCE, "4")  # what the adaptor before this one advertised
    provider = Unanswering()
    settings = daemon_settings(
        root, node_name="worker-1", vm_capacity=4, capacity_check_interval_seconds=0.1
    )
    daemon = Daemon(settings, provider=provider)
    await daemon.start()
    try:
        assert daemon.readiness is not None
        await _until(lambda: api.capacity("worker-1").get(RESOURCE) == "0")
        ready, why = await daemon.readiness.check()
        assert not ready and "no credentials" in why
        assert _vm_values(api) == ["0"]
        # the quota resources stay: they only ever bind through a namespace's ResourceQuota
        assert api.capacity("worker-1")[GPU_QUOTA_RESOURCE] == "4096"
        provider.error = None  # credentials fixed: ready, and the capacity is back
        await daemon.readiness.ask_cloud()
        await _until(lambda: api.capacity("worker-1").get(RESOURCE) == "4")
        assert _vm_values(api) == ["0", "4"]
        provider.error = ProviderError("credentials revoked")  # unready again: 0 again
        await daemon.readiness.ask_cloud()
        await _until(lambda: api.capacity("worker-1").get(RESOURCE) == "0")
        assert _vm_values(api) == ["0", "4", "0"]
    finally:
        await daemon.close()


async def test_a_node_never_advertised_gets_its_capacity_only_once_ready(
    root: Path, api: FakeNodes
) -> None:
    provider = Unanswering()
    settings = daemon_settings(
        root, node_name="worker-2", vm_capacity=3, capacity_check_interval_seconds=0.1
    )
    daemon = Daemon(settings, provider=provider)
    await daemon.start()
    try:
        assert daemon.readiness is not None and daemon.advertiser is not None
        await _until(lambda: GPU_QUOTA_RESOURCE in api.capacity("worker-2"))
        reads = len(api.requests)
        await _until(lambda: len(api.requests) >= reads + 2)  # checked again, still unready
        assert RESOURCE not in api.capacity("worker-2")  # unset: no peer pod comes here
        provider.error = None
        await daemon.readiness.ask_cloud()
        await _until(lambda: api.capacity("worker-2").get(RESOURCE) == "3")
        assert _vm_values(api) == ["3"]
    finally:
        await daemon.close()
