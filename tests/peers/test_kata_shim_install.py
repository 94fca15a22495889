"""Kata's real Go shim with the configuration `peerpods node install` writes: a node seeded with
Kata's generated `configuration-remote.toml`, the installer run over it and over containerd's
own configuration, Debian's containerd started with the result, `peerpods serve` (static
provider) in front of a pod VM agent; `ctr run` takes a container through the shim to its exit
status, and then nothing is left: no container, no task, no sandbox record, no shim process.
The node's /dev/log (which the shim needs) is a listener of the test's own when it is missing.

A CRI pod too: the calls a kubelet makes (tests/peers/cri.py), with the `kata-remote` handler as
the installer registered it (its runtime_path and ConfigPath, not ctr's choice).

Needs, in PEERPODS_PEERS_DIR: `containerd-shim-kata-v2` (Kata 3.30 or so) and, beside it in
`../kata/` or in the folder itself, the `configuration-remote.toml` Kata's build generates.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
import tomllib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from adaptor.node import kataconfig
from adaptor.node.install import NodeInstall, install, uninstall
from tests.adaptor.daemon_proc import ServeProcess
from tests.adaptor.handoff_rig import serve_args
from tests.node.containerd import Containerd, binaries, default_config, dump
from tests.peers.conftest import peer_binary, peers_dir
from tests.peers.cri import Cri, container_config, exit_and_tear_down, pod_config
from tests.shim_emulator import PodVMAgent

KATA_DEPLOY_GO = "opt/kata/share/defaults/kata-containers/configuration-remote.toml"
IMAGE = "docker.io/peerpods/tiny:1"
NAMESPACE = "peerpods-test"


def kata_generated() -> Path:
    """Kata's own generated remote configuration (beside the peer binaries)."""
    folder = peers_dir()
    for candidate in (
        folder and folder / "configuration-remote.toml",
        folder and folder.parent / "kata" / "configuration-remote.toml",
    ):
        if candidate and candidate.is_file():
            return candidate
    pytest.skip("Kata's generated configuration-remote.toml not found beside PEERPODS_PEERS_DIR")


def oci_archive(path: Path) -> None:
    """A one-layer OCI image archive, made here: the pod VM runs the container, so its content
    never matters on the node, but containerd needs an image to make a container from."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> dict[str, object]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    layer_tar = io.BytesIO()
    with tarfile.open(fileobj=layer_tar, mode="w") as tar:
        info = tarfile.TarInfo("hello")
        payload = b"hello from the pod VM\n"
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    raw = layer_tar.getvalue()
    layer = blob(gzip.compress(raw, mtime=0))
    config = blob(json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": ["/hello"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
    }).encode())  # fmt: skip
    manifest = blob(json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
    }).encode())  # fmt: skip
    index = {
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": IMAGE,
                            "org.opencontainers.image.ref.name": "1"},
        }],
    }  # fmt: skip
    with tarfile.open(path, "w") as tar:
        files = {
            "oci-layout": b'{"imageLayoutVersion": "1.0.0"}',
            "index.json": json.dumps(index).encode(),
        }
        files |= {f"blobs/sha256/{d.split(':')[1]}": data for d, data in blobs.items()}
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@contextlib.contextmanager
def syslog_socket() -> Iterator[None]:
    """/dev/log for the shim, which refuses to start without one (only when none is there)."""
    if os.path.exists("/dev/log"):
        yield
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind("/dev/log")
    listener.settimeout(0.2)
    done = threading.Event()

    def drain() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):
                listener.recv(65536)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        yield
    finally:
        done.set()
        reader.join()
        listener.close()
        os.unlink("/dev/log")


def shim_processes(address: Path) -> list[int]:
    """Kata shims serving the containerd at `address`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-kata-v2") and str(address).encode() in argv:
            found.append(int(entry.name))
    return found


