"""StartVM through the whole adaptor with a warm pool (AWS on moto, latency-modelled): pods get
the pool's stopped VMs, adopted (their user data the pod's, tagged with the sandbox, started)
while the pool refills behind them; pods beyond the pool launch cold; `GET /v1/warm-pool`
lists the pool; StopVM deletes an adopted VM like any other."""

from __future__ import annotations

import asyncio
import base64
import json
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from providers.core.base import TAG_OWNER, TAG_SANDBOX
from providers.core.warm import TAG_WARM_POOL
from tests.clouds.latency import LatencyModel
from tests.clouds.warm_rig import OWNER, TYPE, ZONE, warm_rig

MODEL = LatencyModel(scale=0.002)  # cold 0.3 s, warm 0.05 s


@pytest.fixture
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pw", dir="/tmp") as directory:
        yield Path(directory)


def vms(ec2: Any) -> dict[str, dict[str, Any]]:
    out = ec2.describe_instances()
    return {i["InstanceId"]: i for r in out["Reservations"] for i in r["Instances"]}


def tags(raw: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}


async def test_pods_adopt_warm_vms_and_the_pool_refills(ec2: Any, root: Path) -> None:
    async with warm_rig(root, MODEL, 3, status_address="127.0.0.1:0") as rig:
        await rig.until_warm(3)
        warm_ids = {s.instance_id for s in rig.pool.slots.values()}
        pods = [f"warm-{n}" for n in range(3)]
        await asyncio.gather(*(rig.start_pod(p) for p in pods))
        assert rig.cloud.adoptions == 3 and rig.cloud.creates == 0
        adopted = {p: await rig.instance_of(p) for p in pods}
        assert {i.id for i in adopted.values()} == warm_ids  # each warm VM once
        cloud = vms(ec2)
        for pod, instance in adopted.items():
            raw = cloud[instance.id]
            assert raw["State"]["Name"] == "running"
            found = tags(raw)
            assert found[TAG_SANDBOX] == pod and found[TAG_OWNER] == OWNER
            assert TAG_WARM_POOL not in found
            data = ec2.describe_instance_attribute(InstanceId=instance.id, Attribute="userData")
            text = base64.b64decode(data["UserData"]["Value"]).decode()
            # the pod's own user data, no longer the pool's
            assert "/run/peerpod/apf.json" in text and '"pod-name":"pod-a"' in text
            assert "poweroff" not in text
        # the pool refills to its size behind them (the pods are not waiting for it)
        await rig.until_warm(3, seconds=30)
        assert rig.cloud.warm_launches == 6
        # two more pods than the pool holds warm at once: the rest launch cold, unnoticed
        more = [f"more-{n}" for n in range(5)]
        await asyncio.gather(*(rig.start_pod(p) for p in more))
        assert rig.cloud.adoptions == 6 and rig.cloud.creates == 2
        # the status API lists the pool
        url = f"{rig.daemon.status.url}/v1/warm-pool" if rig.daemon.status else ""
        listed = json.loads(await asyncio.to_thread(_get, url))
        (pool,) = listed["pools"]
        assert pool["pool"] == f"{TYPE}@{ZONE}" and pool["size"] == 3
        assert listed["cost_per_hour"] > 0
        # and the metrics count them
        text = await asyncio.to_thread(_get, f"{rig.daemon.status.url}/metrics")
        pool_key = f'pool="{TYPE}@{ZONE}"'
        assert f"peerpods_warm_pool_adoptions_total{{{pool_key}}}" in text
        assert 'peerpods_warm_pool_misses_total{reason="empty"}' in text
        assert "peerpods_warm_pool_refill_seconds_count" in text
        assert "peerpods_warm_pool_cost_per_hour" in text
        # StopVM deletes an adopted VM like a cold one
        await rig.stop_pod("warm-0")
        assert vms(ec2)[adopted["warm-0"].id]["State"]["Name"] in ("shutting-down", "terminated")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


async def test_spot_pods_never_get_a_warm_vm(ec2: Any, root: Path) -> None:
    from tests.adaptor.daemon_proc import ANNOTATIONS

    # the capacity type rides in default_gpu_model (providers.core.contract)
    spot = {**ANNOTATIONS, "io.katacontainers.config.hypervisor.default_gpu_model": "v1:cap=spot"}
    async with warm_rig(root, MODEL, 1) as rig:
        await rig.until_warm(1)
        from adaptor.ttrpc import Client
        from adaptor.ttrpc.gen import hypervisor_pb2 as pb
        from tests.adaptor.daemon_proc import HYPERVISOR

        async with await Client.connect_unix(rig.socket) as hv:
            create = pb.CreateVMRequest(id="spot-1", annotations=spot).SerializeToString()
            await hv.call(HYPERVISOR, "CreateVM", create)
            start = pb.StartVMRequest(id="spot-1").SerializeToString()
            await hv.call(HYPERVISOR, "StartVM", start, timeout_nano=60 * 10**9)
        assert rig.cloud.adoptions == 0 and rig.cloud.creates == 1
        assert rig.warm() == 1
        instance = await rig.instance_of("spot-1")
        assert instance.capacity_type == "spot"


def pool_vms(ec2: Any) -> list[dict[str, Any]]:
    live = ("pending", "running", "stopping", "stopped")
    return [
        raw
        for raw in vms(ec2).values()
        if raw["State"]["Name"] in live and TAG_WARM_POOL in tags(raw)
    ]


async def test_a_restart_keeps_the_pool_and_drain_on_exit_empties_it(ec2: Any, root: Path) -> None:
    async with warm_rig(root, MODEL, 2) as rig:
        await rig.until_warm(2)
        kept = {s.instance_id for s in rig.pool.slots.values()}
    # a plain stop (a restart, an upgrade) leaves the pool's stopped VMs for the next start
    assert {raw["InstanceId"] for raw in pool_vms(ec2)} == kept
    async with warm_rig(root, MODEL, 2, warm_pool_drain_on_exit=True) as rig:
        await rig.until_warm(2)
        assert {s.instance_id for s in rig.pool.slots.values()} == kept
        assert rig.cloud.warm_launches == 0  # nothing launched: the record found them
    # stopping with --warm-pool-drain-on-exit (an uninstall) deletes them
    assert pool_vms(ec2) == []
