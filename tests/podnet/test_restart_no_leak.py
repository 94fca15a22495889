"""SIGTERM and kill -9 of `peerpods serve` under ten running pods, each driven by a shim that
behaves as Kata's Go shim (tests/shim_emulator.py), with pod networking on, on the static
provider and on moto: nothing leaks.

- SIGTERM: the agent sockets close first; every shim sends its one StopVM about 0.1 s later and
  the daemon, still answering on its hypervisor socket, tears every sandbox down before it exits.
- kill -9: the shims' StopVMs find nobody (never retried, never reconnecting). The restarted
  daemon serves the agent sockets again; after --reconnect-grace, with no shim back, each sandbox
  is abandoned: its VM deleted, its tunnel and record removed, its VNI and endpoint free again,
  and the status API says why.

Either way the worker and every pod netns end exactly as they began.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from adaptor.podnet import _netns
from tests.adaptor.daemon_proc import ANNOTATIONS, ServeProcess
from tests.podnet.moto_worker import OWNER
from tests.podnet.snapshot import snapshot
from tests.podnet.topology import Topology
from tests.shim_emulator import PodVMAgent, ShimEmulator, StopOutcome

pytestmark = pytest.mark.slow

PODS = 10
GRACE = "2s"
FORWARDER_PORT = 15150
MOTO_PORT = 5050
MOTO_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
T = TypeVar("T")
S = TypeVar("S", bound=ShimEmulator)


def in_netns(ns: str, fn: Callable[[], T]) -> T:
    """Run `fn` with this thread inside `ns` (called through asyncio.to_thread)."""
    with _netns.entered(ns):
        return fn()


def bound(ns: str, address: tuple[str, int]) -> socket.socket:
    """A TCP socket made inside `ns` and bound there (it stays in `ns` whatever uses it)."""
    with _netns.entered(ns):
        sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    return sock


def get_json(ns: str, url: str) -> Any:
    def get() -> Any:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return json.loads(answer.read())

    return in_netns(ns, get)


def metric(ns: str, url: str, name: str) -> float:
    def get() -> float:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)
        )

    return in_netns(ns, get)


class Node:
    """One worker node: its pods, its daemon, its pod VMs' agents, and what nothing may leak."""

    def __init__(
        self, topo: Topology, proc: ServeProcess, pods: list[str], pods_dir: str = "pods"
    ) -> None:
        self.topo = topo
        self.proc = proc
        self.pods = pods
        self.pods_dir = proc.root / pods_dir
        self.before: dict[str, Any] = {}
        self.shims: list[ShimEmulator] = []

    async def remember(self) -> None:
        """How the worker and pod netns look before any sandbox (pyroute2 runs off the loop)."""
        for ns in [self.topo.worker, *self.pods]:
            self.before[ns] = await asyncio.to_thread(snapshot, ns)

    def pod_shims(self, shim: type[S], prefix: str) -> list[S]:
        """One shim per pod, in its netns: sandbox `<prefix>-sb<i>` of pod `pod-<i>`."""
        return [
            shim(
                self.proc.socket,
                f"{prefix}-sb{i}",
                {**ANNOTATIONS, "io.kubernetes.cri.sandbox-name": f"pod-{i}"},
                netns=netns,
            )
            for i, netns in enumerate(self.pods)
        ]

    async def run_pods(self, round_: int) -> None:
        self.shims = self.pod_shims(ShimEmulator, f"r{round_}")
        await asyncio.gather(*(shim.run_pod() for shim in self.shims))
        assert len(self.proc.rows("SELECT id FROM sandboxes WHERE state='running'")) == PODS
        assert len(self.proc.rows("SELECT * FROM leases WHERE pool='vxlan'")) == PODS

    async def stop_outcomes(self) -> list[StopOutcome]:
        return [await shim.stopped() for shim in self.shims]

    async def close_shims(self) -> None:
        for shim in self.shims:
            await shim.close()

    def static_leases(self) -> int:
        """The static provider's endpoints leased now (each is a pod VM in use)."""
        return len(self.proc.rows("SELECT * FROM leases WHERE pool='static'"))

    def leaks(self) -> dict[str, Any]:
        """Whatever is left: records, leases (VNIs, endpoints), sandbox dirs, netns changes."""
        left: dict[str, Any] = {
            "records": self.proc.rows("SELECT id, state, reason FROM sandboxes"),
            "leases": self.proc.rows("SELECT pool, endpoint, sandbox_id FROM leases"),
        }
        if self.pods_dir.exists():
            left["sandbox dirs"] = [
                p.name for p in self.pods_dir.iterdir() if not p.name.startswith(".")
            ]
        changed = [ns for ns, seen in self.before.items() if snapshot(ns) != seen]
        left["netns changed"] = changed
        return {k: v for k, v in left.items() if v}


async def add_pods(topo: Topology) -> list[str]:
    """PODS pod netns on the worker (made off the loop)."""
    return [(await asyncio.to_thread(topo.add_pod))[0] for _ in range(PODS)]


async def static_node(
    topo: Topology, *flags: str
) -> tuple[list[str], list[tuple[str, str, str]], list[str]]:
    """A node on the static provider: its pods, one pod VM per pod (netns, podns, underlay IP;
    its forwarder listens on FORWARDER_PORT there), and the `serve` arguments naming those VMs
    as the endpoints, followed by `flags`."""
    pods = await add_pods(topo)
    vms = [await asyncio.to_thread(topo.add_vm) for _ in range(PODS)]
    endpoints = ",".join(f"{ip}:{FORWARDER_PORT}" for _vm, _podns, ip in vms)
    args = ["--provider", "static", "--static-endpoints", endpoints, "--no-agent-tls"]
    return pods, vms, [*args, "--shutdown-drain", "10s", "--gc-interval", "0s", *flags]


