"""Warm pools on GCP (the repository's fake Compute Engine, compute_v1's own REST transport),
behind the latency-modelled cloud: warm VMs are labelled as the pool's (never a sandbox's) and
stopped (TERMINATED) once their guest powered off; an adoption replaces the metadata's user
data and the labels (the sandbox's on, the pool's off, before the start) and starts the VM."""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adaptor.hypervisor.gc import GarbageCollector
from adaptor.state import StateStore
from adaptor.warmpool import Pool, PoolRecord, SlotState, WarmConfig, WarmPool
from providers.clouds.gcp import GcpConfig, GcpProvider
from providers.clouds.retry import RetryPolicy
from providers.core.base import TAG_OWNER, TAG_SANDBOX, VMCandidate, VMSpec
from providers.core.warm import TAG_WARM_POOL, TAG_WARM_SLOT
from tests.clouds.conftest import loopback
from tests.clouds.fake_gce import FakeGce
from tests.clouds.latency import LatencyCloud, LatencyModel
from tests.clouds.warm_userdata import warm_request
from tests.providers.fakes.gcp import PROJECT

OWNER = "warm-gcp-owner"
ZONE = "us-central1-a"
TYPE = "g2-standard-4"
IMAGE = "projects/peerpods/global/images/podvm-gpu"
MODEL = LatencyModel(scale=0.001)


def gcp(gce: FakeGce) -> GcpProvider:
    config = GcpConfig(
        project=PROJECT,
        zones=(ZONE,),
        image=IMAGE,
        policy=RetryPolicy(rng=random.Random(1), base_delay_seconds=0.001),
    )
    return GcpProvider(config, OWNER, client=gce.client(), resolve=loopback)


@pytest.fixture
async def store() -> AsyncIterator[StateStore]:
    with tempfile.TemporaryDirectory() as directory:
        opened = await StateStore.open(Path(directory))
        yield opened
        await opened.close()


async def warm(pool: WarmPool, count: int) -> None:
    deadline = time.monotonic() + 20
    while sum(s.state is SlotState.WARM for s in pool.slots.values()) < count:
        assert time.monotonic() < deadline, "pool not warm"
        await asyncio.sleep(0.02)


def metadata(raw: dict[str, Any]) -> dict[str, str]:
    return {i["key"]: i["value"] for i in raw["metadata"].get("items", [])}


async def test_gcp_warm_vms_stop_and_are_adopted(store: StateStore) -> None:
    gce = FakeGce()
    cloud = LatencyCloud(gcp(gce), MODEL)
    pool = WarmPool(
        cloud,
        PoolRecord(store),
        WarmConfig(pools=(Pool(TYPE, 2, ZONE),), interval_seconds=0.05, images=("busybox",)),
        default_image=IMAGE,
        zones=(ZONE,),
    )
    pool.start()
    try:
        await warm(pool, 2)
        for raw in gce.instances.values():
            assert raw["status"] == "TERMINATED"
            assert raw["labels"][TAG_WARM_POOL] == OWNER and TAG_SANDBOX not in raw["labels"]
            assert metadata(raw)[TAG_WARM_SLOT] in pool.slots
            assert warm_request(metadata(raw)["user-data"]).images == ("busybox",)
        # the sandbox orphan collector leaves them alone
        assert (await GarbageCollector(gcp(gce), OWNER, _none).sweep()).deleted == []
        assert len(await gcp(gce).warm_vms()) == 2
        spec = VMSpec(
            sandbox_id="sb-gcp",
            pod_namespace="default",
            pod_name="train",
            candidates=(VMCandidate(TYPE),),
            user_data="#cloud-config\n# the pod's\n",
        )
        instance = await pool.adopt(spec)
        assert instance is not None
        zone, _, name = instance.id.partition("/")
        raw = gce.instances[(zone, name)]
        assert raw["status"] == "RUNNING"
        assert raw["labels"][TAG_SANDBOX] == "sb-gcp" and raw["labels"][TAG_OWNER] == OWNER
        assert TAG_WARM_POOL not in raw["labels"] and TAG_WARM_SLOT not in raw["labels"]
        assert metadata(raw)["user-data"] == spec.user_data
        assert metadata(raw)[TAG_SANDBOX] == "sb-gcp" and TAG_WARM_POOL not in metadata(raw)
        assert instance.tags[TAG_SANDBOX] == "sb-gcp"
        await warm(pool, 2)  # refilled
        assert cloud.warm_launches == 3
    finally:
        await pool.stop()
        await cloud.close()
    assert gcp(gce).stopped_cost_per_hour(TYPE) == pytest.approx(20 * 0.10 / 730)


async def _none() -> list[str]:
    return []
