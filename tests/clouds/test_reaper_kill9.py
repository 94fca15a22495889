"""kill -9 in the middle of StartVM, and no StopVM ever after (the pod is gone, or runtime-rs
gave up after 1 s): each round leaves a VM running on moto with its sandbox recorded, so the
orphan collector rightly keeps it. The restarted daemon's reaper deletes every one once the
grace period has passed, and counts them; the records stay, failed and without a VM, for a
StopVM that may still come."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adaptor.ttrpc import Client
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from tests.adaptor.daemon_proc import ANNOTATIONS, HYPERVISOR
from tests.adaptor.moto_daemon import OWNER

pytestmark = pytest.mark.slow

ROUNDS = 3
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def ec2(port: int) -> Any:
    import boto3

    return boto3.session.Session().client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=f"http://127.0.0.1:{port}",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def live_owned(client: Any) -> dict[str, str]:
    """sandbox id -> instance id of every live VM carrying our owner tag."""
    out = client.describe_instances(
        Filters=[
            {"Name": "tag:peerpods-owner", "Values": [OWNER]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )
    found = {}
    for reservation in out["Reservations"]:
        for vm in reservation["Instances"]:
            tags = {t["Key"]: t["Value"] for t in vm.get("Tags", [])}
            found[tags.get("peerpods-sandbox", "")] = vm["InstanceId"]
    return found


class Daemon:
    def __init__(self, root: Path, port: int, reap_grace: float) -> None:
        self.root, self.port, self.reap_grace = root, port, reap_grace
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Daemon:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PEERPODS_")}
        env |= {"PYTHONPATH": str(ROOT), "AWS_ACCESS_KEY_ID": "testing"}
        env |= {"AWS_SECRET_ACCESS_KEY": "testing"}
        log = (self.root / "daemon.log").open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.adaptor.moto_daemon",
            str(self.root),
            str(self.port),
            str(self.reap_grace),
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=ROOT,
            env=env,
        )
        log.close()
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        assert b"listening" in line, (self.root / "daemon.log").read_text()
        return self

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


@pytest.fixture
def root() -> Iterator[Path]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        yield Path(directory)


async def until(check: Any, seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        found = await asyncio.to_thread(check)
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def kill_mid_start(root: Path, moto_port: int, cloud: Any, sandbox: str) -> None:
    """CreateVM, StartVM, and kill -9 once the VM exists (StartVM waits for its forwarder)."""
    async with Daemon(root, moto_port, reap_grace=3600) as daemon:
        shim = await Client.connect_unix(str(root / "hv.sock"))
        async with shim:
            create = pb.CreateVMRequest(id=sandbox, annotations=ANNOTATIONS)
            await shim.call(HYPERVISOR, "CreateVM", create.SerializeToString())
            start = pb.StartVMRequest(id=sandbox).SerializeToString()
            starting = asyncio.ensure_future(shim.call(HYPERVISOR, "StartVM", start))
            await until(lambda: sandbox in live_owned(cloud), 60, f"{sandbox}'s VM")
            await daemon.kill9()
            with contextlib.suppress(Exception):
                await starting


async def test_kill_9_mid_startvm_and_no_stopvm_ends_with_no_vm(root: Path, moto_port: int) -> None:
    cloud = ec2(moto_port)
    for n in range(ROUNDS):
        await kill_mid_start(root, moto_port, cloud, f"kill9-{n}")
    assert sorted(live_owned(cloud)) == [f"kill9-{n}" for n in range(ROUNDS)]

    async with Daemon(root, moto_port, reap_grace=1):
        await until(lambda: not live_owned(cloud), 120, "the reaper")
        db = root / "state" / "sandboxes.db"

        def rows() -> list[tuple[str, str, Any, str]]:
            with contextlib.closing(sqlite3.connect(db)) as conn:
                query = "SELECT id, state, instance, reason FROM sandboxes ORDER BY id"
                return list(conn.execute(query).fetchall())

        def settled() -> list[tuple[str, str, Any, str]] | None:
            found = rows()
            return found if all(r[2] is None for r in found) else None

        recorded = await until(settled, 30, "the records to drop their VMs")
    assert [(r[0], r[1]) for r in recorded] == [(f"kill9-{n}", "failed") for n in range(ROUNDS)]
    assert all("reaper" in r[3] for r in recorded), recorded
