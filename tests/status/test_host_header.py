"""The status API serves only requests addressed to this node: a Host header naming another
site (a page that rebound its name to 127.0.0.1) is 400, whatever the path."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import httpx
import pytest

from adaptor.state import StateStore
from adaptor.status import DeviceBook, build_app
from adaptor.status.hosts import host_allowed
from tests.adaptor.daemon_proc import ServeProcess

ALLOWED = ["127.0.0.1:8006", "127.0.0.1", "[::1]:8006", "::1", "10.0.0.5:8006", "localhost:8006",
           "LOCALHOST.", "node-a:8006", "node-a.", "Node-A"]  # fmt: skip
REFUSED = ["evil.example:8006", "evil.example", "127.0.0.1.nip.io:8006", "localhost.evil.example",
           "node-a.evil.example", "0x7f.1", "", ":8006", "[::1"]  # fmt: skip


@pytest.mark.parametrize("host", ALLOWED)
def test_ip_addresses_localhost_and_node_names_are_ours(host: str) -> None:
    assert host_allowed(host, ["node-a", ""])


@pytest.mark.parametrize("host", REFUSED)
def test_other_names_are_not(host: str) -> None:
    assert not host_allowed(host, ["node-a", ""])


async def test_every_path_refuses_a_foreign_host(tmp_path: Path) -> None:
    store = await StateStore.open(tmp_path)
    app = build_app(store, DeviceBook(), host_names=["node-a"])
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8006") as c:
            for path in ("/healthz", "/metrics", "/v1/sandboxes", "/v1/sandboxes/x", "/nope"):
                refused = await c.get(path, headers={"Host": "evil.example:8006"})
                assert refused.status_code == 400, path
                assert refused.json()["code"] == "bad_host"
            assert (await c.get("/healthz")).status_code == 200
            assert (await c.get("/healthz", headers={"Host": "node-a:8006"})).status_code == 200
            two = await c.get("/healthz", headers=[("Host", "127.0.0.1"), ("Host", "evil")])
            assert two.status_code == 400
    finally:
        await store.close()


async def test_serve_knows_its_own_names() -> None:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        proc = ServeProcess(
            Path(directory),
            ["--provider", "static", "--static-endpoints", "127.0.0.1:1", "--no-agent-tls",
             "--node-name", "worker-7"],
        )  # fmt: skip
        await proc.start()
        try:
            async with httpx.AsyncClient(base_url=proc.status_url, timeout=10) as http:
                assert (await http.get("/healthz")).status_code == 200
                for name in ("worker-7", socket.gethostname()):
                    answer = await http.get("/healthz", headers={"Host": f"{name}:8006"})
                    assert answer.status_code == 200, name
                answer = await http.get("/v1/sandboxes", headers={"Host": "rebound.example"})
                assert answer.status_code == 400
        finally:
            await proc.kill()
