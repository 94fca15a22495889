"""What operators see of the daemon's work: capacity fallbacks and GC deletions are counted, and
every log line of a sandbox's calls names the sandbox and its pod."""

from __future__ import annotations

import io
import json
import logging
import tempfile
from pathlib import Path

from adaptor.hypervisor.gc import GarbageCollector
from adaptor.hypervisor.sandboxes import ManagerConfig, SandboxManager, SandboxTable
from adaptor.node.wiring import count_capacity_fallback
from adaptor.planning.placement import Placement
from adaptor.runtime import metrics
from adaptor.runtime.logs import JsonFormatter
from adaptor.state import StateStore
from providers.clouds.retry import RetryPolicy, Site, create_with_fallback
from providers.core.base import TAG_OWNER, TAG_SANDBOX, Instance, VMCandidate
from providers.core.errors import CapacityError
from tests.adaptor.daemon_proc import ANNOTATIONS
from tests.adaptor.fakes import FakeProvider, FakeProxies


def sample(counter: object, **labels: str) -> float:
    return float(counter.labels(**labels)._value.get())  # type: ignore[attr-defined]


async def test_capacity_fallbacks_are_counted_by_provider_and_code() -> None:
    before = sample(
        metrics.CAPACITY_FALLBACKS, provider="aws", reason="InsufficientInstanceCapacity"
    )

    async def attempt(placement: Site) -> Instance:
        if placement.zone == "us-east-1a":
            raise CapacityError("InsufficientInstanceCapacity: no p5 in us-east-1a")
        return Instance("i-1", "vm", ("10.0.0.1",), placement.instance_type, placement.zone)

    p5 = VMCandidate("p5.48xlarge")
    order = [Site(p5, "us-east-1a"), Site(p5, "us-east-1b")]
    got = await create_with_fallback(
        "sandbox sb", order, attempt, RetryPolicy(), "aws", count_capacity_fallback
    )
    assert got.zone == "us-east-1b"
    after = sample(
        metrics.CAPACITY_FALLBACKS, provider="aws", reason="InsufficientInstanceCapacity"
    )
    assert after == before + 1


async def test_gc_deletions_are_counted() -> None:
    provider = FakeProvider()
    orphan = Instance(
        "vm-gone", "gone", (), "g6.xlarge", tags={TAG_OWNER: "node-a", TAG_SANDBOX: "gone"}
    )
    provider.vms[orphan.id] = orphan
    before = sample(metrics.GC_DELETIONS, provider="fake")

    async def known() -> list[str]:
        return []

    result = await GarbageCollector(provider, "node-a", known, interval_seconds=60).sweep()
    assert result.deleted == ["vm-gone"]
    assert sample(metrics.GC_DELETIONS, provider="fake") == before + 1


async def test_sandbox_log_lines_name_the_sandbox_and_pod() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("adaptor.hypervisor")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as root:
        store = await StateStore.open(Path(root) / "state")
        manager = SandboxManager(
            SandboxTable(
                ManagerConfig(pods_dir=Path(root) / "pods"),
                store,
                FakeProvider(),
                Placement(),
                FakeProxies(),
            )
        )
        try:
            await manager.create_vm("sb-logs", ANNOTATIONS)
            await manager.start_vm("sb-logs")
            await manager.stop_vm("sb-logs")
        finally:
            await manager.close(0)
            await store.close()
            logger.removeHandler(handler)
            logger.setLevel(old_level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(lines) >= 3  # recorded, created/running, stopped
    for line in lines:
        assert (line["sandbox_id"], line["pod"]) == ("sb-logs", "default/pod-a"), line