@dataclass
class Node:
    """A node as the installer leaves it: Kata's generated file where kata-deploy puts it,
    containerd's default configuration with the runtime installed, containerd running it."""

    base: Path
    containerd: str
    shim: Path
    settings: NodeInstall
    original: str
    series: str = "1.6"
    config_path: str = ""
    process: subprocess.Popen[bytes] | None = None

    @property
    def daemon(self) -> Containerd:
        return Containerd(Path(self.settings.containerd_config), self.base,
                          self.containerd)  # fmt: skip

    def install(self, series: str) -> None:
        install(self.settings)
        plugin = "io.containerd.cri.v1.runtime" if series == "2" else "io.containerd.grpc.v1.cri"
        config = dump(Path(self.containerd), self.daemon.config)
        runtime = config["plugins"][plugin]["containerd"]["runtimes"]["kata-remote"]
        assert runtime["runtime_path"] == str(self.shim)
        self.config_path = runtime["options"]["ConfigPath"]
        kata = tomllib.loads(Path(self.config_path).read_text())
        assert kata["runtime"]["create_container_timeout"] == 60

    def start(self) -> None:
        env = {**os.environ, "PATH": f"{self.shim.parent}:{os.environ['PATH']}"}
        with self.daemon.log.open("wb") as log:
            self.process = subprocess.Popen(
                [self.containerd, "--config", str(self.daemon.config)],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while not self.daemon.socket.exists():
            assert time.monotonic() < deadline, self.daemon.log.read_text()
            time.sleep(0.05)
        archive = self.base / "tiny.tar"
        oci_archive(archive)
        done = ctr(self.daemon, "image", "import", str(archive))
        assert done.returncode == 0, done.stderr
        # the CRI's namespace, unpacked for its snapshotter, also as its pause image
        local = ["--local"] if self.series == "2" else []  # not the transfer service
        done = ctr(self.daemon, "image", "import", *local, "--snapshotter", "native",
                   str(archive), namespace="k8s.io")  # fmt: skip
        assert done.returncode == 0, done.stderr
        done = ctr(self.daemon, "image", "tag", IMAGE, self.pause_image(), namespace="k8s.io")
        assert done.returncode == 0, done.stderr

    def pause_image(self) -> str:
        plugins = dump(Path(self.containerd), self.daemon.config)["plugins"]
        if "io.containerd.cri.v1.images" in plugins:
            return str(plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"])
        return str(plugins["io.containerd.grpc.v1.cri"]["sandbox_image"])

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=20)

    def log(self) -> str:
        return self.daemon.log.read_text()[-6000:]

    def left(self, serve: ServeProcess) -> list[str]:
        """What is left of any pod: containers, tasks, shims, sandbox records, Kata's state."""
        left = []
        for namespace in (NAMESPACE, "k8s.io"):
            for kind in ("containers", "tasks"):
                found = ctr(self.daemon, kind, "ls", "-q", namespace=namespace).stdout.split()
                left += [f"{namespace} {kind} {name}" for name in found]
        left += [f"shim pid {pid}" for pid in shim_processes(self.daemon.socket)]
        left += [f"sandbox {row[0]}" for row in serve.rows("SELECT * FROM sandboxes")]
        left += [f"lease {row}" for row in serve.rows("SELECT * FROM leases")]
        return left

    def uninstall(self) -> None:
        assert uninstall(self.settings).kept == []
        assert self.daemon.config.read_text() == self.original
        assert not Path(self.settings.kata_config).exists()
        assert not Path(self.settings.dropin).exists()


def make_node(base: Path, series: str, source: str, socket_path: str) -> Node:
    shim = peer_binary("containerd-shim-kata-v2")
    found = binaries().get(series)
    if found is None:
        pytest.skip(f"containerd {series} not here (tests/debian-containerd fetches 1.7 and 2)")
    kata_source = base / KATA_DEPLOY_GO
    kata_source.parent.mkdir(parents=True)
    shutil.copy(kata_generated(), kata_source)
    main_config = base / "etc/containerd/config.toml"
    main_config.parent.mkdir(parents=True)
    original = default_config(base, found)
    main_config.write_text(original)
    settings = NodeInstall.build(
        containerd_config=str(main_config),
        dropin=f"{base}/etc/containerd/conf.d/50-peerpods-kata-remote.toml",
        kata_config=f"{base}/opt/peerpods/share/kata/configuration-remote.toml",
        record=f"{base}/var/lib/peerpods/node-install.json",
        kata_source=str(kata_source) if source == "kata" else "none",
        socket=socket_path,
        shim_path=str(shim),
        snapshotter="",  # no nydus here; containerd 1.6 has no per-runtime one anyway
        version_command=f"{found} --version",
    )
    node = Node(base, str(found), shim, settings, original, series)
    node.install(series)
    return node


@pytest.fixture
def base() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ppk", dir="/tmp") as directory:
        (Path(directory) / "serve").mkdir()
        yield Path(directory)


@pytest.fixture
async def agent() -> AsyncIterator[tuple[PodVMAgent, str]]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
    started = await PodVMAgent.start(listener)
    yield started, endpoint
    await started.close()


@pytest.fixture(params=["1.6", "1.7", "2"])
def series(request: pytest.FixtureRequest) -> str:
    """Debian's containerd 1.6 or 1.7 (a version 2 file, the runtime's lines in it) or 2.x
    (version 3, a drop-in)."""
    return str(request.param)


@pytest.fixture(params=["kata", "none"])
def source(request: pytest.FixtureRequest) -> str:
    """The installer starts from Kata's generated file, or writes the whole file itself."""
    return str(request.param)


@pytest.fixture
async def running(
    base: Path, agent: tuple[PodVMAgent, str], series: str, source: str
) -> AsyncIterator[tuple[Node, ServeProcess, PodVMAgent]]:
    pod_vm, endpoint = agent
    serve = ServeProcess(base / "serve", serve_args([endpoint]))
    node = make_node(base, series, source, serve.socket)
    with syslog_socket():
        try:
            await asyncio.to_thread(node.start)
            await serve.start()
            yield node, serve, pod_vm
            await _wait_for(lambda: not node.left(serve), 15, node)
            assert "Traceback" not in serve.log()
        finally:
            node.stop()
            await serve.kill()
    node.uninstall()


def ctr(
    daemon: Containerd, *args: str, namespace: str = NAMESPACE, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """containerd's own client, the one beside the daemon's binary."""
    client = str(Path(daemon.binary).parent / "ctr")
    return subprocess.run(
        [client, "--address", str(daemon.socket), "--namespace", namespace, *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


async def test_ctr_runs_a_container_through_the_real_shim_to_its_exit_status(
    running: tuple[Node, ServeProcess, PodVMAgent],
) -> None:
    node, serve, pod_vm = running
    client = str(Path(node.containerd).parent / "ctr")
    run = await asyncio.create_subprocess_exec(
        client, "--address", str(node.daemon.socket), "--namespace", NAMESPACE, "run", "--rm",
        "--runtime", "io.containerd.kata.v2", "--runtime-config-path", node.config_path,
        "--annotation", "io.kubernetes.cri.sandbox-name=ctr-pod",
        "--annotation", "io.kubernetes.cri.sandbox-namespace=default",
        IMAGE, "peerpods-ctr",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        await _wait_for(lambda: "StartContainer" in pod_vm.calls, 90, node)
        pod_vm.write("peerpods-ctr", b"hello from the pod VM\n")
        pod_vm.write("peerpods-ctr", b"")  # EOF of one stream
        pod_vm.write("peerpods-ctr", b"")  # and of the other
        pod_vm.exit("peerpods-ctr", 3)
        out, _ = await asyncio.wait_for(run.communicate(), 90)
    finally:
        if run.returncode is None:
            run.kill()
            await run.wait()
    assert run.returncode == 3, out.decode(errors="replace") + node.log() + serve.log()[-4000:]
    assert b"hello from the pod VM" in out
    assert pod_vm.calls[:2] == ["Check", "CreateSandbox"], pod_vm.calls
    assert "DestroySandbox" in pod_vm.calls


async def _wait_for(check: Callable[[], object], seconds: float, node: Node) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await asyncio.to_thread(check):
        assert loop.time() < deadline, node.log()
        await asyncio.sleep(0.1)


async def test_a_cri_pod_runs_through_the_real_shim_to_its_exit_status(
    running: tuple[Node, ServeProcess, PodVMAgent],
) -> None:
    """The calls a kubelet makes, with the `kata-remote` handler the installer registered."""
    node, serve, pod_vm = running
    assert serve.process is not None
    cri = Cri(node.daemon.socket)
    try:
        pod = pod_config("cri-pod", "uid-1")
        sandbox = await asyncio.to_thread(cri.run_pod_sandbox, pod, "kata-remote")
        box = container_config("box", IMAGE, "/hello")
        container = await asyncio.to_thread(cri.create_container, sandbox, box, pod)
        await asyncio.to_thread(cri.start_container, container)
        await _wait_for(lambda: pod_vm.calls.count("StartContainer") == 2, 60, node)
        await exit_and_tear_down(
            cri,
            pod_vm,
            sandbox,
            container,
            b"hello from the pod VM\n",
            lambda _what, check: _wait_for(check, 60, node),
        )
    finally:
        cri.close()
    assert pod_vm.calls[:2] == ["Check", "CreateSandbox"], pod_vm.calls
    assert "CopyFile" in pod_vm.calls and "DestroySandbox" in pod_vm.calls


BARE = """\
[hypervisor.remote]
remote_hypervisor_socket = "{socket}"
remote_hypervisor_timeout = 600
enable_annotations = ["default_vcpus", "default_memory", "default_gpus", "default_gpu_model"]

[runtime]
internetworking_model = "none"
disable_new_netns = true
disable_guest_seccomp = true
static_sandbox_resource_mgmt = true
"""


@pytest.mark.parametrize("series", ["1.6"])
@pytest.mark.parametrize("source", ["kata"])
async def test_a_file_without_kata_s_timeouts_fails_every_container(
    running: tuple[Node, ServeProcess, PodVMAgent],
) -> None:
    """Why the installer starts from Kata's file: the two-table file an installer might write
    from scratch has no create_container_timeout, and the Go runtime's default is 0 s."""
    node, serve, pod_vm = running
    installed = Path(node.config_path)
    kept = await asyncio.to_thread(installed.read_bytes)
    await asyncio.to_thread(installed.write_text, BARE.format(socket=serve.socket))
    client = str(Path(node.containerd).parent / "ctr")
    try:
        run = await asyncio.create_subprocess_exec(
            client, "--address", str(node.daemon.socket), "--namespace", NAMESPACE, "run",
            "--rm", "--runtime", "io.containerd.kata.v2",
            "--runtime-config-path", node.config_path,
            "--annotation", "io.kubernetes.cri.sandbox-name=bare-pod",
            "--annotation", "io.kubernetes.cri.sandbox-namespace=default",
            IMAGE, "peerpods-bare",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(run.communicate(), 120)
        assert run.returncode != 0
        assert b"CreateContainerRequest timed out" in out, out
        assert "StartContainer" not in pod_vm.calls
        await asyncio.to_thread(ctr, node.daemon, "containers", "rm", "peerpods-bare")
    finally:
        await asyncio.to_thread(installed.write_bytes, kept)


def test_the_whole_file_the_installer_writes_is_kata_s_own() -> None:
    """Where Kata installed none, the installer's file has Kata's generated tables and keys with
    Kata's values (the annotations list aside, which admits the same names); on Kata's own file
    it changes nothing at all with the default socket."""
    generated = tomllib.loads(kata_generated().read_text())
    ours = tomllib.loads(kataconfig.complete("go", "/run/peerpod/hypervisor.sock"))
    for table in (("hypervisor", "remote"), ("agent", "kata"), ("runtime",)):
        theirs, mine = generated, ours
        for part in table:
            theirs, mine = theirs[part], mine[part]
        theirs = {k: v for k, v in theirs.items() if k != "enable_annotations"}
        mine = {k: v for k, v in mine.items() if k != "enable_annotations"}
        assert mine == theirs, table
    assert kataconfig.required_edits(generated, "go", "/run/peerpod/hypervisor.sock") == []
