"""The hand-off listener against hostile input (root-only, but a bug there stops every later
upgrade): a message nested too deep, a client dripping its Hello, and a take-over handed a
hypervisor socket other users could reach."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import struct
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from adaptor.node import handoff
from adaptor.node.handoff import Detached, HandoffListener, check_listener, handoff_path
from adaptor.node.handoff_wire import (
    Ack,
    HandoffError,
    Hello,
    Offer,
    Ready,
    Released,
    decode,
    encode,
)
from adaptor.proxy.moved import MovedProxy
from adaptor.ttrpc.connection import bind_unix
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from tests.adaptor.daemon_proc import ANNOTATIONS, ServeProcess, exists, hypervisor_call
from tests.adaptor.handoff_rig import serve_args


class FakePredecessor:
    """Counts the successors that got as far as a detach, then refuses them."""

    def __init__(self) -> None:
        self.detached = asyncio.Event()

    async def detach(self) -> socket.socket:
        self.detached.set()
        raise RuntimeError("this fake hands nothing over")

    async def freeze(self, moved: Callable[[str, MovedProxy], None]) -> None:
        raise AssertionError("never reached")

    async def take_back(self, detached: Detached, moved: dict[str, MovedProxy]) -> bool:
        raise AssertionError("never reached")

    async def handed_over(self, ok: bool) -> None:
        pass


@pytest.fixture
async def listener(root: Path) -> AsyncIterator[tuple[HandoffListener, FakePredecessor]]:
    predecessor = FakePredecessor()
    listening = HandoffListener(root, predecessor)
    await listening.start()
    try:
        yield listening, predecessor
    finally:
        await listening.stop()


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(path))
    return sock


async def hello_is_heard(root: Path, predecessor: FakePredecessor) -> None:
    """A real successor's Hello still reaches the predecessor."""
    sock = await asyncio.to_thread(connect, handoff_path(root))
    try:
        await asyncio.to_thread(sock.sendall, encode(Hello(pid=os.getpid())))
        await asyncio.wait_for(predecessor.detached.wait(), 15)
    finally:
        sock.close()


def test_a_message_nested_too_deep_is_refused_before_parsing() -> None:
    body = b'{"kind": "hello", "pid": 1, "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with pytest.raises(HandoffError, match="nested deeper"):
        decode(body)
    # brackets inside strings are data, not nesting
    fine = Hello(pid=1).model_dump_json().encode()[:-1] + b"}"
    assert decode(fine) == Hello(pid=1)


async def test_a_deeply_nested_message_does_not_stop_the_listener(
    root: Path, listener: tuple[HandoffListener, FakePredecessor]
) -> None:
    _listening, predecessor = listener
    nested = b"[" * 100_000 + b"]" * 100_000
    sock = await asyncio.to_thread(connect, handoff_path(root))
    await asyncio.to_thread(sock.sendall, struct.pack(">I", len(nested)) + nested)
    assert await asyncio.to_thread(sock.recv, 1) == b""  # refused: closed
    sock.close()
    await hello_is_heard(root, predecessor)


async def test_a_dripping_client_is_cut_off_at_a_total_deadline(
    root: Path,
    listener: tuple[HandoffListener, FakePredecessor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handoff, "HELLO_SECONDS", 1.0)
    _listening, predecessor = listener
    frame = encode(Hello(pid=os.getpid()))

    def drip() -> bool:
        """One byte every 0.2 s (each within the per-read timeout); True once cut off."""
        sock = connect(handoff_path(root))
        try:
            for _ in range(100):  # 20 s of dripping: the frame would take longer
                sock.sendall(frame[:1])
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            return True
        finally:
            sock.close()
        return False

    assert await asyncio.to_thread(drip)
    assert not predecessor.detached.is_set()
    await hello_is_heard(root, predecessor)


def test_check_listener_refuses_what_this_process_would_not_bind(root: Path) -> None:
    path = str(root / "hv.sock")
    good = bind_unix(path, 0o600)
    try:
        check_listener(good, path)
        os.chmod(path, 0o660)
        check_listener(good, path)
        os.chmod(path, 0o666)
        with pytest.raises(HandoffError, match="mode 0666, wider than 0660"):
            check_listener(good, path)
    finally:
        good.close()
    elsewhere = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    os.makedirs(root / "other")
    elsewhere.bind(str(root / "other" / "s"))
    elsewhere.listen()
    datagram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    idle.bind(str(root / "idle"))
    try:
        with pytest.raises(HandoffError, match="not in the directory"):
            check_listener(elsewhere, path)
        with pytest.raises(HandoffError, match="not a unix stream socket"):
            check_listener(datagram, path)
        with pytest.raises(HandoffError, match="not listening"):
            check_listener(idle, path)
    finally:
        for sock in (elsewhere, datagram, idle):
            sock.close()


def fake_predecessor(root: Path, hypervisor: socket.socket) -> Ack:
    """A predecessor that hands over `hypervisor` (blocking): Released, Ready, Offer, Ack."""
    listener = bind_unix(str(handoff_path(root / "pods")), 0o600)
    listener.setblocking(True)
    listener.settimeout(60)
    try:
        while True:
            channel, _ = listener.accept()
            channel.settimeout(60)
            header = channel.recv(4)
            if header:  # the successor's probe connects and closes first
                break
            channel.close()
        (length,) = struct.unpack(">I", header)
        assert isinstance(decode(channel.recv(length)), Hello)
        channel.sendall(encode(Released()))
        (length,) = struct.unpack(">I", channel.recv(4))
        assert isinstance(decode(channel.recv(length)), Ready)
        channel.sendall(encode(Offer(pid=os.getpid(), hypervisor_fd=0, fd_count=1)))
        socket.send_fds(channel, [b"F"], [hypervisor.fileno()])
        (length,) = struct.unpack(">I", channel.recv(4))
        ack = decode(channel.recv(length))
        assert isinstance(ack, Ack)
        channel.close()
        return ack
    finally:
        listener.close()


async def test_a_take_over_refuses_a_hypervisor_socket_others_can_reach(root: Path) -> None:
    serve = ServeProcess(root, [*serve_args(["127.0.0.1:1"]), "--take-over", "always"])
    os.makedirs(root / "pods", mode=0o700)
    wide = bind_unix(serve.socket, 0o666)  # what a rogue predecessor hands over
    wide.setblocking(True)
    try:
        offering = asyncio.create_task(asyncio.to_thread(fake_predecessor, root, wide))
        await asyncio.sleep(0.2)
        await serve.start(timeout_seconds=60)
        ack = await asyncio.wait_for(offering, 30)
        assert ack.ok, ack.error
        log = serve.log()
        assert "refusing the hypervisor socket handed over" in log
        assert "wider than 0660" in log
        assert exists(serve.socket)
        assert stat.S_IMODE(os.lstat(serve.socket).st_mode) == 0o600
        request = pb.CreateVMRequest(id="sb1", annotations=ANNOTATIONS)
        created = await hypervisor_call(serve.socket, "CreateVM", request)
        assert pb.CreateVMResponse.FromString(created).agentSocketPath  # on its own socket
        wide.settimeout(0.1)
        with pytest.raises(TimeoutError):
            wide.accept()  # the handed-over socket never got the call
    finally:
        wide.close()
        await serve.kill()
