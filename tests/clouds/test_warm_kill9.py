"""kill -9 of a real `peerpods serve` with a warm pool, during a refill and during an adoption,
then a restart over the same state, on each cloud (aws against moto's EC2 server; gcp and azure
against the repository's fakes, served on loopback by this test: tests.clouds.fake_relay), all
latency-modelled: no pool VM leaks, none is adopted twice, and the pod that was starting fails
with a status (its VM then deleted by the reaper), never runs as well; a hand-off to a successor
keeps the pool as it is. The warm VMs' guests are played by this test (tests.clouds.latency.
Guests), outside the killed process, as a VM outlives its adaptor."""

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
import time
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adaptor.ttrpc import Client
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from adaptor.warmpool import CLAIMS
from providers.core.base import TAG_SANDBOX
from providers.core.warm import TAG_WARM_POOL, TAG_WARM_SLOT
from tests.adaptor.daemon_proc import ANNOTATIONS, HYPERVISOR
from tests.clouds.fake_arm import FakeArm, arm_error
from tests.clouds.fake_gce import FakeGce, http_error
from tests.clouds.fake_relay import FakeServer
from tests.clouds.latency import Guests, LatencyModel
from tests.clouds.test_reaper_kill9 import ec2, moto_port, until
from tests.clouds.warm_daemon import OWNER, PLACES
from tests.providers.fakes.http import FakeCloud

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
__all__ = ["moto_port"]  # the moto server fixture, shared with the reaper's kill -9 test


@pytest.fixture
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pk", dir="/tmp") as directory:
        yield Path(directory)


