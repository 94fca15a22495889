"""Warm pools through Kata's real Go shim: `peerpods serve --warm-pool TYPE=1@ZONE` (aws provider
on moto; tests.peers.warm_kata_daemon) keeps one stopped VM of the type a plain one-GPU pod's
annotations select (`peerpods plan` says which, and that the pod would get a warm VM), whose
guest powers itself off once booted (tests.clouds.latency.Guests, played by this test, as a VM
outlives its adaptor). containerd 2.x, configured by `peerpods node install` over Kata's own
generated file, then runs a container with the webhook's annotations through
`containerd-shim-kata-v2`: the shim's CreateVM/StartVM adopt the pool's VM (the same instance,
running, tagged with the sandbox, its user data the pod's: what a cold launch of the same pod
carries), the container runs to its exit status through the adaptor's agent proxy, the pool
refills with a new VM, and once the container is removed the adopted VM is terminated and
nothing of the pod is left.

The same through the calls a kubelet makes (tests/peers/cri.py): the webhook's annotations are
the pod's, which reach the shim through the `kata-remote` handler's pod_annotations.

A warm VM whose start fails (EC2 answers StartInstances with InsufficientInstanceCapacity,
tests.clouds.aws_faults) is deleted and the pod runs on a VM launched for it. A kill -9 of serve
while an adoption's start is under way fails the pod with a status (the shim's StartVM
connection closes; nothing ran); the restarted serve abandons the sandbox whose shim is gone,
deletes the VM it was being given (never adopted again) and refills the pool.

Needs, in PEERPODS_PEERS_DIR: `containerd-shim-kata-v2`, containerd 2.x with its `ctr`, and
Kata's generated `configuration-remote.toml` (as tests/peers/test_kata_shim_install.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from adaptor.warmpool import CLAIMS, MEMBERS
from adaptor.warmpool.userdata import warm_user_data
from providers.core.base import TAG_OWNER, TAG_SANDBOX
from providers.core.warm import TAG_WARM_POOL
from tests.adaptor.daemon_proc import ServeProcess
from tests.clouds.latency import Guests, LatencyModel
from tests.node.containerd import dump
from tests.peers.conftest import peer_binary
from tests.peers.cri import (
    Cri,
    _bytes,
    _str,
    container_config,
    exit_and_tear_down,
    pod_config,
)
from tests.peers.kube import Containerd, import_sleep_images, start_containerd
from tests.peers.test_dra_kata import installer, moto_port
from tests.peers.test_kata_shim_install import (
    IMAGE,
    NAMESPACE,
    agent,
    base,
    oci_archive,
    shim_processes,
    syslog_socket,
)
from tests.peers.warm_kata_daemon import ZONE
from tests.shim_emulator import PodVMAgent

__all__ = ["agent", "base", "moto_port"]  # fixtures shared with the other real-shim tests

ROOT = Path(__file__).resolve().parents[2]
OWNER = "warm-kata"
POD = "gpu-pod"
GONE = ("shutting-down", "terminated")
# what Kata's shim keeps per sandbox while it runs (no netns: the pods use the host's network)
KATA_STATE = ("/run/vc/sbs/{}", "/run/kata-containers/shared/sandboxes/{}")
POD_YAML = f"""\
apiVersion: v1
kind: Pod
metadata: {{name: {POD}, namespace: default}}
spec:
  runtimeClassName: kata-remote
  containers:
  - name: main
    image: {IMAGE}
    resources: {{limits: {{nvidia.com/gpu: 1}}}}
