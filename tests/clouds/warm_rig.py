"""The whole adaptor (`Daemon`, aws provider, moto in process) behind the latency-modelled cloud,
with a warm pool: what tests/clouds/test_warm_starts.py and tests/bench/warm.py drive.

Every pod VM's forwarder is one fake agent on loopback; a pod's StartVM returns once the adaptor
has connected to it (the agent answering), so a StartVM's duration is StartVM-to-agent-ready.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptor.node.daemon import Daemon
from adaptor.ttrpc import Client
from adaptor.ttrpc.gen import health_pb2
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from adaptor.warmpool import SlotState, WarmPool
from providers.clouds.aws import AwsConfig, AwsProvider
from providers.core.base import Instance
from tests.adaptor.daemon_proc import ANNOTATIONS, HYPERVISOR
from tests.adaptor.fake_agent import FakeAgent
from tests.adaptor.moto_daemon import moto_settings
from tests.clouds.latency import LatencyCloud, LatencyModel

OWNER = "warm-rig"
IMAGE = "ami-0a1b2c3d4e5f60718"
ZONE = "us-east-1a"
TYPE = "m5.large"  # the one allowed type: every pod's placement chooses it first


@dataclass
class Rig:
    """The daemon, its modelled cloud, and the StartVM durations measured."""

    daemon: Daemon
    cloud: LatencyCloud
    agent: FakeAgent
    started: dict[str, float] = field(default_factory=dict)  # sandbox -> StartVM seconds

    @property
    def socket(self) -> str:
        return str(self.daemon.settings.socket)

    @property
    def pool(self) -> WarmPool:
        assert self.daemon.warm is not None
        return self.daemon.warm

    def warm(self) -> int:
        return sum(s.state is SlotState.WARM for s in self.pool.slots.values())

    async def until_warm(self, count: int, seconds: float = 60) -> float:
        """Seconds until the pools hold `count` warm VMs."""
        began = time.monotonic()
        while self.warm() < count:
            if time.monotonic() - began > seconds:
                raise AssertionError(f"pool not refilled to {count} within {seconds:g}s")
            await asyncio.sleep(0.005)
        return time.monotonic() - began

    async def start_pod(self, sandbox_id: str) -> float:
        """CreateVM, then StartVM timed to its answer (the agent reached), then one health
        check through the agent socket."""
        async with await Client.connect_unix(self.socket) as hv:
            request = pb.CreateVMRequest(id=sandbox_id, annotations=ANNOTATIONS)
            created = pb.CreateVMResponse.FromString(
                await hv.call(HYPERVISOR, "CreateVM", request.SerializeToString())
            )
            began = time.monotonic()
            start = pb.StartVMRequest(id=sandbox_id).SerializeToString()
            await hv.call(HYPERVISOR, "StartVM", start, timeout_nano=120 * 10**9)
            took = time.monotonic() - began
        async with await Client.connect_unix(created.agentSocketPath) as agent:
            check = health_pb2.CheckRequest().SerializeToString()
            health = health_pb2.HealthCheckResponse.FromString(
                await agent.call("grpc.Health", "Check", check)
            )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        self.started[sandbox_id] = took
        return took

    async def stop_pod(self, sandbox_id: str) -> None:
        async with await Client.connect_unix(self.socket) as hv:
            stop = pb.StopVMRequest(id=sandbox_id).SerializeToString()
            await hv.call(HYPERVISOR, "StopVM", stop, timeout_nano=120 * 10**9)

    async def instance_of(self, sandbox_id: str) -> Instance:
        assert self.daemon.store is not None
        record = await self.daemon.store.get(sandbox_id)
        assert record is not None and record.instance is not None
        return record.instance


@asynccontextmanager
async def warm_rig(
    root: Path, model: LatencyModel, pool_size: int, endpoint_url: str = "", **settings: Any
) -> AsyncIterator[Rig]:
    """The daemon with a pool of `pool_size` TYPE VMs in ZONE, on moto: its server at
    `endpoint_url`, or in this process (mock_aws must be on)."""
    provider = AwsProvider(
        AwsConfig(
            region="us-east-1",
            image_id=IMAGE,
            zones=(ZONE,),
            allowed_instance_types=(TYPE,),
            poll_interval_seconds=0.05,
            endpoint_url=endpoint_url,
        ),
        OWNER,
    )
    cloud = LatencyCloud(provider, model)
    agent = FakeAgent()
    await agent.start()
    values: dict[str, Any] = {
        "warm_pools": (f"{TYPE}={pool_size}@{ZONE}",),
        "warm_pool_interval_seconds": 0.2,
        "warm_pool_max_vms": max(pool_size, 1),
        "warm_pool_max_cost_per_hour": 1000.0,
        "gc_interval_seconds": 0,
        "reap_grace_seconds": 0,
        "shutdown_grace_seconds": 1,
        "shutdown_drain_seconds": 0,
        "proxy_timeout_seconds": 30,
        "account_quota_refresh_seconds": 3600,
    }
    values.update(settings)
    daemon = Daemon(
        moto_settings(root, OWNER, **values),
        provider=cloud,  # type: ignore[arg-type]
        resolve_endpoint=lambda _vm: ("127.0.0.1", agent.port),
    )
    await daemon.start()
    try:
        _prime(daemon)
        yield Rig(daemon, cloud, agent)
    finally:
        await daemon.close(grace_seconds=0)
        await cloud.close()
        await agent.stop()


def _prime(daemon: Daemon) -> None:
    """Select once for the pods' shape, so no measured StartVM pays for building the catalog's
    index (the first selection over a catalog, about 0.4 s here)."""
    from providers.core.contract import parse_vm_annotations

    assert daemon.manager is not None
    placement = daemon.manager.table.placement
    placement.current.candidates(parse_vm_annotations(ANNOTATIONS))  # type: ignore[attr-defined]
