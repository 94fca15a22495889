"""StopVM with the state store on a full disk (a 1 MiB tmpfs over the state dir, filled up): the
VM is deleted all the same, or the caller is told it was not; StopVM never answers OK while
something is owed; once space returns, every owed write lands and nothing is left.

Mounting needs root: without it these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from adaptor.node.daemon import Daemon
from adaptor.state import StateError
from adaptor.ttrpc import Code
from providers.core.base import Instance
from tests.adaptor.daemon_proc import ANNOTATIONS, daemon_settings
from tests.adaptor.moto_daemon import moto_aws, moto_settings
from tests.shim_emulator import PodVMAgent, ShimEmulator

OWNER = "full-disk-owner"


@pytest.fixture
def root() -> Iterator[Path]:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the full-disk tests must run in CI: they need root to mount a tmpfs")
        pytest.skip("needs root to mount a tmpfs")
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        state = Path(directory) / "state"
        state.mkdir(mode=0o700)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", state], check=True
        )
        try:
            yield Path(directory)
        finally:
            subprocess.run(["umount", "-l", state], check=True)


class Disk:
    """Fills the state dir's filesystem to the last byte, and frees it again."""

    def __init__(self, directory: Path) -> None:
        self.filler = directory / "filler"

    def fill(self) -> None:
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for size in (65536, 4096, 1):
                with contextlib.suppress(OSError):
                    while os.write(fd, b"\0" * size):
                        pass
        finally:
            os.close(fd)
        assert os.statvfs(self.filler.parent).f_bavail == 0

    def free(self) -> None:
        self.filler.unlink()


@pytest.fixture
async def pod_vm() -> AsyncIterator[tuple[PodVMAgent, str]]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
    agent = await PodVMAgent.start(listener)
    yield agent, endpoint
    await agent.close()


async def until(check: Callable[[], Any], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def assert_store_refuses(daemon: Daemon) -> None:
    """The disk is really full: the store cannot take a write."""
    assert daemon.store is not None
    with pytest.raises(StateError):
        await daemon.store.acquire_lease("probe", "probe", ["x"])


async def test_static_stopvm_on_a_full_disk_says_the_endpoint_is_still_held(
    root: Path, pod_vm: tuple[PodVMAgent, str]
) -> None:
    _, endpoint = pod_vm
    settings = daemon_settings(
        root, provider="static", static_endpoints=endpoint, status_address="", stop_wait_seconds=2
    )
    daemon = Daemon(settings)
    await daemon.start()
    disk = Disk(settings.state_dir)
    shim = ShimEmulator(str(settings.socket), "sb", ANNOTATIONS)
    try:
        await shim.run_pod()
        store = daemon.store
        assert store is not None
        await asyncio.to_thread(disk.fill)
        await assert_store_refuses(daemon)
        outcome = await shim.stop_vm()
        # The static "VM" is its endpoint lease, which lives in the full store: not freed.
        assert outcome.connected and outcome.code != Code.OK, outcome
        assert "delete of VM" in outcome.message and "retried" in outcome.message
        assert await store.leases("static") == {endpoint: "sb"}
        await asyncio.to_thread(disk.free)

        async def gone() -> bool:
            return await store.records() == [] and await store.leases("static") == {}

        await until(gone, 30, "the owed teardown to land")
    finally:
        await shim.close()
        await daemon.close(0)


@pytest.fixture
def moto_port() -> Iterator[int]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        yield int(server.get_host_and_port()[1])
    finally:
        server.stop()


def live_vms(moto_port: int) -> list[str]:
    import boto3

    client = boto3.session.Session().client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=f"http://127.0.0.1:{moto_port}",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    out = client.describe_instances(
        Filters=[
            {"Name": "tag:peerpods-owner", "Values": [OWNER]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )
    return [vm["InstanceId"] for r in out["Reservations"] for vm in r["Instances"]]


async def test_moto_stopvm_on_a_full_disk_deletes_the_vm_and_says_the_record_is_owed(
    root: Path, pod_vm: tuple[PodVMAgent, str], moto_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    _, endpoint = pod_vm
    host, port = endpoint.rsplit(":", 1)

    def resolve(instance: Instance) -> tuple[str, int]:
        return host, int(port)

    settings = moto_settings(root, OWNER, gc_interval_seconds=0, stop_wait_seconds=20)
    daemon = Daemon(
        settings,
        provider=moto_aws(moto_port, OWNER, zones=("us-east-1a",)),
        resolve_endpoint=resolve,
    )
    await daemon.start()
    disk = Disk(settings.state_dir)
    shim = ShimEmulator(str(settings.socket), "sb", ANNOTATIONS)
    try:
        await shim.run_pod()
        store = daemon.store
        assert store is not None
        assert len(await asyncio.to_thread(live_vms, moto_port)) == 1
        await asyncio.to_thread(disk.fill)
        await assert_store_refuses(daemon)
        outcome = await shim.stop_vm()
        assert outcome.connected and outcome.code != Code.OK, outcome
        assert "the VM is deleted" in outcome.message, outcome
        assert await asyncio.to_thread(live_vms, moto_port) == []
        (record,) = await store.records()
        assert record.state.value == "running"  # nothing could be written yet
        await asyncio.to_thread(disk.free)

        async def gone() -> bool:
            return await store.records() == []

        await until(gone, 30, "the owed record removal to land")
    finally:
        await shim.close()
        await daemon.close(0)