class Serve:
    """tests.clouds.warm_daemon as a process."""

    def __init__(self, root: Path, cloud: Cloud, model: LatencyModel, **settings: Any) -> None:
        self.root, self.port = root, cloud.port
        instance_type, zone = PLACES[cloud.name]
        self.config = {
            "cloud": cloud.name,
            "model": {
                "launch": model.launch,
                "first_boot": model.first_boot,
                "image_pull": model.image_pull,
                "start": model.start,
                "scale": model.scale,
            },
            "settings": {
                "warm_pools": [f"{instance_type}=2@{zone}"],
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


@dataclass(frozen=True)
class VM:
    """A VM as the test reads it from any cloud: its id, its state in EC2's words, its tags
    (GCP: labels)."""

    id: str
    state: str
    tags: dict[str, str]


class Cloud(ABC):
    """One cloud's API at a loopback port, as the killed serve and the test both see it."""

    name = ""
    port = 0

    @abstractmethod
    def vms(self) -> list[VM]:
        """Every VM carrying the owner tag, in any state but gone."""

    @abstractmethod
    def guests(self, model: LatencyModel) -> Guests:
        """The modelled guests' power-offs, played on this cloud."""


class HoldingCloud(Cloud):
    """A cloud whose fake can hold a call (the GCE and ARM fakes; moto's server cannot)."""

    @abstractmethod
    def hold_next(self, action: str, seconds: float) -> None:
        """The next call of `action` on a VM (start, setLabels) is held that long, then refused
        (never applied): a serve killed meanwhile leaves its VM as the adoption had made it."""


def held(action: str, seconds: float, refusal: Any) -> Any:
    """A fake's fault: the first `action` waits, then answers `refusal`."""
    left = [1]

    def fault(name: str, *_: Any) -> Any:
        if name != action or not left[0]:
            return None
        left[0] = 0
        time.sleep(seconds)  # in the fake server's thread of this request
        return refusal

    return fault


class Ec2(Cloud):
    name = "aws"

    def __init__(self, port: int) -> None:
        self.port = port
        self.client = ec2(port)

    def vms(self) -> list[VM]:
        out = self.client.describe_instances(
            Filters=[
                {"Name": "tag:peerpods-owner", "Values": [OWNER]},
                {"Name": "instance-state-name", "Values": list(LIVE)},
            ]
        )
        return [
            VM(vm["InstanceId"], vm["State"]["Name"], {t["Key"]: t["Value"] for t in vm["Tags"]})
            for r in out["Reservations"]
            for vm in r["Instances"]
        ]

    def guests(self, model: LatencyModel) -> Guests:
        return Guests(self.client, model, OWNER)


# GCE statuses and ARM power states in EC2's words
GCE_STATES = {"RUNNING": "running", "TERMINATED": "stopped", "STOPPING": "stopping"}
ARM_STATES = {
    "PowerState/starting": "pending",
    "PowerState/running": "running",
    "PowerState/stopped": "stopping",  # powered off, still allocated: not yet warm
    "PowerState/deallocating": "stopping",
    "PowerState/deallocated": "stopped",
}


class Gce(HoldingCloud):
    name = "gcp"

    def __init__(self, fake: FakeGce, port: int) -> None:
        self.fake, self.port = fake, port

    def vms(self) -> list[VM]:
        found = []
        with self.fake._lock:
            for (zone, name), raw in self.fake.instances.items():
                # the labels, and the exact values the provider keeps in the metadata
                meta = {i["key"]: i["value"] for i in raw["metadata"].get("items", [])}
                tags = {**raw["labels"], **{k: v for k, v in meta.items() if k != "user-data"}}
                state = GCE_STATES.get(raw["status"], raw["status"])
                found.append(VM(f"{zone}/{name}", state, tags))
        return [vm for vm in found if vm.tags.get("peerpods-owner") == OWNER]

    def guests(self, model: LatencyModel) -> Guests:
        return GceGuests(self.fake, model)

    def hold_next(self, action: str, seconds: float) -> None:
        refusal = http_error(503, "backendError", "held, then refused")
        self.fake.faults.append(held(action, seconds, refusal))


class Arm(HoldingCloud):
    name = "azure"

    def __init__(self, fake: FakeArm, port: int) -> None:
        self.fake, self.port = fake, port

    def vms(self) -> list[VM]:
        with self.fake._lock:
            found = [
                VM(name, ARM_STATES[vm.get("_power", "PowerState/running")], dict(vm["tags"]))
                for name, vm in self.fake.vms.items()
            ]
        return [vm for vm in found if vm.tags.get("peerpods-owner") == OWNER]

    def guests(self, model: LatencyModel) -> Guests:
        return ArmGuests(self.fake, model)

    def hold_next(self, action: str, seconds: float) -> None:
        refusal = arm_error(409, "OperationNotAllowed", "held, then refused")
        self.fake.faults.append(held(action, seconds, refusal))


class GceGuests(Guests):
    """A warm VM's guest powering itself off: GCE shows the instance TERMINATED."""

    def __init__(self, fake: FakeGce, model: LatencyModel) -> None:
        super().__init__(None, model, OWNER)
        self.fake = fake

    def running(self) -> list[str]:
        with self.fake._lock:
            return [
                f"{zone}/{name}"
                for (zone, name), raw in self.fake.instances.items()
                if raw["status"] == "RUNNING" and raw["labels"].get(TAG_WARM_POOL) == OWNER
            ]

    def power_off(self, instance_id: str) -> None:
        zone, _, name = instance_id.partition("/")
        with self.fake._lock:
            raw = self.fake.instances.get((zone, name))
            if raw is not None and raw["status"] == "RUNNING":
                raw["status"] = "TERMINATED"


class ArmGuests(Guests):
    """A warm VM's guest powering itself off: ARM shows it stopped, still allocated."""

    def __init__(self, fake: FakeArm, model: LatencyModel) -> None:
        super().__init__(None, model, OWNER)
        self.fake = fake

    def running(self) -> list[str]:
        with self.fake._lock:
            return [
                name
                for name, vm in self.fake.vms.items()
                if vm.get("_power", "PowerState/running") == "PowerState/running"
                and vm["tags"].get(TAG_WARM_POOL) == OWNER
            ]

    def power_off(self, instance_id: str) -> None:
        if instance_id in self.fake.vms:
            self.fake.power_off(instance_id)


@pytest.fixture(params=["aws", "gcp", "azure"])
def cloud(request: pytest.FixtureRequest) -> Iterator[Cloud]:
    if request.param == "aws":
        yield Ec2(request.getfixturevalue("moto_port"))
        return
    fake: FakeGce | FakeArm = FakeGce() if request.param == "gcp" else FakeArm()
    served: FakeCloud = fake.cloud
    with FakeServer(served) as server:
        if isinstance(fake, FakeGce):
            yield Gce(fake, server.port)
        else:
            yield Arm(fake, server.port)


def owned(cloud: Cloud, *states: str) -> list[VM]:
    return [vm for vm in cloud.vms() if vm.state in states]


def pool_vms(cloud: Cloud, *states: str) -> list[VM]:
    return [vm for vm in owned(cloud, *states) if TAG_WARM_POOL in vm.tags]


@contextlib.asynccontextmanager
async def guests(cloud: Cloud, model: LatencyModel) -> Any:
    played = cloud.guests(model)
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


@pytest.mark.parametrize("while_down", ["booting", "powered-off"])
async def test_kill_9_during_a_refill_keeps_the_pool_without_a_leak(
    root: Path, cloud: Cloud, while_down: str
) -> None:
    """The restart finds the VMs still booting, or powered off while no serve ran (on Azure
    still allocated, billing compute: the restarted pool must deallocate them)."""
    model = LatencyModel(scale=0.02)  # warm-up (boot and pull) 2.6 s
    async with guests(cloud, model) as played:
        async with Serve(root, cloud, model) as serve:
            # both slots launched, their VMs still booting: kill
            await until(lambda: len(pool_vms(cloud, "running")) == 2, 60, "the refill")
            booting = {vm.id for vm in pool_vms(cloud, "running")}
            await serve.kill9()
        recorded = serve.rows("SELECT endpoint FROM leases WHERE pool='warm-pool'")
        assert len(recorded) == 2  # recorded before their launch
        if while_down == "powered-off":
            await until(lambda: set(played.powered_off) == booting, 60, "the power-offs")
        async with Serve(root, cloud, model) as serve:
            await until(lambda: serve.warm() == 2, 60, "the pool warm")
            await asyncio.sleep(1.0)  # a few more passes: nothing more may be launched
            live = pool_vms(cloud, *LIVE)
            # the same two VMs, watched again after the restart: none leaked, none doubled
            assert {vm.id for vm in live} == booting
            assert all(vm.state == "stopped" for vm in live)
            slots = {vm.tags[TAG_WARM_SLOT] for vm in live}
            assert slots == {r[0] for r in recorded}


@pytest.mark.parametrize(
    ("cloud", "kill_at"),
    [
        ("aws", "starting"),
        ("gcp", "starting"),
        ("azure", "starting"),
        # the pod's user data and tags on, the start not yet made (held by the fake)
        ("gcp", "start"),
        ("azure", "start"),
        # GCP: the pod's metadata on (its user data, the sandbox's tags), the pool's labels not
        # yet replaced by the sandbox's (two calls; Azure's one PATCH has no such moment)
        ("gcp", "setLabels"),
    ],
    indirect=["cloud"],
)
async def test_kill_9_during_an_adoption_fails_the_pod_and_adopts_nothing_twice(
    root: Path, cloud: Cloud, kill_at: str
) -> None:
    # the adoption's start takes 4 s: the kill lands in it
    model = LatencyModel(launch=5, first_boot=20, image_pull=20, start=400, scale=0.01)
    pod = "adopt-kill9"
    state = "running"
    if kill_at != "starting":
        assert isinstance(cloud, HoldingCloud)
        cloud.hold_next(kill_at, 8)
        state = "stopped"
    async with guests(cloud, model):
        async with Serve(root, cloud, model, reap_grace_seconds=3600) as serve:
            await until(lambda: serve.warm() == 2, 60, "the pool warm")
            shim = await Client.connect_unix(str(root / "hv.sock"))
            async with shim:
                create = pb.CreateVMRequest(id=pod, annotations=ANNOTATIONS)
                await shim.call(HYPERVISOR, "CreateVM", create.SerializeToString())
                start = pb.StartVMRequest(id=pod).SerializeToString()
                starting = asyncio.ensure_future(shim.call(HYPERVISOR, "StartVM", start))

                def adopting() -> list[VM]:
                    vms = [vm for vm in owned(cloud, state) if vm.tags.get(TAG_SANDBOX) == pod]
                    claims = serve.rows(f"SELECT sandbox_id FROM leases WHERE pool='{CLAIMS}'")
                    return vms if vms and claims == [(pod,)] else []

                try:
                    (adopted,) = await until(adopting, 60, "the adoption under way")
                except AssertionError:
                    raise AssertionError(ours(root / "daemon.log")) from None
                await serve.kill9()
                with contextlib.suppress(Exception):
                    await starting
        adopted_id = adopted.id
        # restarted with a short reap grace: the pod failed with the restart, its VM is reaped
        async with Serve(root, cloud, model, reap_grace_seconds=1) as serve:

            def settled() -> bool:
                gone = adopted_id not in {vm.id for vm in owned(cloud, *LIVE)}
                return gone and serve.warm() == 2

            await until(settled, 90, "the reaper and the refill")
            (state, reason, instance) = serve.rows(
                f"SELECT state, reason, instance FROM sandboxes WHERE id='{pod}'"
            )[0]
            assert state == "failed" and "restarted during StartVM" in reason
            claims = serve.rows("SELECT * FROM leases WHERE pool='warm-pool-claim'")
            assert claims == []
            pool = pool_vms(cloud, *LIVE)
            assert adopted_id not in {vm.id for vm in pool}  # never adopted again
            assert len(pool) == 2  # the pool refilled to its size, nothing more
            # nothing of the pod runs: no VM carries its sandbox tag any more
            assert [vm for vm in owned(cloud, *LIVE) if vm.tags.get(TAG_SANDBOX) == pod] == []
        assert instance is None or adopted_id in instance


async def test_a_hand_off_keeps_the_pool(root: Path, cloud: Cloud) -> None:
    model = LatencyModel(scale=0.01)
    async with guests(cloud, model), Serve(root, cloud, model) as first:
        await until(lambda: first.warm() == 2, 60, "the pool warm")
        kept = {vm.id for vm in pool_vms(cloud, *LIVE)}
        assert len(kept) == 2
        # a second serve over the same state takes the sockets over (an upgrade)
        async with Serve(root, cloud, model) as second:
            assert first.proc is not None
            await asyncio.wait_for(first.proc.wait(), 60)  # the predecessor ends
            await until(lambda: second.warm() == 2, 60, "the pool after the hand-off")
            await asyncio.sleep(1.0)  # a few passes: nothing launched, nothing deleted
            assert {vm.id for vm in pool_vms(cloud, *LIVE)} == kept
            assert first.proc.returncode == 0  # it handed over and exited, pool kept
