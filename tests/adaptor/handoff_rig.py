"""A node under hand-off: `serve` processes over one directory, static pod VMs that are fake
agents, and one fake shim per sandbox. Shared by the hand-off test and its benchmark."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from tests.adaptor.daemon_proc import ANNOTATIONS, ServeProcess, hypervisor_call
from tests.adaptor.fake_agent import WORKLOAD, FakeAgent, FakeShim

# A successor's start, taking over included (generous: a loaded CI machine starts Python slowly).
START_SECONDS = 120.0


def serve_args(endpoints: Sequence[str], *extra: str) -> list[str]:
    return [
        "--provider",
        "static",
        "--static-endpoints",
        ",".join(endpoints),
        "--no-agent-tls",
        "--proxy-timeout",
        "20s",
        "--shutdown-grace",
        "2s",
        "--gc-interval",
        "0s",
        *extra,
    ]


def sandbox_id(index: int) -> str:
    return f"sb{index:04d}"


@dataclass
class Node:
    """`count` running sandboxes under one `serve`, each with its agent and its shim."""

    root: Path
    count: int
    extra: Sequence[str] = ()
    agents: list[FakeAgent] = field(default_factory=list)
    shims: list[FakeShim] = field(default_factory=list)
    serve: ServeProcess | None = None
    written: list[bytearray] = field(default_factory=list)

    async def start(self) -> None:
        for _ in range(self.count):
            agent = FakeAgent()
            await agent.start()
            self.agents.append(agent)
            self.written.append(bytearray())
        self.serve = ServeProcess(
            self.root, serve_args([a.endpoint for a in self.agents], *self.extra)
        )
        await self.serve.start()
        for index in range(self.count):
            sid = sandbox_id(index)
            created = await self.hypervisor(
                "CreateVM", pb.CreateVMRequest(id=sid, annotations=ANNOTATIONS)
            )
            socket = pb.CreateVMResponse.FromString(created).agentSocketPath
            await self.hypervisor("StartVM", pb.StartVMRequest(id=sid))
            shim = FakeShim(socket)
            await shim.start()
            self.shims.append(shim)

    async def hypervisor(self, method: str, message: object) -> bytes:
        assert self.serve is not None
        return await hypervisor_call(self.serve.socket, method, message)

    def write(self, index: int, data: bytes) -> None:
        """The workload container of sandbox `index` prints `data`."""
        self.written[index] += data
        self.agents[index].containers[WORKLOAD].write(data)

    async def hand_off(self, *extra: str) -> ServeProcess:
        """Start a successor; returns once it serves and its predecessor exited (code 0)."""
        assert self.serve is not None
        self.serve = await hand_off(self.root, self.serve, *extra)
        return self.serve

    async def close(self) -> None:
        for shim in self.shims:
            await shim.close()
        if self.serve is not None:
            await self.serve.kill()
        for agent in self.agents:
            await agent.stop()


async def hand_off(root: Path, old: ServeProcess, *extra: str) -> ServeProcess:
    """Start a successor to `old` (its arguments plus `extra`); returns it once it serves and
    `old` exited with code 0."""
    assert old.process is not None
    new = ServeProcess(root, [*old.args, *extra], logs=list(old.logs))
    await new.start(timeout_seconds=START_SECONDS)
    code = await asyncio.wait_for(old.process.wait(), START_SECONDS)
    if code != 0:
        raise RuntimeError(f"the predecessor exited with {code}: {old.log()}")
    return new


@contextlib.asynccontextmanager
async def running_node(root: Path, count: int, *extra: str) -> AsyncIterator[Node]:
    node = Node(root, count, extra)
    try:
        await node.start()
        yield node
    finally:
        await node.close()
