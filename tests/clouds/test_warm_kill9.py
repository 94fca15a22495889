"""kill -9 of a real `peerpods serve` (aws provider, moto's EC2 server, latency-modelled) with a
warm pool, during a refill and during an adoption, then a restart over the same state: no pool
VM leaks, none is adopted twice, and the pod that was starting fails with a status (its VM then
deleted by the reaper), never runs as well; a hand-off to a successor keeps the pool as it is.
The warm VMs' guests are played by this test
(tests.clouds.latency.Guests), outside the killed process, as a VM outlives its adaptor."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adaptor.ttrpc import Client
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from adaptor.warmpool import CLAIMS
from providers.core.base import TAG_SANDBOX
from providers.core.warm import TAG_WARM_POOL, TAG_WARM_SLOT
from tests.adaptor.daemon_proc import ANNOTATIONS, HYPERVISOR
from tests.clouds.latency import Guests, LatencyModel
from tests.clouds.test_reaper_kill9 import ec2, moto_port, until
from tests.clouds.warm_daemon import OWNER, TYPE, ZONE

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
__all__ = ["moto_port"]  # the moto server fixture, shared with the reaper's kill -9 test


@pytest.fixture
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pk", dir="/tmp") as directory:
        yield Path(directory)


class Serve:
    """tests.clouds.warm_daemon as a process."""

    def __init__(self, root: Path, port: int, model: LatencyModel, **settings: Any) -> None:
        self.root, self.port = root, port
        self.config = {
            "model": {
                "launch": model.launch,
                "first_boot": model.first_boot,
                "image_pull": model.image_pull,
                "start": model.start,
                "scale": model.scale,
            },
            "settings": {
                "warm_pools": [f"{TYPE}=2@{ZONE}"],
                "warm_pool_interval_seconds": 0.2,
                "gc_interval_seconds": 0,
                "proxy_timeout_seconds": 120,
                "shutdown_grace_seconds": 1,
                "account_quota_refresh_seconds": 3600,
                "status_address": "127.0.0.1:0",
                **settings,
            },
        }
        self.proc: asyncio.subprocess.Process | None = None
        self.status_url = ""

    async def __aenter__(self) -> Serve:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PEERPODS_")}
        env |= {"PYTHONPATH": str(ROOT), "AWS_ACCESS_KEY_ID": "testing"}
        env |= {"AWS_SECRET_ACCESS_KEY": "testing"}
        log = (self.root / "daemon.log").open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.clouds.warm_daemon",
            str(self.root),
            str(self.port),
            json.dumps(self.config),
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=ROOT,
            env=env,
        )
        log.close()
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        assert b"listening" in line, (self.root / "daemon.log").read_text()
        self.status_url = line.decode().split("status API ", 1)[1].rstrip(")\n")
        return self

    def warm(self) -> int:
        """The warm VMs the daemon's pool holds, as its status API lists them."""
        with urllib.request.urlopen(f"{self.status_url}/v1/warm-pool", timeout=10) as answer:
            listed = json.loads(answer.read())
        return sum(1 for vm in listed["vms"] if vm["state"] == "warm")

    async def kill9(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                await self.kill9()

    def rows(self, query: str) -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(self.root / "state" / "sandboxes.db")) as db:
            return list(db.execute(query).fetchall())


def owned(client: Any, *states: str) -> list[dict[str, Any]]:
    out = client.describe_instances(
        Filters=[
            {"Name": "tag:peerpods-owner", "Values": [OWNER]},
            {"Name": "instance-state-name", "Values": list(states)},
        ]
    )
    return [vm for r in out["Reservations"] for vm in r["Instances"]]


def tags(raw: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}


def pool_vms(client: Any, *states: str) -> list[dict[str, Any]]:
    return [vm for vm in owned(client, *states) if TAG_WARM_POOL in tags(vm)]


@contextlib.asynccontextmanager
async def guests(client: Any, model: LatencyModel) -> Any:
    played = Guests(client, model, OWNER)
    task = asyncio.ensure_future(played.run())
    try:
        yield played
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


LIVE = ("pending", "running", "stopping", "stopped")


def ours(log: Path) -> str:
    """The daemon's own log lines (not the SDK's), the last of them."""
    lines = log.read_text(errors="replace").splitlines()
    return "\n".join(line for line in lines if " adaptor." in line)[-5000:]


