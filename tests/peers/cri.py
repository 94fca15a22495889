"""The few CRI calls a kubelet makes for one pod (runtime.v1), over containerd's gRPC socket, with
the messages encoded here field by field: no CRI package is needed for seven small messages."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from tests.node.containerd import _fields

if TYPE_CHECKING:
    from tests.shim_emulator import PodVMAgent

# (what, check) -> once check() is truthy, or a failed test naming `what`
Wait = Callable[[str, Callable[[], object]], Awaitable[object]]

SERVICE = "/runtime.v1.RuntimeService/"
NETWORK_NODE = 2  # NamespaceMode.NODE: the host's network, no CNI needed
EXITED = 2  # ContainerState.CONTAINER_EXITED


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _bytes(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _str(number: int, text: str) -> bytes:
    return _bytes(number, text.encode())


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def pod_config(name: str, uid: str, namespace: str = "default") -> bytes:
    """PodSandboxConfig: metadata, hostname, host network."""
    metadata = _str(1, name) + _str(2, uid) + _str(3, namespace) + _int(4, 0)
    linux = _bytes(2, _bytes(1, _int(1, NETWORK_NODE)))  # security_context.namespace_options
    return _bytes(1, metadata) + _str(2, name) + _bytes(8, linux)


def container_config(name: str, image: str, command: str) -> bytes:
    return _bytes(1, _str(1, name)) + _bytes(2, _str(1, image)) + _str(3, command)


class Cri:
    """A blocking CRI client (call it from a thread)."""

    def __init__(self, socket: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket}")

    def close(self) -> None:
        self.channel.close()

    def _call(self, method: str, request: bytes, timeout: float = 120) -> dict[int, object]:
        reply = self.channel.unary_unary(SERVICE + method)(request, timeout=timeout)
        return dict(_fields(reply))

    def run_pod_sandbox(self, config: bytes, handler: str) -> str:
        reply = self._call("RunPodSandbox", _bytes(1, config) + _str(2, handler))
        return bytes(reply[1]).decode()  # type: ignore[arg-type]

    def create_container(self, sandbox_id: str, config: bytes, sandbox_config: bytes) -> str:
        request = _str(1, sandbox_id) + _bytes(2, config) + _bytes(3, sandbox_config)
        return bytes(self._call("CreateContainer", request)[1]).decode()  # type: ignore[arg-type]

    def start_container(self, container_id: str) -> None:
        self._call("StartContainer", _str(1, container_id))

    def container_state(self, container_id: str) -> tuple[int, int]:
        """(state, exit code)."""
        status = dict(_fields(bytes(self._call("ContainerStatus", _str(1, container_id))[1])))  # type: ignore[arg-type]
        return int(status.get(3, 0)), int(status.get(7, 0))  # type: ignore[call-overload]

    def remove_container(self, container_id: str) -> None:
        self._call("RemoveContainer", _str(1, container_id))

    def stop_pod_sandbox(self, sandbox_id: str) -> None:
        self._call("StopPodSandbox", _str(1, sandbox_id))

    def remove_pod_sandbox(self, sandbox_id: str) -> None:
        self._call("RemovePodSandbox", _str(1, sandbox_id))


async def exit_and_tear_down(
    cri: Cri, pod_vm: PodVMAgent, sandbox: str, container: str, output: bytes, wait: Wait
) -> None:
    """A started container's end as the kubelet sees it through the shim: the pod VM's process
    writes `output`, closes its stdout and stderr and exits 7, which CRI reports; then the pod's
    teardown: the shim signals the pause container, which ends (137), and the sandbox goes."""
    pod_vm.write(container, output)
    pod_vm.write(container, b"")
    pod_vm.write(container, b"")
    pod_vm.exit(container, 7)
    await wait("the container's exit", lambda: cri.container_state(container) == (EXITED, 7))
    signals = pod_vm.calls.count("SignalProcess")
    stopping = asyncio.ensure_future(asyncio.to_thread(cri.stop_pod_sandbox, sandbox))
    await wait(
        "the pause container's signal", lambda: pod_vm.calls.count("SignalProcess") > signals
    )
    pod_vm.exit(sandbox, 137)
    await asyncio.wait_for(stopping, 120)
    await asyncio.to_thread(cri.remove_pod_sandbox, sandbox)