"""


@pytest.fixture(autouse=True)
def needs_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the real shim's tests need root under CI")
        pytest.skip("the real shim needs root")


@dataclass(frozen=True)
class PodPlan:
    """What `peerpods plan` says of the one-GPU pod: the webhook's annotations and the type its
    VM would be."""

    annotations: dict[str, str]
    instance_type: str
    gpu_model: str
    cdi: list[str]  # the container's CDI devices


def plan(tmp: Path, *extra: str) -> dict[str, Any]:
    manifest = tmp / "pod.yaml"
    manifest.write_text(POD_YAML)
    done = subprocess.run(
        [sys.executable, "-m", "adaptor.cli.main", "plan", str(manifest), "--output", "json",
         *extra],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.fixture
def gpu_pod(base: Path) -> PodPlan:
    planned = plan(base)
    annotations = dict(planned["annotations"])
    assert annotations["io.katacontainers.config.hypervisor.default_gpus"] == "1"
    chosen = str(planned["selected"])
    # and with the pool this test configures, the plan says the pod gets a warm VM
    warm = plan(base, "--warm-pool", f"{chosen}=1@{ZONE}")["warm_vm"]
    assert warm == {"adopted": True, "pool": f"{chosen}@{ZONE}"}
    [main] = planned["containers"]
    return PodPlan(annotations, chosen, str(planned["devices"]["model"]), list(main["cdi"]))


@dataclass
class WarmServe(ServeProcess):
    """tests.peers.warm_kata_daemon over `root`: serve's own flags, its provider on moto."""

    moto: int = 0
    agent_port: int = 0
    fault: str = "none"

    def argv(self) -> list[str]:
        argv = super().argv()
        flags = argv[argv.index("serve") + 1 :]
        return [sys.executable, "-m", "tests.peers.warm_kata_daemon", str(self.moto),
                str(self.agent_port), self.fault, "--log-level", "debug", *flags]  # fmt: skip

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.status_url}{path}", timeout=10) as answer:
            body = answer.read().decode()
        return json.loads(body) if path.startswith("/v1/") else body


