"""The status API under a hostile local user: its port taken first by another (non-root) user,
a thousand idle connections under a soft limit of 1024 open files, half-sent request lines.
None of it may cost the pods anything: `serve` starts and serves, a take-over keeps every agent
connection, CreateVM and /healthz answer within the shim's one second."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import resource
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from adaptor.ttrpc import Client
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from tests.adaptor.daemon_proc import ANNOTATIONS, HYPERVISOR, ServeProcess
from tests.adaptor.handoff_rig import running_node, sandbox_id, serve_args

USER = "ppsquat"
SHIM_SECONDS = 1.0  # Kata's shim may give up on a hypervisor call after this


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def root() -> Iterator[Path]:
    # short paths: a unix socket path must fit in 108 bytes
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        yield Path(directory)


@pytest.fixture
def squatter() -> Iterator[int]:
    """A port on 127.0.0.1 bound and listened on by a real non-root user."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("needs root (to create a user) under CI")
        pytest.skip("needs root to create a user")
    subprocess.run(["userdel", USER], capture_output=True, check=False)
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/false", USER], check=True)
    port = free_port()
    user = pwd.getpwnam(USER)
    ready, told = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user: binds the port and holds it
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            squat = socket.socket()
            squat.bind(("127.0.0.1", port))
            squat.listen()
            os.write(told, b"b")
            time.sleep(600)
        finally:
            os._exit(0)
    os.close(told)
    try:
        assert os.read(ready, 1) == b"b"
        yield port
    finally:
        os.close(ready)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        subprocess.run(["userdel", USER], capture_output=True, check=False)


async def call(socket_path: str, method: str, message: object, seconds: float) -> bytes:
    """A hypervisor call as the shim makes it, given up after `seconds`."""

    async def one() -> bytes:
        async with await Client.connect_unix(socket_path) as client:
            return await client.call(
                HYPERVISOR,
                method,
                message.SerializeToString(),  # type: ignore[attr-defined]
                timeout_nano=int(seconds * 1e9),
            )

    return await asyncio.wait_for(one(), seconds)


async def test_a_squatted_status_port_neither_stops_serve_nor_a_take_over(
    root: Path, squatter: int
) -> None:
    async with running_node(root, 2, "--status-address", f"127.0.0.1:{squatter}") as node:
        assert node.serve is not None
        first = node.serve
        assert "status API: cannot listen on" in first.log()
        new = await node.hand_off()
        assert "Traceback" not in new.log()
        # every agent connection was kept: the shims' long-lived calls are still waiting
        for shim in node.shims:
            assert shim.open and shim.pause_wait is not None and not shim.pause_wait.done()
            assert shim.errors == []
        # and the shims' later StopVMs (one each, never retried) are answered
        for index in range(2):
            await node.hypervisor("StopVM", pb.StopVMRequest(id=sandbox_id(index)))
        rows = new.rows("SELECT id FROM sandboxes")
        assert rows == []


async def test_a_squatted_status_port_is_bound_once_free(root: Path, squatter: int) -> None:
    from adaptor.status import server as status_server

    serve = ServeProcess(
        root,
        [*serve_args(["127.0.0.1:1"]), "--status-address", f"127.0.0.1:{squatter}"],
        env={},
    )
    await serve.start()
    try:
        await call(
            serve.socket,
            "CreateVM",
            pb.CreateVMRequest(id="sb1", annotations=ANNOTATIONS),
            SHIM_SECONDS * 5,
        )
        assert "retrying every" in serve.log()
        assert status_server.BIND_RETRY_SECONDS <= 5
    finally:
        await serve.kill()


async def test_the_status_listener_moves_with_a_take_over(root: Path) -> None:
    async with running_node(root, 1) as node:
        assert node.serve is not None
        before = node.serve.status_url
        assert before
        new = await node.hand_off()
        assert new.status_url == before  # the same listener, never free for another to take
        async with httpx.AsyncClient(base_url=new.status_url, timeout=10) as http:
            assert (await http.get("/healthz")).text == "ok"
        assert "status API: cannot listen" not in new.log()


class LimitedServe(ServeProcess):
    """`serve` under a soft and hard limit of 1024 open files (as under containerd 2.x)."""

    def argv(self) -> list[str]:
        return ["prlimit", "--nofile=1024:1024", "--", *super().argv()]


async def test_idle_status_connections_leave_createvm_and_healthz_answering(root: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2400:
        pytest.skip(f"the test itself needs 2400 open files (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2400), hard))
    serve = LimitedServe(root, serve_args(["127.0.0.1:1"]))
    await serve.start()
    held: list[socket.socket] = []
    try:
        host, port = serve.status_url.removeprefix("http://").rsplit(":", 1)
        for _ in range(1100):
            sock = socket.socket()
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.connect((host, int(port)))
            held.append(sock)
        await asyncio.sleep(0.5)  # the daemon accepts (and refuses) them meanwhile
        created = await call(
            serve.socket,
            "CreateVM",
            pb.CreateVMRequest(id="sb1", annotations=ANNOTATIONS),
            SHIM_SECONDS,
        )
        assert pb.CreateVMResponse.FromString(created).agentSocketPath
        async with httpx.AsyncClient(base_url=serve.status_url, timeout=SHIM_SECONDS) as http:
            assert (await http.get("/healthz")).text == "ok"
        assert "Too many open files" not in serve.log()
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        await serve.kill()


async def test_a_half_sent_request_line_is_dropped(root: Path) -> None:
    serve = ServeProcess(root, serve_args(["127.0.0.1:1"]))
    await serve.start()
    try:
        host, port = serve.status_url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1")  # never finished
        await writer.drain()
        # dropped after the header deadline (5 s); without one it would be held for ever
        assert await asyncio.wait_for(reader.read(), 30) == b""
        writer.close()
    finally:
        await serve.kill()