async def until(check: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        found = await asyncio.to_thread(check)
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def sigterm_round(node: Node, vms: Callable[[], int]) -> None:
    """SIGTERM under ten pods: every shim's StopVM is taken before the daemon exits."""
    await node.run_pods(1)
    assert await asyncio.to_thread(vms) == PODS
    assert await node.proc.terminate() == 0, node.proc.log()
    outcomes = await node.stop_outcomes()
    assert all(o.ok for o in outcomes), (outcomes, node.proc.log())
    await node.close_shims()
    assert await asyncio.to_thread(vms) == 0
    assert await asyncio.to_thread(node.leaks) == {}, node.proc.log()


async def kill_9_round(node: Node, vms: Callable[[], int]) -> None:
    """kill -9 under ten pods: the StopVMs are lost; the restart abandons every sandbox."""
    await node.run_pods(2)
    assert await asyncio.to_thread(vms) == PODS
    await node.proc.kill()
    outcomes = await node.stop_outcomes()
    assert not any(o.connected for o in outcomes), outcomes  # nobody there; never retried
    await node.close_shims()
    started = time.monotonic()
    await node.proc.start()

    def settled() -> bool:
        return not node.proc.rows("SELECT id FROM sandboxes")

    await until(settled, 60, "the abandoned sandboxes to be torn down")
    assert time.monotonic() - started >= 2, "torn down before the reconnect grace"
    assert await asyncio.to_thread(vms) == 0
    assert await asyncio.to_thread(node.leaks) == {}, node.proc.log()
    ns, url = node.topo.worker, node.proc.status_url
    status = await asyncio.to_thread(get_json, ns, f"{url}/v1/sandboxes")
    assert status["sandboxes"] == []
    gone = {entry["id"]: entry for entry in status["abandoned"]}
    assert sorted(gone) == sorted(shim.sandbox_id for shim in node.shims)
    assert all("did not connect again within 2s" in e["reason"] for e in gone.values())
    one = await asyncio.to_thread(get_json, ns, f"{url}/v1/sandboxes/{node.shims[0].sandbox_id}")
    assert one["state"] == "abandoned"
    abandoned = await asyncio.to_thread(metric, ns, url, "peerpods_sandboxes_abandoned_total")
    assert abandoned == PODS
    assert await node.proc.terminate() == 0


@contextlib.asynccontextmanager
async def agents(listeners: list[socket.socket]) -> AsyncIterator[list[PodVMAgent]]:
    started = [await PodVMAgent.start(listener) for listener in listeners]
    try:
        yield started
    finally:
        for agent in started:
            await agent.close()


async def test_static_provider_sigterm_and_kill_9_leak_nothing(
    topo: Topology, tmp_path: Path
) -> None:
    pods, vms, args = await static_node(topo, "--reconnect-grace", GRACE)
    proc = ServeProcess(tmp_path, args, netns=topo.worker)
    node = Node(topo, proc, pods)
    await node.remember()
    listeners = [bound(vm, (ip, FORWARDER_PORT)) for vm, _podns, ip in vms]

    async with agents(listeners):
        await proc.start()
        try:
            await sigterm_round(node, node.static_leases)
            await proc.start()
            await kill_9_round(node, node.static_leases)
        finally:
            await node.close_shims()
            await proc.kill()
    assert await asyncio.to_thread(node.leaks) == {}


@contextlib.contextmanager
def moto_in(ns: str) -> Iterator[int]:
    """moto's EC2 server on loopback inside `ns` (where the daemon runs)."""
    from tests.adaptor.daemon_proc import _enter

    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(MOTO_PORT)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_enter(ns),
    )

    def up() -> None:
        urllib.request.urlopen(f"http://127.0.0.1:{MOTO_PORT}/moto-api/", timeout=1).close()

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                in_netns(ns, up)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield MOTO_PORT
    finally:
        proc.terminate()
        proc.wait(10)


def live_vms(ns: str) -> int:
    """Pending or running moto VMs carrying this node's owner tag."""
    import boto3

    def count() -> int:
        client = boto3.session.Session().client(
            "ec2",
            region_name="us-east-1",
            endpoint_url=f"http://127.0.0.1:{MOTO_PORT}",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        out = client.describe_instances(
            Filters=[
                {"Name": "tag:peerpods-owner", "Values": [OWNER]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        )
        return sum(len(r["Instances"]) for r in out["Reservations"])

    return in_netns(ns, count)


class MotoWorker(ServeProcess):
    """The daemon on moto (tests/podnet/moto_worker.py) instead of `peerpods serve`."""

    agent_port: int = 0

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "tests.podnet.moto_worker",
            str(self.root),
            str(MOTO_PORT),
            str(self.agent_port),
            GRACE.removesuffix("s"),
        ]


async def test_moto_sigterm_and_kill_9_leak_nothing(topo: Topology, tmp_path: Path) -> None:
    pods = await add_pods(topo)
    listener = bound(topo.worker, ("127.0.0.1", 0))
    proc = MotoWorker(tmp_path, [], netns=topo.worker, env=MOTO_ENV)
    proc.agent_port = listener.getsockname()[1]
    node = Node(topo, proc, pods, pods_dir="p")
    await node.remember()

    def vms() -> int:
        return live_vms(topo.worker)

    with moto_in(topo.worker):
        async with agents([listener]):
            await proc.start()
            try:
                await sigterm_round(node, vms)
                await proc.start()
                await kill_9_round(node, vms)
            finally:
                await node.close_shims()
                await proc.kill()
    assert await asyncio.to_thread(node.leaks) == {}
