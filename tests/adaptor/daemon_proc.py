"""`peerpods serve` as a real subprocess for tests, and the calls the shim would make (through the
Go client, or ours for an in-process daemon)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptor.node.settings import ServeSettings
from adaptor.ttrpc import Client
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from tests.go.peers import go_call

ROOT = Path(__file__).resolve().parents[2]
HYPERVISOR = "hypervisor.Hypervisor"

ANNOTATIONS = {
    "io.kubernetes.cri.sandbox-name": "pod-a",
    "io.kubernetes.cri.sandbox-namespace": "default",
    "io.katacontainers.config.hypervisor.machine_type": "",
    "io.katacontainers.config.hypervisor.image": "",
    "io.katacontainers.config.hypervisor.default_vcpus": "2",
    "io.katacontainers.config.hypervisor.default_memory": "4096",
    "io.katacontainers.config.hypervisor.cc_init_data": "",
    "io.katacontainers.config.hypervisor.default_gpus": "0",
    "io.katacontainers.config.hypervisor.default_gpu_model": "",
}


def daemon_settings(root: Path, **extra: Any) -> ServeSettings:
    """Settings of an in-process daemon whose sockets and state live under `root`, agent TLS off."""
    return ServeSettings.build(
        socket=root / "hv.sock",
        pods_dir=root / "pods",
        state_dir=root / "state",
        agent_tls={"enabled": False},
        **{"status_address": "", **extra},  # no status API unless asked
    )


async def hypervisor_call(socket: str, method: str, message: Any) -> bytes:
    """One Hypervisor call as the shim makes it, on our ttrpc client (30 s deadline)."""
    async with await Client.connect_unix(socket) as client:
        return await client.call(
            HYPERVISOR, method, message.SerializeToString(), timeout_nano=30 * 10**9
        )


@dataclass
class ServeProcess:
    """One `peerpods serve` process over a directory that outlives it (for restarts)."""

    root: Path
    args: Sequence[str]
    process: asyncio.subprocess.Process | None = None
    logs: list[Path] = field(default_factory=list)
    status_url: str = ""
    # A network namespace (path) the daemon runs in, as a worker node's daemon (tests/podnet).
    netns: str = ""
    # Environment added to the daemon's (the PEERPODS_* of the test's own are dropped).
    env: Mapping[str, str] = field(default_factory=dict)

    def argv(self) -> list[str]:
        """The daemon's command line: `peerpods serve` over `root`, then `args`."""
        return [
            sys.executable,
            "-m",
            "adaptor.cli.main",
            "--log-level",
            "debug",
            "serve",
            "--socket",
            self.socket,
            "--pods-dir",
            str(self.root / "pods"),
            "--state-dir",
            str(self.root / "state"),
            "--status-address",
            "127.0.0.1:0",
            *self.args,
        ]

    @property
    def socket(self) -> str:
        return str(self.root / "hv.sock")

    @property
    def state_db(self) -> Path:
        return self.root / "state" / "sandboxes.db"

    async def start(self, timeout_seconds: float = 30) -> None:
        log = self.root / f"serve-{len(self.logs)}.log"
        self.logs.append(log)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PEERPODS_")}
        env |= {**self.env, "PYTHONPATH": str(ROOT)}
        with log.open("wb") as stderr:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv(),
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=ROOT,
                env=env,
                preexec_fn=_enter(self.netns) if self.netns else None,
            )
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout_seconds)
        except BaseException:
            await self.kill()
            raise
        if b"listening" not in line:
            await self.process.wait()
            raise RuntimeError(f"serve did not start ({self.process.returncode}): {self.log()}")
        ready = line.decode()
        if "status API " in ready:
            self.status_url = ready.split("status API ", 1)[1].rstrip(")\n")

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    async def kill(self) -> None:
        """SIGKILL: no cleanup at all."""
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)
            await self.process.wait()

    async def terminate(self, wait_seconds: float = 20) -> int:
        """SIGTERM and wait for the exit code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.process.wait(), wait_seconds)

    async def call(self, method: str, message: Any, call_timeout: str = "") -> dict[str, Any]:
        return await go_call(
            self.socket, HYPERVISOR, method, message.SerializeToString(), call_timeout=call_timeout
        )

    async def create_vm(
        self, sandbox_id: str, annotations: Mapping[str, str] = ANNOTATIONS
    ) -> dict[str, Any]:
        return await self.call(
            "CreateVM", pb.CreateVMRequest(id=sandbox_id, annotations=dict(annotations))
        )

    async def start_vm(self, sandbox_id: str) -> dict[str, Any]:
        return await self.call("StartVM", pb.StartVMRequest(id=sandbox_id), call_timeout="60s")

    async def stop_vm(self, sandbox_id: str) -> dict[str, Any]:
        return await self.call("StopVM", pb.StopVMRequest(id=sandbox_id), call_timeout="60s")

    def rows(self, query: str) -> list[tuple[Any, ...]]:
        """Read the state database from outside the daemon, as a status tool would."""
        with contextlib.closing(sqlite3.connect(self.state_db)) as db:
            return list(db.execute(query).fetchall())


def _enter(netns: str) -> Any:
    """A preexec_fn moving the child into `netns` before it runs the daemon."""

    def enter() -> None:
        from pyroute2.netns import setns

        setns(netns, flags=0)

    return enter


def exists(path: str | Path) -> bool:
    """Whether a file is there (a plain function: tests call it between awaits)."""
    return os.path.lexists(path)
