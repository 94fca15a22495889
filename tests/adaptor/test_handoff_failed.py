"""A rollout whose new `serve` cannot start must cost the running one nothing. A successor whose
agent TLS files do not load fails before its predecessor lets go of anything; one that breaks
off after the predecessor released its store (or fails after taking the sockets) has the
predecessor take everything back. Either way the predecessor goes on serving its pods (every
shim connection kept, output still flowing), new CreateVMs and the shims' StopVMs, and a later
hand-off still works."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from adaptor.node import handoff
from adaptor.node.handoff_wire import Ack, Hello, Moved, Offer, Ready, Released, encode
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from tests.adaptor.daemon_proc import ANNOTATIONS, ServeProcess
from tests.adaptor.handoff_rig import Node, running_node, sandbox_id


async def test_a_successor_with_bad_tls_files_leaves_the_predecessor_serving(root: Path) -> None:
    bad = root / "bad.pem"
    bad.write_text("not a certificate\n")
    async with running_node(root, 2) as node:
        old = node.serve
        assert old is not None and old.process is not None
        new = ServeProcess(
            root,
            [
                *[a for a in old.args if a != "--no-agent-tls"],
                "--agent-tls-ca",
                str(bad),
                "--agent-tls-cert",
                str(bad),
                "--agent-tls-key",
                str(bad),
            ],
            logs=list(old.logs),
        )
        with pytest.raises(RuntimeError, match="did not start"):
            await new.start(timeout_seconds=60)
        assert "no certificate or crl found" in new.log()
        await asyncio.sleep(0.5)
        assert old.process.returncode is None  # the predecessor never let go
        for shim in node.shims:
            assert shim.open and shim.pause_wait is not None and not shim.pause_wait.done()
        created = await node.hypervisor(
            "CreateVM", pb.CreateVMRequest(id="late", annotations=ANNOTATIONS)
        )
        assert pb.CreateVMResponse.FromString(created).agentSocketPath
        await node.hypervisor("StopVM", pb.StopVMRequest(id="late"))
        for index in range(2):  # each shim's one StopVM is answered, nothing was abandoned
            await node.hypervisor("StopVM", pb.StopVMRequest(id=sandbox_id(index)))
        assert old.rows("SELECT id FROM sandboxes") == []
        assert "abandoned" not in old.log()


def failing_successor(root: Path, after_sockets: bool) -> int:
    """A successor that says Hello, gets Released, and then breaks off (or, `after_sockets`,
    takes every socket and acks a failure, closing its copies); the descriptors it got."""
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    channel.settimeout(60)
    channel.connect(str(root / "pods" / ".handoff"))
    got = 0
    try:
        channel.sendall(encode(Hello(pid=os.getpid())))
        assert isinstance(handoff._receive(channel), Released)
        if not after_sockets:
            return 0
        channel.sendall(encode(Ready()))
        while True:
            message = handoff._receive(channel)
            assert isinstance(message, (Moved, Offer))
            for fd in handoff._receive_fds(channel, message.fd_count):
                os.close(fd)  # as a process that dies does: no shutdown, only a close
                got += 1
            if isinstance(message, Offer):
                break
        channel.sendall(encode(Ack(ok=False, error="the successor failed")))
        return got
    finally:
        channel.close()


async def still_serving(node: Node, old: ServeProcess, line: bytes) -> None:
    """Every shim connection kept and served (`line` printed reaches every shim), new
    sandboxes and their StopVMs taken."""
    assert old.process is not None and old.process.returncode is None
    for shim in node.shims:
        assert shim.open and shim.pause_wait is not None and not shim.pause_wait.done()
    for index in range(len(node.shims)):
        node.write(index, line)
    for _ in range(100):
        if all(shim.output.endswith(line) for shim in node.shims):
            break
        await asyncio.sleep(0.1)
    for index, shim in enumerate(node.shims):
        assert shim.output == node.written[index], (shim.errors, old.log())
    created = await node.hypervisor(
        "CreateVM", pb.CreateVMRequest(id="late", annotations=ANNOTATIONS)
    )
    assert pb.CreateVMResponse.FromString(created).agentSocketPath
    await node.hypervisor("StopVM", pb.StopVMRequest(id="late"))


async def taken_back(old: ServeProcess) -> None:
    for _ in range(300):
        if "serving everything again after the failed hand-off" in old.log():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(old.log())


@pytest.mark.parametrize("after_sockets", [False, True])
async def test_a_failed_hand_off_is_taken_back(root: Path, after_sockets: bool) -> None:
    async with running_node(root, 2) as node:
        old = node.serve
        assert old is not None
        for index in range(2):
            node.write(index, b"before\n")
        got = await asyncio.to_thread(failing_successor, root, after_sockets)
        assert got > 0 if after_sockets else got == 0
        await taken_back(old)
        await still_serving(node, old, b"after the failed hand-off\n")
        new = await node.hand_off()  # a later rollout still hands over
        await still_serving(node, new, b"after the next hand-off\n")
        for index in range(2):  # each shim's one StopVM is answered, nothing was abandoned
            await node.hypervisor("StopVM", pb.StopVMRequest(id=sandbox_id(index)))
        assert node.serve is not None
        assert node.serve.rows("SELECT id FROM sandboxes") == []
        assert "abandoned" not in node.serve.log()
        assert "Traceback" not in node.serve.log()
