"""`peerpods serve` end to end: the Go ttrpc client plays Kata's shim, the Go ttrpc server plays the
pod VM forwarder, the static provider hands it out.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adaptor.hypervisor.version import package_version
from adaptor.ttrpc import Code
from adaptor.ttrpc.gen import health_pb2, hypervisor_pb2
from tests.adaptor.daemon_proc import ANNOTATIONS, ServeProcess, exists
from tests.adaptor.moto_daemon import closed_port
from tests.go.peers import GoServer, echo_server, go_call

pytestmark = pytest.mark.go

SID = "4f1e2d3c4b5a69788796a5b4c3d2e1f0"


def serve_args(*endpoints: str, timeout: str = "20s") -> list[str]:
    return [
        "--provider",
        "static",
        "--static-endpoints",
        ",".join(endpoints),
        "--no-agent-tls",
        "--proxy-timeout",
        timeout,
        "--shutdown-grace",
        "2s",
    ]


@pytest.fixture
async def serve(root: Path, pod_vm: GoServer) -> AsyncIterator[ServeProcess]:
    proc = ServeProcess(root, serve_args(pod_vm.address))
    await proc.start()
    try:
        yield proc
    finally:
        await proc.kill()


def agent_socket(result: dict[str, object]) -> str:
    payload = result["payload"]
    assert isinstance(payload, bytes)
    return str(hypervisor_pb2.CreateVMResponse.FromString(payload).agentSocketPath)


async def health_check(socket: str) -> dict[str, object]:
    return await go_call(
        socket,
        "grpc.Health",
        "Check",
        health_pb2.CheckRequest(service="").SerializeToString(),
        call_timeout="10s",
    )


async def test_lifecycle_through_go_client(serve: ServeProcess, root: Path) -> None:
    assert stat.S_IMODE(os.stat(serve.socket).st_mode) == 0o600
    version = await serve.call("Version", hypervisor_pb2.VersionRequest(version="0.0.1"))
    assert version["code"] == 0
    assert (
        hypervisor_pb2.VersionResponse.FromString(version["payload"]).version == package_version()
    )

    created = await serve.create_vm(SID)
    assert created["code"] == 0, created
    socket = agent_socket(created)
    assert socket == str(root / "pods" / SID / "agent.ttrpc") and ":" not in socket
    assert serve.rows("SELECT id, state FROM sandboxes") == [(SID, "created")]
    assert agent_socket(await serve.create_vm(SID)) == socket  # idempotent

    started = await serve.start_vm(SID)
    assert started["code"] == 0, serve.log()
    assert serve.rows("SELECT state FROM sandboxes") == [("running",)]
    assert stat.S_IMODE(os.stat(socket).st_mode) == 0o600

    health = await health_check(socket)
    assert health["code"] == 0
    assert health_pb2.HealthCheckResponse.FromString(health["payload"]).status == 1
    echoed = await go_call(
        socket,
        "grpc.AgentService",
        "CreateContainer",
        b"\x0a\x03abc",
        metadata=[("traceparent", "00-abc-def-01"), ("traceparent", "second")],
        call_timeout="30s",
    )
    assert echoed["code"] == 0
    from adaptor.ttrpc.gen import ttrpc_pb2

    seen = ttrpc_pb2.Request.FromString(echoed["payload"])
    assert (seen.service, seen.method, seen.payload) == (
        "grpc.AgentService",
        "CreateContainer",
        b"\x0a\x03abc",
    )
    assert [(kv.key, kv.value) for kv in seen.metadata] == [
        ("traceparent", "00-abc-def-01"),
        ("traceparent", "second"),
    ]
    assert 20e9 < seen.timeout_nano <= 30e9

    stopped = await serve.stop_vm(SID)
    assert stopped["code"] == 0, serve.log()
    assert not exists(socket) and not exists(Path(socket).parent)
    assert serve.rows("SELECT * FROM sandboxes") == []
    assert serve.rows("SELECT * FROM leases") == []
    again = await serve.stop_vm(SID)
    assert again["code"] == Code.NOT_FOUND
    unknown = await serve.start_vm("never-created")
    assert unknown["code"] == Code.NOT_FOUND
    missing = await go_call(serve.socket, "hypervisor.Hypervisor", "PauseVM")
    assert missing["code"] == Code.UNIMPLEMENTED


BAD_INPUT = [
    (SID, "io.kubernetes.cri.sandbox-namespace", "Not A Namespace"),
    (SID, "io.kubernetes.cri.sandbox-name", ""),
    (SID, "io.katacontainers.config.hypervisor.default_memory", "lots"),
    (SID, "io.katacontainers.config.hypervisor.default_gpu_model", "v1:mig=huge:1"),
    ("../../etc", "", ""),
]


async def test_create_vm_rejects_bad_input(serve: ServeProcess) -> None:
    for sandbox_id, key, value in BAD_INPUT:
        annotations = {**ANNOTATIONS, key: value} if key else ANNOTATIONS
        result = await serve.create_vm(sandbox_id, annotations)
        assert result["code"] == Code.INVALID_ARGUMENT, (key, result)
        assert (key or "sandbox id") in str(result["message"])
    garbage = await go_call(serve.socket, "hypervisor.Hypervisor", "CreateVM", b"\xff\xff\xff")
    assert garbage["code"] == Code.INVALID_ARGUMENT
    assert serve.rows("SELECT * FROM sandboxes") == []


async def test_forwarder_unreachable_releases_the_endpoint(root: Path) -> None:
    async with echo_server() as dead:
        address = dead.address
    proc = ServeProcess(root, serve_args(address, timeout="1s"))
    await proc.start()
    try:
        assert (await proc.create_vm(SID))["code"] == 0
        result = await proc.start_vm(SID)
        assert result["code"] == Code.UNAVAILABLE, result
        assert proc.rows("SELECT * FROM leases") == []
        assert proc.rows("SELECT state, instance FROM sandboxes") == [("failed", None)]
        assert not exists(root / "pods" / SID / "agent.ttrpc")
        assert (await proc.stop_vm(SID))["code"] == 0
        assert proc.rows("SELECT * FROM sandboxes") == []
    finally:
        await proc.kill()


async def test_one_sandbox_per_static_endpoint(serve: ServeProcess) -> None:
    for sid in ("one", "two"):
        assert (await serve.create_vm(sid))["code"] == 0
    assert (await serve.start_vm("one"))["code"] == 0
    busy = await serve.start_vm("two")
    assert busy["code"] == Code.RESOURCE_EXHAUSTED
    assert (await serve.stop_vm("one"))["code"] == 0
    assert (await serve.start_vm("two"))["code"] == 0
    assert (await serve.stop_vm("two"))["code"] == 0


async def test_kill_9_between_start_and_stop(serve: ServeProcess) -> None:
    assert (await serve.create_vm(SID))["code"] == 0
    socket = str(serve.root / "pods" / SID / "agent.ttrpc")
    assert (await serve.start_vm(SID))["code"] == 0
    await serve.kill()
    assert serve.rows("SELECT state FROM sandboxes") == [("running",)]

    await serve.start()  # the same state, socket and pods directories
    assert (await health_check(socket))["code"] == 0
    assert serve.rows("SELECT endpoint, sandbox_id FROM leases")[0][1] == SID
    assert (await serve.stop_vm(SID))["code"] == 0
    assert serve.rows("SELECT * FROM sandboxes") == [] and not exists(socket)


async def test_record_is_durable_before_the_reply(serve: ServeProcess) -> None:
    assert (await serve.create_vm(SID))["code"] == 0
    await serve.kill()  # no chance to flush anything after answering
    await serve.start()
    assert serve.rows("SELECT id, state FROM sandboxes") == [(SID, "created")]
    assert (await serve.start_vm(SID))["code"] == 0
    assert (await serve.stop_vm(SID))["code"] == 0


async def test_sigterm_keeps_running_sandboxes(serve: ServeProcess) -> None:
    assert (await serve.create_vm(SID))["code"] == 0
    assert (await serve.start_vm(SID))["code"] == 0
    assert await serve.terminate() == 0
    assert not exists(serve.socket)
    assert serve.rows("SELECT state FROM sandboxes") == [("running",)]
    await serve.start()
    assert (await serve.stop_vm(SID))["code"] == 0


async def test_second_daemon_on_same_state_is_refused(serve: ServeProcess, root: Path) -> None:
    # (without --take-over never, it would take the sockets over: tests/adaptor/test_handoff.py)
    other = ServeProcess(root, [*serve_args("127.0.0.1:1"), "--take-over", "never"])
    with pytest.raises(RuntimeError, match="another peerpods serve"):
        await other.start()
    assert other.process is not None and other.process.returncode == 2
    assert "Traceback" not in other.log()


async def test_bad_flags_exit_cleanly(root: Path) -> None:
    proc = ServeProcess(root, ["--provider", "static", "--static-endpoints", "nope"])
    with pytest.raises(RuntimeError, match="invalid endpoint 'nope'"):
        await proc.start()
    # some TLS files but not all: refused (none at all means the adaptor's own CA)
    tls = ServeProcess(
        root, ["--static-endpoints", "127.0.0.1:1", "--agent-tls", "--agent-tls-ca", str(root)]
    )
    with pytest.raises(RuntimeError, match="--agent-tls-cert, --agent-tls-key not set"):
        await tls.start()
    assert "Traceback" not in proc.log() + tls.log()
    await asyncio.sleep(0)


async def test_mutual_tls_to_the_forwarder(root: Path) -> None:
    tls_server = _write_tls_files(root)
    async with echo_server("tcp:127.0.0.1:0", *tls_server) as pod_vm:
        # A client certificate the pod VM does not trust: StartVM fails and releases the VM.
        refused = ServeProcess(root, _agent_tls_args(root, pod_vm.address, "stranger"))
        await refused.start()
        try:
            assert (await refused.create_vm(SID))["code"] == 0
            started = await refused.start_vm(SID)
            # With TLS 1.3 the server refuses the certificate after the client's handshake ends,
            # so the refusal shows either at StartVM or on the first agent call.
            if started["code"] == 0:
                socket = str(root / "pods" / SID / "agent.ttrpc")
                assert (await health_check(socket))["code"] == Code.UNAVAILABLE
            else:
                assert started["code"] == Code.UNAVAILABLE
                assert refused.rows("SELECT * FROM leases") == []
            assert (await refused.stop_vm(SID))["code"] == 0
            assert refused.rows("SELECT * FROM leases") == []
        finally:
            await refused.kill()

        proc = ServeProcess(root, _agent_tls_args(root, pod_vm.address, "client"))
        await proc.start()
        try:
            assert (await proc.create_vm(SID))["code"] == 0
            assert (await proc.start_vm(SID))["code"] == 0, proc.log()
            socket = str(root / "pods" / SID / "agent.ttrpc")
            assert (await health_check(socket))["code"] == 0
            assert (await proc.stop_vm(SID))["code"] == 0
        finally:
            await proc.kill()


def _write_tls_files(root: Path) -> tuple[str, ...]:
    """A CA's server and client (`client`) certificates and another CA's (`stranger`) under
    `root`; returns the pod VM's flags for serving TLS that asks for the CA's clients."""
    import trustme

    ca = trustme.CA()
    other_ca = trustme.CA()
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    server = ca.issue_cert("127.0.0.1")
    server.cert_chain_pems[0].write_to_path(str(root / "server.pem"))
    server.private_key_pem.write_to_path(str(root / "server.key"))
    client = ca.issue_cert("peerpods-adaptor")
    client.cert_chain_pems[0].write_to_path(str(root / "client.pem"))
    client.private_key_pem.write_to_path(str(root / "client.key"))
    stranger = other_ca.issue_cert("someone-else")
    stranger.cert_chain_pems[0].write_to_path(str(root / "stranger.pem"))
    stranger.private_key_pem.write_to_path(str(root / "stranger.key"))
    return (
        "-tls-cert",
        str(root / "server.pem"),
        "-tls-key",
        str(root / "server.key"),
        "-tls-client-ca",
        str(root / "ca.pem"),
    )


def _agent_tls_args(root: Path, endpoint: str, cert: str) -> list[str]:
    """`serve` flags for a static pod VM at `endpoint`, reached over TLS as `cert`."""
    return [
        "--provider",
        "static",
        "--static-endpoints",
        endpoint,
        "--proxy-timeout",
        "2s",
        "--agent-tls",
        "--agent-tls-ca",
        str(root / "ca.pem"),
        "--agent-tls-cert",
        str(root / f"{cert}.pem"),
        "--agent-tls-key",
        str(root / f"{cert}.key"),
    ]


def test_bad_provider_settings_change_nothing(root: Path) -> None:
    import subprocess
    import sys

    state = root / "state"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "adaptor.cli.main",
            "serve",
            "--provider",
            "gcp",
            "--socket",
            str(root / "hv.sock"),
            "--state-dir",
            str(state),
            "--pods-dir",
            str(root / "pods"),
            "--no-agent-tls",
            "--pod-vm-image",
            "projects/p/global/images/podvm",
            # the metadata server the node would ask, on a loopback port nothing serves
            "--instance-metadata-url",
            f"http://127.0.0.1:{closed_port()}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("PEERPODS_")},
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "peerpods serve: gcp provider: --gcp-project and --gcp-zones are required"
    ), lines
    assert not state.exists() and not (root / "hv.sock").exists()


async def test_a_live_socket_is_never_taken_over(serve: ServeProcess, root: Path) -> None:
    # another state directory, the same socket: refused, and the first daemon still serves it
    other = ServeProcess(root, [*serve_args("127.0.0.1:1"), "--state-dir", str(root / "other")])
    with pytest.raises(RuntimeError, match="another peerpods serve is serving"):
        await other.start()
    assert other.process is not None and other.process.returncode == 2
    assert "Traceback" not in other.log()
    assert (await serve.create_vm(SID))["code"] == 0
