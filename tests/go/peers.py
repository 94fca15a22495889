"""Run the Go reference peers as subprocesses for tests (always stopped, never leaked)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .build import go_binary

if TYPE_CHECKING:
    from adaptor.proxy import AgentProxy


@dataclass
class GoServer:
    """A running ttrpc-echo-server."""

    process: asyncio.subprocess.Process
    address: str  # "HOST:PORT" or a unix path

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    async def kill(self) -> None:
        """SIGKILL: the pod VM vanishes without closing anything."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)
            await self.process.wait()


async def start_echo_server(listen: str = "tcp:127.0.0.1:0", *tls_args: str) -> GoServer:
    """Start ttrpc-echo-server and wait for its "listening ADDR" line."""
    binary = go_binary("ttrpc-echo-server")
    proc = await asyncio.create_subprocess_exec(
        str(binary), "-listen", listen, *tls_args, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 10)
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    text = line.decode().strip()
    if not text.startswith("listening "):
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"ttrpc-echo-server did not start: {text!r}")
    return GoServer(proc, text.split(" ", 1)[1])


@contextlib.asynccontextmanager
async def echo_server(listen: str = "tcp:127.0.0.1:0", *tls_args: str) -> AsyncIterator[GoServer]:
    """ttrpc-echo-server for the duration of a block."""
    server = await start_echo_server(listen, *tls_args)
    try:
        yield server
    finally:
        await server.kill()


@contextlib.asynccontextmanager
async def proxy_connected(proxy: AgentProxy) -> AsyncIterator[AgentProxy]:
    """`proxy` started and dialed to its pod VM for a block, then stopped (socket removed)."""
    await proxy.start()
    try:
        await proxy.connect(5)
        yield proxy
    finally:
        await proxy.stop()


async def go_call(
    target: str,
    service: str,
    method: str,
    payload: bytes = b"",
    *,
    metadata: Sequence[tuple[str, str]] = (),
    call_timeout: str = "",
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """Run ttrpc-call once; `target` is a unix socket path or HOST:PORT. Returns its JSON with
    `payload` (bytes) added; raises RuntimeError when the call did not complete."""
    args = [str(go_binary("ttrpc-call"))]
    args += ["-socket", target] if os.sep in target else ["-addr", target]
    args += ["-service", service, "-method", method, "-payload-hex", payload.hex()]
    for key, value in metadata:
        args += ["-md", f"{key}={value}"]
    if call_timeout:
        args += ["-timeout", call_timeout]
    args += list(extra)
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"ttrpc-call failed ({proc.returncode}): {err.decode().strip()}")
    result: dict[str, Any] = json.loads(out)
    result["payload"] = bytes.fromhex(result["payload_hex"])
    return result
