"""`peerpods serve` itself, run inside the worker netns: ten live tunnels survive `kill -9` and a
restart, new pods get fresh VNIs, StopVM of the old pods removes their tunnels, and the worker
netns ends as it began."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from tests.adaptor.daemon_proc import ANNOTATIONS, ServeProcess, hypervisor_call
from tests.podnet.caa_decode import decode_apf
from tests.podnet.snapshot import snapshot
from tests.podnet.topology import Topology, podvm_setup, sock, udp_roundtrip

FORWARDER_PORT = 15150


@contextlib.contextmanager
def forwarders(vms: list[tuple[str, str, str]]) -> Iterator[None]:
    """A TCP listener on each pod VM's forwarder port that accepts and holds connections."""
    stop = threading.Event()
    with contextlib.ExitStack() as stack:
        listeners = []
        for vm, _podns, ip in vms:
            listener = stack.enter_context(sock(vm))
            listener.bind((ip, FORWARDER_PORT))
            listener.listen(64)
            listener.settimeout(0.2)
            listeners.append(listener)
        held: list[socket.socket] = []

        def accept() -> None:
            while not stop.is_set():
                for listener in listeners:
                    with contextlib.suppress(TimeoutError, OSError):
                        held.append(listener.accept()[0])

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(5)
            for conn in held:
                conn.close()


async def call(proc: ServeProcess, method: str, message: object) -> None:
    await hypervisor_call(proc.socket, method, message)


async def create_and_start(proc: ServeProcess, sandbox: str, netns: str) -> None:
    annotations = {**ANNOTATIONS, "io.kubernetes.cri.sandbox-name": sandbox}
    await call(
        proc,
        "CreateVM",
        pb.CreateVMRequest(id=sandbox, annotations=annotations, networkNamespacePath=netns),
    )
    await call(proc, "StartVM", pb.StartVMRequest(id=sandbox))


def tunnels(proc: ServeProcess) -> dict[str, tuple[str, int]]:
    """sandbox -> (its VM's address, its VNI), read from the state database."""
    found = {}
    for sandbox, instance, pod_network in proc.rows(
        "SELECT id, instance, pod_network FROM sandboxes"
    ):
        address = json.loads(instance)["addresses"][0]
        found[sandbox] = (address, json.loads(pod_network)["network"]["vxlan-id"])
    return found


async def test_kill_9_with_ten_live_tunnels(topo: Topology, tmp_path: Path) -> None:
    live, later = 10, 2
    pods = [await asyncio.to_thread(topo.add_pod) for _ in range(live + later)]
    vms = [await asyncio.to_thread(topo.add_vm) for _ in range(live + later)]
    by_address = {ip: (vm, podns) for vm, podns, ip in vms}
    before = await asyncio.to_thread(snapshot, topo.worker)
    endpoints = ",".join(f"{ip}:{FORWARDER_PORT}" for _vm, _podns, ip in vms)
    args = ["--provider", "static", "--static-endpoints", endpoints, "--no-agent-tls"]
    proc = ServeProcess(tmp_path, args, netns=topo.worker)

    async def reachable(sandbox: int) -> bool:
        address, _vni = tunnels(proc)[f"sb{sandbox}"]
        podns = by_address[address][1]
        echoed = await asyncio.to_thread(udp_roundtrip, podns, pods[sandbox][1], topo.peer, b"ping")
        return echoed == b"ping"

    with forwarders(vms):
        await proc.start()
        try:
            for i in range(live):
                await create_and_start(proc, f"sb{i}", pods[i][0])
            for sandbox, (address, _vni) in tunnels(proc).items():
                apf = json.loads((tmp_path / "pods" / sandbox / "apf.json").read_text())
                decode_apf(apf)
                vm, podns = by_address[address]
                await asyncio.to_thread(podvm_setup, vm, podns, apf)
            assert all([await reachable(i) for i in range(live)])
            await proc.kill()
            await proc.start()
            assert all([await reachable(i) for i in range(live)])
            held = {vni for _address, vni in tunnels(proc).values()}
            for i in range(live, live + later):
                await create_and_start(proc, f"sb{i}", pods[i][0])
            fresh = {tunnels(proc)[f"sb{i}"][1] for i in range(live, live + later)}
            assert len(fresh) == later and not fresh & held
            for i in range(live + later):
                await call(proc, "StopVM", pb.StopVMRequest(id=f"sb{i}"))
            assert tunnels(proc) == {}
            assert await proc.terminate() == 0
        finally:
            await proc.kill()
    assert await asyncio.to_thread(snapshot, topo.worker) == before, proc.log()