class Cloud:
    """The moto EC2 server as the test sees it, and the warm VMs' guests."""

    def __init__(self, port: int) -> None:
        import boto3

        self.ec2 = boto3.session.Session().client(
            "ec2", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{port}",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )  # fmt: skip
        # a booted warm VM powers itself off at once (the boot and the pulls are not modelled)
        self.guests = Guests(self.ec2, LatencyModel(scale=0), OWNER)

    def vms(self) -> dict[str, dict[str, Any]]:
        """The owner's instances, whatever their state."""
        found = self.ec2.describe_instances(
            Filters=[{"Name": f"tag:{TAG_OWNER}", "Values": [OWNER]}]
        )
        return {i["InstanceId"]: i for r in found["Reservations"] for i in r["Instances"]}

    def volumes(self) -> dict[str, str]:
        """The owner's EBS volumes: id -> the instance each is attached to ("" when none)."""
        found = self.ec2.describe_volumes(
            Filters=[{"Name": f"tag:{TAG_OWNER}", "Values": [OWNER]}]
        )["Volumes"]
        return {
            v["VolumeId"]: ",".join(a["InstanceId"] for a in v.get("Attachments", []))
            for v in found
        }

    def user_data(self, instance_id: str) -> str:
        """The VM's user data as EC2 hands it to the guest (DescribeInstanceAttribute)."""
        out = self.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        return base64.b64decode(out["UserData"]["Value"]).decode()


def state(raw: dict[str, Any]) -> str:
    return str(raw["State"]["Name"])


def tags(raw: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}


def written(user_data: str) -> dict[str, Any]:
    """The JSON files a pod VM's cloud-config writes, by path."""
    files = yaml.safe_load(user_data)["write_files"]
    return {f["path"]: json.loads(f["content"]) for f in files if f["path"].endswith(".json")}


def gc_deleted(metrics: str) -> float:
    """VMs the orphan collector deleted (Prometheus text)."""
    lines = [ln for ln in metrics.splitlines() if ln.startswith("peerpods_gc_deleted_vms_total")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def pool_vms(vms: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The pool's VMs (id -> state) among `vms`, deleted ones left out."""
    return {i: state(raw) for i, raw in vms.items() if TAG_WARM_POOL in tags(raw)
            and state(raw) not in GONE}  # fmt: skip


@dataclass
class Rig:
    """containerd with Kata's shim, serve with its pool, the pod VM's agent, the cloud."""

    runtime: Containerd
    config_path: str  # the Kata configuration `peerpods node install` wrote
    serve: WarmServe
    pod_vm: PodVMAgent
    cloud: Cloud
    pod: PodPlan

    def why(self) -> str:
        return (
            f"serve:\n{self.serve.log()[-5000:]}\n"
            f"containerd:\n{self.runtime.process.log_tail(30)}\n"
            f"agent: {self.pod_vm.calls}"
        )

    async def until(self, what: str, check: Callable[[], Any], seconds: float = 60) -> Any:
        """`check()` (in a thread: it may call moto) until it is truthy; its value."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not (value := await asyncio.to_thread(check)):
            assert loop.time() < deadline, f"timed out waiting for {what}\n{self.why()}"
            await asyncio.sleep(0.1)
        return value

    def warm(self) -> list[dict[str, Any]]:
        """The keeper's warm VMs (its status API)."""
        return [vm for vm in self.serve.get("/v1/warm-pool")["vms"] if vm["state"] == "warm"]

    async def warm_vm(self) -> str:
        """Guests power off what booted until the keeper holds a warm VM, stopped in EC2."""

        def one() -> str:
            self.cloud.guests.step()
            warm = self.warm()
            if len(warm) != 1:
                return ""
            vm_id = str(warm[0]["vm_id"])
            return vm_id if state(self.cloud.vms()[vm_id]) == "stopped" else ""

        return str(await self.until("a stopped warm VM", one))

    def sandboxes(self) -> list[dict[str, Any]]:
        return list(self.serve.get("/v1/sandboxes")["sandboxes"])

    def sandbox(self) -> dict[str, Any] | None:
        boxes = [b for b in self.sandboxes() if b.get("vm_id")]
        return boxes[0] if len(boxes) == 1 else None

    def annotations(self) -> dict[str, str]:
        """The container's: the webhook's, and what the CRI would add for the pod's sandbox."""
        return {
            **self.pod.annotations,
            "io.kubernetes.cri.sandbox-name": POD,
            "io.kubernetes.cri.sandbox-namespace": "default",
            "io.kubernetes.cri.container-name": "main",  # the container the device plan names
        }

    async def run_pod(
        self, name: str, status: int, running: Callable[[dict[str, Any]], Awaitable[None]]
    ) -> None:
        """`ctr run --rm` of a container with the webhook's annotations through Kata's shim;
        `running(sandbox)` checks while it runs, then it writes and exits with `status`."""
        annotations = self.annotations()
        started = self.pod_vm.calls.count("StartContainer")
        run = await asyncio.create_subprocess_exec(
            str(peer_binary("ctr")), "--address", str(self.runtime.socket),
            "--namespace", NAMESPACE, "run", "--rm", "--runtime", "io.containerd.kata.v2",
            "--runtime-config-path", self.config_path,
            *(f"--annotation={k}={v}" for k, v in annotations.items()),
            IMAGE, name,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            await self.until(
                f"{name} to start in the VM",
                lambda: (
                    self.pod_vm.calls.count("StartContainer") > started
                    or run.returncode is not None
                ),
                120,
            )
            if run.returncode is not None:
                out = await run.stdout.read() if run.stdout else b""
                pytest.fail(f"ctr run ended ({run.returncode}): {out.decode()}\n{self.why()}")
            box = await self.until(f"{name}'s sandbox with its VM", self.sandbox, 30)
            assert box["id"] == name, box
            assert box["pod_network"] is None  # no netns from ctr: no tunnel, no device made
            await running(box)
            self.pod_vm.write(name, f"hello from {name}\n".encode())
            self.pod_vm.write(name, b"")  # EOF of one stream
            self.pod_vm.write(name, b"")  # and of the other
            self.pod_vm.exit(name, status)
            out, _ = await asyncio.wait_for(run.communicate(), 90)
        finally:
            if run.returncode is None:
                run.kill()
                await run.wait()
        assert run.returncode == status, out.decode(errors="replace") + self.why()
        assert f"hello from {name}".encode() in out

    def left(self) -> list[str]:
        """What is left of any pod: containers, tasks, shims, sandbox records and leases."""
        left = []
        for kind in ("containers", "tasks"):
            found = ctr(self.runtime, kind, "ls", "-q").stdout.split()
            left += [f"{kind} {name}" for name in found]
        left += [f"shim pid {pid}" for pid in shim_processes(self.runtime.socket)]
        left += [f"sandbox {row[0]}" for row in self.serve.rows("SELECT * FROM sandboxes")]
        left += [f"lease {row}" for row in self.serve.rows("SELECT * FROM leases")]
        return left

    async def nothing_left(self, sandboxes: set[str], vm_ids: set[str]) -> None:
        """No container, task, shim, sandbox record or lease, none of Kata's per-sandbox state
        (its sandbox store, shared dirs) or serve's (agent socket); the pods' VMs deleted."""

        def left() -> list[str]:
            vms = self.cloud.vms()
            kata = [f.format(s) for s in sandboxes for f in KATA_STATE]
            pods = [self.serve.root / "pods" / s for s in sandboxes]
            # the pool's own record of its slots stays (a claim would be a leak)
            slots = {vm["slot"] for vm in self.serve.get("/v1/warm-pool")["vms"]}
            pool = [
                f"lease {row}"
                for row in self.serve.rows(f"SELECT * FROM leases WHERE pool = '{MEMBERS}'")
                if row[1] in slots
            ]
            return (
                [thing for thing in self.left() if thing not in pool]
                + [f"listed {box['id']}" for box in self.sandboxes()]
                + [path for path in kata if os.path.lexists(path)]
                + [str(path) for path in pods if path.exists()]  # agent socket, apf.json
                + [f"VM {i} {state(vms[i])}" for i in vm_ids if state(vms[i]) not in GONE]
            )

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while found := await asyncio.to_thread(left):
            assert loop.time() < deadline, f"left: {found}\n{self.why()}"
            await asyncio.sleep(0.2)
        # deleted by StopVM and the pool, never taken for orphans by the collector
        assert gc_deleted(await asyncio.to_thread(self.serve.get, "/metrics")) == 0.0


def ctr(runtime: Containerd, *args: str) -> subprocess.CompletedProcess[str]:
    """containerd's own client (the peers build), in the test's namespace."""
    return subprocess.run(
        [str(peer_binary("ctr")), "--address", str(runtime.socket), "--namespace", NAMESPACE,
         *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def kata_config_path(runtime: Containerd) -> str:
    """The Kata configuration the installer registered for its `kata-remote` runtime."""
    config = dump(peer_binary("containerd"), runtime.folder / "config.toml")
    runtimes = config["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    assert runtimes["kata-remote"]["runtime_path"] == str(peer_binary("containerd-shim-kata-v2"))
    return str(runtimes["kata-remote"]["options"]["ConfigPath"])


@pytest.fixture
async def rig(
    request: pytest.FixtureRequest,
    base: Path,
    agent: tuple[PodVMAgent, str],
    moto_port: int,
    gpu_pod: PodPlan,
) -> AsyncIterator[Rig]:
    """containerd 2.x as `peerpods node install` configures it for Kata's shim (Kata's own
    generated file as its source), and serve with one warm VM of the pod's type
    (`request.param`: serve's fault, none or start)."""
    pod_vm, endpoint = agent
    serve = WarmServe(
        base / "serve",
        [
            "--provider", "aws", "--owner-id", OWNER, "--no-agent-tls",
            # the orphan collector sweeps every second: it must leave pool and adopted VMs be
            "--proxy-timeout", "20s", "--shutdown-grace", "2s", "--gc-interval", "1s",
            "--warm-pool", f"{gpu_pod.instance_type}=1@{ZONE}",
            "--warm-pool-interval", "200ms",
        ],
        env={"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"},
        moto=moto_port,
        agent_port=int(endpoint.rsplit(":", 1)[1]),
        fault=getattr(request, "param", "none"),
    )  # fmt: skip
    configure = installer(base, Path(serve.socket))
    with (
        syslog_socket(),
        start_containerd(peer_binary("containerd"), configure=configure) as runtime,
    ):
        archive = base / "tiny.tar"
        oci_archive(archive)
        imported = ctr(runtime, "images", "import", str(archive))
        assert imported.returncode == 0, imported.stderr
        try:
            await serve.start()
            yield Rig(runtime, kata_config_path(runtime), serve, pod_vm, Cloud(moto_port), gpu_pod)
            assert "Traceback" not in serve.log()
        finally:
            await serve.kill()


async def test_a_gpu_pod_adopts_the_warm_vm_through_kata_s_shim_and_the_pool_refills(
    rig: Rig,
) -> None:
    cloud = rig.cloud
    warm = await rig.warm_vm()
    raw = (await asyncio.to_thread(cloud.vms))[warm]
    assert raw["InstanceType"] == rig.pod.instance_type
    assert raw["Placement"]["AvailabilityZone"] == ZONE
    assert tags(raw)[TAG_WARM_POOL] == OWNER and TAG_SANDBOX not in tags(raw)
    pools = await asyncio.to_thread(cloud.user_data, warm)
    assert pools == warm_user_data(())  # the pool's own user data while it waits
    seen: dict[str, str] = {}

    async def adopted(box: dict[str, Any]) -> None:
        # StartVM adopted the pool's stopped VM: the same instance, now running and the pod's
        assert box["vm_id"] == warm and box["instance_type"] == rig.pod.instance_type
        vm = (await asyncio.to_thread(cloud.vms))[warm]
        assert state(vm) == "running"
        # the agent proxy dialled the adopted VM as the cloud reports it once started
        dialled = f"forwarder of {warm} at {vm['PrivateIpAddress']}"
        assert dialled in rig.serve.log()
        found = tags(vm)
        assert found[TAG_SANDBOX] == box["id"] and found[TAG_OWNER] == OWNER
        assert TAG_WARM_POOL not in found
        seen["adopted"] = text = await asyncio.to_thread(cloud.user_data, warm)
        assert text != pools and text.startswith("#cloud-config\n")
        # the pod VM's apf.json: the one serve keeps a copy of for the operator
        copy = json.loads((rig.serve.root / "pods" / box["id"] / "apf.json").read_text())
        assert copy["pod-name"] == POD and copy["pod-namespace"] == "default"
        files = written(text)
        assert files["/run/peerpod/apf.json"] == copy
        assert files["/run/peerpod/devices.json"]["gpu_model"] == rig.pod.gpu_model
        # the container's CreateContainer went through serve's device rewrite on its way
        ready = {"main": {"devices": rig.pod.cdi, "state": "ready", "reason": ""}}
        await rig.until("main's devices", lambda: (rig.sandbox() or {}).get("containers") == ready)
        # the pool refills behind the pod: a new VM of the pool's, booting
        refill = await rig.until(
            "the refill's launch",
            lambda: {i for i in pool_vms(cloud.vms()) if i != warm},
            30,
        )
        seen["refill"] = next(iter(refill))

    await rig.run_pod("warm-pod", 3, adopted)
    assert f"sandbox warm-pod: adopted warm VM {warm}" in rig.serve.log()
    assert rig.pod_vm.calls[:2] == ["Check", "CreateSandbox"], rig.pod_vm.calls
    assert "DestroySandbox" in rig.pod_vm.calls
    await rig.nothing_left({"warm-pod"}, {warm})  # the adopted VM terminated with its pod

    # the same pod again while the refill still boots: the pool is empty, so a VM is launched
    # for it, and that cold launch carries exactly the user data the adoption wrote
    assert rig.warm() == []

    async def cold(box: dict[str, Any]) -> None:
        assert box["vm_id"] not in (warm, seen["refill"])
        seen["cold"] = box["vm_id"]
        assert await asyncio.to_thread(cloud.user_data, box["vm_id"]) == seen["adopted"]

    await rig.run_pod("cold-pod", 0, cold)
    await rig.nothing_left({"cold-pod"}, {warm, seen["cold"]})

    # the refill's guest powers itself off: the pool holds its one warm VM again, a new one
    assert await rig.warm_vm() == seen["refill"]
    vms = await asyncio.to_thread(cloud.vms)
    live = {i: state(raw) for i, raw in vms.items() if state(raw) not in GONE}
    assert live == {seen["refill"]: "stopped"}
    # and of the disks only the pool VM's root volume (the others went with their VMs)
    assert list((await asyncio.to_thread(cloud.volumes)).values()) == [seen["refill"]]
    metrics = rig.serve.get("/metrics")
    assert f'peerpods_warm_pool_adoptions_total{{pool="{rig.pod.instance_type}@{ZONE}"}} 1.0' in (
        metrics
    )
    assert 'peerpods_warm_pool_misses_total{reason="empty"} 1.0' in metrics


@pytest.mark.parametrize("rig", ["start"], indirect=True)
async def test_a_warm_vm_that_cannot_start_is_deleted_and_the_pod_runs_cold(rig: Rig) -> None:
    cloud = rig.cloud
    warm = await rig.warm_vm()
    seen: dict[str, str] = {}

    async def cold(box: dict[str, Any]) -> None:
        vms = await asyncio.to_thread(cloud.vms)
        assert box["vm_id"] != warm
        seen["cold"] = box["vm_id"]
        assert state(vms[box["vm_id"]]) == "running"
        assert tags(vms[box["vm_id"]])[TAG_SANDBOX] == box["id"]
        assert state(vms[warm]) in GONE  # the broken warm VM is deleted
        text = await asyncio.to_thread(cloud.user_data, box["vm_id"])
        assert f'"pod-name":"{POD}"' in text

    await rig.run_pod("after-miss", 5, cold)
    said = f"sandbox after-miss: adopting warm VM {warm} failed, launching cold"
    assert said in rig.serve.log() and "InsufficientInstanceCapacity" in rig.serve.log()
    assert 'peerpods_warm_pool_misses_total{reason="adopt-failed"} 1.0' in rig.serve.get("/metrics")
    await rig.nothing_left({"after-miss"}, {warm, seen["cold"]})
    # and the pool launches a VM in the broken one's place
    await rig.until("the refill's launch", lambda: set(pool_vms(cloud.vms())) - {warm}, 30)


def with_annotations(config: bytes, annotations: Mapping[str, str]) -> bytes:
    """A PodSandboxConfig with the pod's annotations (field 7, a map), as a kubelet sends them."""
    entries = (_bytes(7, _str(1, k) + _str(2, v)) for k, v in annotations.items())
    return config + b"".join(entries)


async def test_a_cri_pod_gets_the_warm_vm_through_the_runtime_handler_s_pod_annotations(
    rig: Rig,
) -> None:
    """The kubelet's calls: the webhook's annotations are the pod's, which containerd hands the
    shim through the `kata-remote` handler's pod_annotations (the node install's), and the
    pause container comes first."""
    cloud, pod_vm = rig.cloud, rig.pod_vm
    warm = await rig.warm_vm()
    await asyncio.to_thread(import_sleep_images, rig.runtime)
    cri = Cri(rig.runtime.socket)
    try:
        pod = with_annotations(pod_config(POD, "uid-warm"), rig.pod.annotations)
        sandbox = await asyncio.to_thread(cri.run_pod_sandbox, pod, "kata-remote")
        box = await rig.until("the pod's sandbox with its VM", rig.sandbox, 30)
        assert box["id"] == sandbox and box["vm_id"] == warm
        assert box["pod"] == {"namespace": "default", "name": POD}
        vm = (await asyncio.to_thread(cloud.vms))[warm]
        assert state(vm) == "running" and tags(vm)[TAG_SANDBOX] == sandbox
        main = container_config("main", "peerpods.test/sleep:1", "/bin/sleep")
        container = await asyncio.to_thread(cri.create_container, sandbox, main, pod)
        await asyncio.to_thread(cri.start_container, container)
        await rig.until("main to start", lambda: pod_vm.calls.count("StartContainer") == 2)
        # its CreateContainer went through serve's device rewrite (the listing may lag a second)
        ready = {"main": {"devices": rig.pod.cdi, "state": "ready", "reason": ""}}
        await rig.until("main's devices", lambda: (rig.sandbox() or {}).get("containers") == ready)
        output = b"hello from the warm VM\n"
        await exit_and_tear_down(cri, pod_vm, sandbox, container, output, rig.until)
    finally:
        cri.close()
    assert pod_vm.calls[:2] == ["Check", "CreateSandbox"], pod_vm.calls
    await rig.nothing_left({sandbox}, {warm})


@pytest.mark.parametrize("rig", ["hold-start"], indirect=True)
async def test_kill_9_of_serve_during_an_adoption_fails_the_pod_and_the_restart_cleans_up(
    rig: Rig,
) -> None:
    cloud = rig.cloud
    warm = await rig.warm_vm()
    run = await asyncio.create_subprocess_exec(
        str(peer_binary("ctr")), "--address", str(rig.runtime.socket), "--namespace", NAMESPACE,
        "run", "--rm", "--runtime", "io.containerd.kata.v2",
        "--runtime-config-path", rig.config_path,
        *(f"--annotation={k}={v}" for k, v in rig.annotations().items()),
        IMAGE, "kill-pod",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:

        def adopting() -> bool:
            claims = rig.serve.rows(f"SELECT sandbox_id FROM leases WHERE pool = '{CLAIMS}'")
            vm = cloud.vms()[warm]
            return claims == [("kill-pod",)] and tags(vm).get(TAG_SANDBOX) == "kill-pod"

        await rig.until("the adoption under way", adopting, 60)
        await rig.serve.kill()  # kill -9 while StartInstances is held
        out, _ = await asyncio.wait_for(run.communicate(), 60)
    finally:
        if run.returncode is None:
            run.kill()
            await run.wait()
    # the pod failed with a status: its StartVM's connection closed, nothing ran in a VM
    assert run.returncode != 0 and b"remote hypervisor call failed" in out, out
    assert "CreateSandbox" not in rig.pod_vm.calls
    # restarted (StartInstances answered again) with short graces: the failed sandbox's shim
    # is gone, so it is abandoned; the VM it was being given is deleted, never adopted again
    rig.serve.fault = "none"
    rig.serve.args = [*rig.serve.args, "--reconnect-grace", "3s", "--reap-grace", "1s"]
    await rig.serve.start()
    await rig.nothing_left({"kill-pod"}, {warm})
    assert rig.serve.rows(f"SELECT * FROM leases WHERE pool = '{CLAIMS}'") == []
    assert "kill-pod" in {box["id"] for box in rig.serve.get("/v1/sandboxes")["abandoned"]}
    refill = await rig.warm_vm()
    assert refill != warm
    vms = await asyncio.to_thread(cloud.vms)
    assert {i: state(raw) for i, raw in vms.items() if state(raw) not in GONE} == {
        refill: "stopped"
    }
