"""`peerpods serve` killed with SIGKILL while sandboxes with networking are being created and
started, several rounds: after the restart and the StopVMs the kubelet sends, no VXLAN device,
redirect, NOTRACK element, record or VNI lease is left."""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path

from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from tests.adaptor.daemon_proc import ServeProcess
from tests.podnet.leftovers import kernel_leftovers
from tests.podnet.test_serve_restart import FORWARDER_PORT, call, create_and_start, forwarders
from tests.podnet.topology import Topology

ROUNDS = 4
PER_ROUND = 6


def stored(proc: ServeProcess) -> dict[str, int]:
    return {
        "records": proc.rows("SELECT count(*) FROM sandboxes")[0][0],
        "leases": proc.rows("SELECT count(*) FROM leases WHERE pool='vxlan'")[0][0],
    }


async def test_kill_9_while_tunnels_are_built_leaves_nothing(
    topo: Topology, tmp_path: Path
) -> None:
    pods = [(await asyncio.to_thread(topo.add_pod))[0] for _ in range(PER_ROUND)]
    vms = [await asyncio.to_thread(topo.add_vm) for _ in range(PER_ROUND)]
    endpoints = ",".join(f"{ip}:{FORWARDER_PORT}" for _vm, _podns, ip in vms)
    args = ["--provider", "static", "--static-endpoints", endpoints, "--no-agent-tls"]
    proc = ServeProcess(tmp_path, args, netns=topo.worker)
    rng = random.Random(9)
    found: list[dict[str, int]] = []
    with forwarders(vms):
        try:
            for round_ in range(ROUNDS):
                await proc.start()
                names = [f"r{round_}sb{i}" for i in range(PER_ROUND)]
                starts = [
                    asyncio.create_task(create_and_start(proc, name, pods[i]))
                    for i, name in enumerate(names)
                ]
                await asyncio.sleep(rng.uniform(0.05, 0.6))
                await proc.kill()
                await asyncio.gather(*starts, return_exceptions=True)
                await proc.start()
                for name in names:
                    # The kubelet stops every sandbox it started; one never recorded is unknown.
                    with contextlib.suppress(Exception):
                        await call(proc, "StopVM", pb.StopVMRequest(id=name))
                counts = await asyncio.to_thread(kernel_leftovers, topo.worker, pods)
                found.append({**counts, **stored(proc)})
                assert await proc.terminate() == 0
        finally:
            await proc.kill()
    assert all(not any(c.values()) for c in found), (found, proc.log()[-4000:])
