"""Unreadable state rows do not stop `peerpods serve`: after a kill -9, rows that cannot be read
(bad JSON, an unknown state, a malformed instance, a tunnel or device plan with a wrongly typed
field) are quarantined, logged by id and shown by the status API, and the node's valid sandbox
is served again and can be stopped."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.adaptor.daemon_proc import ServeProcess
from tests.go.peers import echo_server

pytestmark = pytest.mark.go

GOOD = "6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b"
NETWORK = {
    "podip": "10.128.0.9/24",
    "pod-hw-addr": "0a:58:0a:80:00:09",
    "interface": "eth0",
    "worker-node-ip": "192.168.0.2/16",
    "tunnel-type": "vxlan",
    "routes": [],
    "neighbors": None,
    "mtu": "x",
    "index": 0,
    "vxlan-port": 4789,
    "vxlan-id": 555000,
}
TUNNEL = {"v": 1, "netns": "/run/netns/cni-gone", "network": NETWORK, "remote": "",
          "state": "inspected", "error": ""}  # fmt: skip
# id -> (annotations, state, instance, device plan, pod network)
BAD = {
    "bad-json": ("{not json", "running", None, "", ""),
    "bad-state": ("{}", "exploded", None, "", ""),
    "bad-instance": ("{}", "running", '{"no-id": 1}', "", ""),
    "bad-tunnel": ("{}", "running", None, "", json.dumps(TUNNEL)),
    "bad-plan": ("{}", "running", None, '{"gpus": 7}', ""),
}


@pytest.fixture
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        yield Path(directory)


def _corrupt(db_path: Path) -> None:
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        for sandbox_id, (annotations, state, instance, plan, tunnel) in BAD.items():
            db.execute(
                "INSERT INTO sandboxes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (sandbox_id, "ns", "p", annotations, "", "", state, "", instance, 1.0, 1.0, plan,
                 tunnel),
            )  # fmt: skip
        db.commit()


async def test_bad_rows_are_quarantined_and_the_rest_served(root: Path) -> None:
    async with echo_server() as pod_vm:
        args = ["--provider", "static", "--static-endpoints", pod_vm.address, "--no-agent-tls",
                "--proxy-timeout", "20s", "--shutdown-grace", "1s"]  # fmt: skip
        first = ServeProcess(root, args)
        await first.start()
        try:
            assert (await first.create_vm(GOOD))["code"] == 0, first.log()
            assert (await first.start_vm(GOOD))["code"] == 0, first.log()
        finally:
            await first.kill()
        _corrupt(first.state_db)

        second = ServeProcess(root, args)
        await second.start()  # raises if serve does not come up
        try:
            async with httpx.AsyncClient(base_url=second.status_url, timeout=10) as http:
                listed = {s["id"]: s for s in (await http.get("/v1/sandboxes")).json()["sandboxes"]}
                assert listed[GOOD]["state"] == "running"
                for sandbox_id in BAD:
                    assert listed[sandbox_id]["state"] == "quarantined", listed
                    assert listed[sandbox_id]["reason"].startswith("unreadable record: ")
                    one = (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()
                    assert one["state"] == "quarantined"
                    assert f"sandbox '{sandbox_id}' quarantined" in second.log()
                assert "exploded" in listed["bad-state"]["reason"]
                assert "invalid literal for int()" in listed["bad-tunnel"]["reason"]
                assert "DevicePlan" in listed["bad-plan"]["reason"]
                scrape = (await http.get("/metrics")).text
                assert f'peerpods_sandboxes{{state="quarantined"}} {len(BAD)}.0' in scrape
            # the valid sandbox is still served: it stops cleanly
            assert (await second.stop_vm(GOOD))["code"] == 0, second.log()
            # a quarantined one is refused with its reason, and left in place
            refused = await second.stop_vm("bad-json")
            assert refused["code"] != 0 and "quarantined" in refused["message"]
            assert second.rows("SELECT id FROM sandboxes WHERE id='bad-json'") == [("bad-json",)]
        finally:
            await second.kill()