async def test_kill_9_during_a_refill_keeps_the_pool_without_a_leak(
    root: Path, moto_port: int
) -> None:
    cloud = ec2(moto_port)
    model = LatencyModel(scale=0.02)  # warm-up (boot and pull) 2.6 s
    async with guests(cloud, model):
        async with Serve(root, moto_port, model) as serve:
            # both slots launched, their VMs still booting: kill
            await until(lambda: len(pool_vms(cloud, "running")) == 2, 60, "the refill")
            booting = {vm["InstanceId"] for vm in pool_vms(cloud, "running")}
            await serve.kill9()
        recorded = serve.rows("SELECT endpoint FROM leases WHERE pool='warm-pool'")
        assert len(recorded) == 2  # recorded before their launch
        async with Serve(root, moto_port, model) as serve:
            await until(lambda: serve.warm() == 2, 60, "the pool warm")
            await asyncio.sleep(1.0)  # a few more passes: nothing more may be launched
            live = pool_vms(cloud, *LIVE)
            # the same two VMs, watched again after the restart: none leaked, none doubled
            assert {vm["InstanceId"] for vm in live} == booting
            assert all(vm["State"]["Name"] == "stopped" for vm in live)
            slots = {tags(vm)[TAG_WARM_SLOT] for vm in live}
            assert slots == {r[0] for r in recorded}


async def test_kill_9_during_an_adoption_fails_the_pod_and_adopts_nothing_twice(
    root: Path, moto_port: int
) -> None:
    cloud = ec2(moto_port)
    # the adoption's start takes 4 s: the kill lands in it
    model = LatencyModel(launch=5, first_boot=20, image_pull=20, start=400, scale=0.01)
    pod = "adopt-kill9"
    async with guests(cloud, model):
        async with Serve(root, moto_port, model, reap_grace_seconds=3600) as serve:
            await until(lambda: serve.warm() == 2, 60, "the pool warm")
            shim = await Client.connect_unix(str(root / "hv.sock"))
            async with shim:
                create = pb.CreateVMRequest(id=pod, annotations=ANNOTATIONS)
                await shim.call(HYPERVISOR, "CreateVM", create.SerializeToString())
                start = pb.StartVMRequest(id=pod).SerializeToString()
                starting = asyncio.ensure_future(shim.call(HYPERVISOR, "StartVM", start))

                def adopting() -> list[dict[str, Any]]:
                    vms = [vm for vm in owned(cloud, "running") if tags(vm).get(TAG_SANDBOX) == pod]
                    claims = serve.rows(f"SELECT sandbox_id FROM leases WHERE pool='{CLAIMS}'")
                    return vms if vms and claims == [(pod,)] else []

                try:
                    (adopted,) = await until(adopting, 60, "the adoption under way")
                except AssertionError:
                    raise AssertionError(ours(root / "daemon.log")) from None
                await serve.kill9()
                with contextlib.suppress(Exception):
                    await starting
        adopted_id = adopted["InstanceId"]
        # restarted with a short reap grace: the pod failed with the restart, its VM is reaped
        async with Serve(root, moto_port, model, reap_grace_seconds=1) as serve:

            def settled() -> bool:
                gone = adopted_id not in {vm["InstanceId"] for vm in owned(cloud, *LIVE)}
                return gone and serve.warm() == 2

            await until(settled, 90, "the reaper and the refill")
            (state, reason, instance) = serve.rows(
                f"SELECT state, reason, instance FROM sandboxes WHERE id='{pod}'"
            )[0]
            assert state == "failed" and "restarted during StartVM" in reason
            claims = serve.rows("SELECT * FROM leases WHERE pool='warm-pool-claim'")
            assert claims == []
            pool = pool_vms(cloud, *LIVE)
            assert adopted_id not in {vm["InstanceId"] for vm in pool}  # never adopted again
            assert len(pool) == 2  # the pool refilled to its size, nothing more
            # nothing of the pod runs: no VM carries its sandbox tag any more
            assert [vm for vm in owned(cloud, *LIVE) if tags(vm).get(TAG_SANDBOX) == pod] == []
        assert instance is None or adopted_id in instance


async def test_a_hand_off_keeps_the_pool(root: Path, moto_port: int) -> None:
    cloud = ec2(moto_port)
    model = LatencyModel(scale=0.01)
    async with guests(cloud, model), Serve(root, moto_port, model) as first:
        await until(lambda: first.warm() == 2, 60, "the pool warm")
        kept = {vm["InstanceId"] for vm in pool_vms(cloud, *LIVE)}
        assert len(kept) == 2
        # a second serve over the same state takes the sockets over (an upgrade)
        async with Serve(root, moto_port, model) as second:
            assert first.proc is not None
            await asyncio.wait_for(first.proc.wait(), 60)  # the predecessor ends
            await until(lambda: second.warm() == 2, 60, "the pool after the hand-off")
            await asyncio.sleep(1.0)  # a few passes: nothing launched, nothing deleted
            assert {vm["InstanceId"] for vm in pool_vms(cloud, *LIVE)} == kept
            assert first.proc.returncode == 0  # it handed over and exited, pool kept
