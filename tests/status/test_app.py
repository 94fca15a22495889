"""The status API over a real state store: sandbox views, device status, errors, metrics."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from adaptor.state import SandboxRecord, SandboxState, StateStore
from adaptor.status import DeviceBook, DeviceState, build_app
from adaptor.status.app import refresh_sandbox_gauge
from providers.core.base import Instance


async def _client(tmp_path: Path) -> tuple[httpx.AsyncClient, StateStore, DeviceBook]:
    store = await StateStore.open(tmp_path)
    devices = DeviceBook()
    app = build_app(store, devices, refresh_metrics=lambda: refresh_sandbox_gauge(store))
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8006"
    )
    return client, store, devices


async def test_sandbox_views_follow_state_and_devices(tmp_path: Path) -> None:
    client, store, devices = await _client(tmp_path)
    try:
        await store.put(SandboxRecord(id="sb1", pod_namespace="ml", pod_name="train"))
        listed = (await client.get("/v1/sandboxes")).json()["sandboxes"]
        assert [(s["id"], s["state"], s["vm_id"]) for s in listed] == [("sb1", "created", "")]

        instance = Instance(
            id="i-0abc",
            name="peerpods-sb1",
            addresses=("10.0.0.5",),
            instance_type="g6.xlarge",
            zone="us-east-1a",
        )
        record = await store.get("sb1")
        assert record is not None
        await store.put(record.evolve(state=SandboxState.RUNNING, instance=instance))
        devices.set_devices("sb1", "cuda", ("nvidia.com/gpu=0",))
        devices.set_devices("sb1", "sidecar", ())
        devices.mark("sb1", "cuda", DeviceState.FAILED, "agent: CDI device not found")

        one = (await client.get("/v1/sandboxes/sb1")).json()
        assert one["state"] == "running"
        assert (one["instance_type"], one["vm_id"], one["zone"]) == (
            "g6.xlarge",
            "i-0abc",
            "us-east-1a",
        )
        assert one["pod"] == {"namespace": "ml", "name": "train"}
        assert one["containers"]["cuda"] == {
            "devices": ["nvidia.com/gpu=0"],
            "state": "failed",
            "reason": "agent: CDI device not found",
        }
        assert one["containers"]["sidecar"]["state"] == "pending"
    finally:
        await client.aclose()
        await store.close()


async def test_errors_are_json_with_http_status(tmp_path: Path) -> None:
    client, store, _ = await _client(tmp_path)
    try:
        missing = await client.get("/v1/sandboxes/nope")
        assert missing.status_code == 404
        assert missing.json() == {"code": "not_found", "message": "no sandbox 'nope'"}
        unknown_route = await client.get("/v2/things")
        assert unknown_route.status_code == 404 and unknown_route.json()["code"] == "not_found"
        wrong_method = await client.post("/v1/sandboxes")
        assert (
            wrong_method.status_code == 405 and wrong_method.json()["code"] == "method_not_allowed"
        )
        assert (await client.get("/healthz")).text == "ok"
    finally:
        await client.aclose()
        await store.close()


async def test_metrics_count_sandboxes_by_state(tmp_path: Path) -> None:
    client, store, _ = await _client(tmp_path)
    try:
        for i, state in enumerate(
            [SandboxState.RUNNING, SandboxState.RUNNING, SandboxState.FAILED]
        ):
            await store.put(
                SandboxRecord(id=f"s{i}", pod_namespace="d", pod_name=f"p{i}", state=state)
            )
        text = (await client.get("/metrics")).text
        family = next(
            f for f in text_string_to_metric_families(text) if f.name == "peerpods_sandboxes"
        )
        values = {s.labels["state"]: s.value for s in family.samples}
        assert values["running"] == 2 and values["failed"] == 1 and values["created"] == 0
    finally:
        await client.aclose()
        await store.close()


async def test_each_sandbox_shows_its_pod_network(tmp_path: Path) -> None:
    from adaptor.podnet import PodNetwork, Route, Tunnel, TunnelState

    client, store, _book = await _client(tmp_path)
    network = PodNetwork(
        pod_ip="10.244.1.21/24",
        pod_hw_addr="32:b9:59:6b:f0:d5",
        interface="eth0",
        worker_node_ip="10.224.0.5/16",
        routes=(Route("0.0.0.0/0", "10.244.1.1", "eth0", "boot"),),
        neighbors=(),
        mtu=1500,
        index=2,
        vxlan_port=4789,
        vxlan_id=555002,
    )
    tunnel = Tunnel("/var/run/netns/cni-1", network, "10.224.0.9", TunnelState.READY)
    try:
        await store.put(SandboxRecord("with", "ns", "a", pod_network=tunnel.to_json()))
        await store.put(SandboxRecord("without", "ns", "b"))
        body = (await client.get("/v1/sandboxes/with")).json()
        assert body["pod_network"] == {
            "pod_ip": "10.244.1.21/24",
            "interface": "eth0",
            "vni": 555002,
            "vxlan_port": 4789,
            "worker_ip": "10.224.0.5/16",
            "remote": "10.224.0.9",
            "netns": "/var/run/netns/cni-1",
            "state": "ready",
            "error": "",
        }
        assert (await client.get("/v1/sandboxes/without")).json()["pod_network"] is None
    finally:
        await client.aclose()
        await store.close()
