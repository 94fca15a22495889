"""The sandbox lifecycle with a fake provider and proxy: order, cleanup, concurrency, recovery."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adaptor.hypervisor import (
    ManagerConfig,
    SandboxBusy,
    SandboxManager,
    SandboxNotFound,
    SandboxTable,
    StartAborted,
    StartTimeout,
)
from adaptor.planning.placement import Placement
from adaptor.state import SandboxState, StateStore
from adaptor.ttrpc import Code, TtrpcError
from providers.core.errors import AnnotationError, InvalidRequest, ProviderError
from tests.adaptor.fakes import FakeProvider, FakeProxies

ANNOTATIONS = {
    "io.kubernetes.cri.sandbox-name": "pod-a",
    "io.kubernetes.cri.sandbox-namespace": "default",
    "io.katacontainers.config.hypervisor.machine_type": "g5.xlarge",
    "io.katacontainers.config.hypervisor.default_vcpus": "4",
    "io.katacontainers.config.hypervisor.default_memory": "8192",
    "io.katacontainers.config.hypervisor.default_gpus": "1",
    "io.katacontainers.config.hypervisor.default_gpu_model": "v1:m=a10g",
    "io.katacontainers.config.hypervisor.image": "",
    "io.katacontainers.config.hypervisor.cc_init_data": "",
}


class Env:
    def __init__(self, root: Path, store: StateStore) -> None:
        self.root = root
        self.store = store
        self.provider = FakeProvider()
        self.proxies = FakeProxies()
        self.manager = self.make_manager()

    def make_manager(self) -> SandboxManager:
        return SandboxManager(
            SandboxTable(
                ManagerConfig(
                    pods_dir=self.root / "pods", proxy_timeout_seconds=1, delete_retry_seconds=0.01
                ),
                self.store,
                self.provider,
                Placement(),
                self.proxies,
            )
        )


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as root:
        store = await StateStore.open(Path(root) / "state")
        environment = Env(Path(root), store)
        yield environment
        await environment.manager.close(0)
        await store.close()


async def test_create_records_before_answering_and_is_idempotent(env: Env) -> None:
    path = await env.manager.create_vm("sb1", ANNOTATIONS, "/var/run/netns/x")
    assert path == str(env.root / "pods" / "sb1" / "agent.ttrpc")
    record = await env.store.get("sb1")
    assert record is not None and record.state is SandboxState.CREATED
    assert (record.pod_namespace, record.pod_name) == ("default", "pod-a")
    assert await env.manager.create_vm("sb1", ANNOTATIONS) == path
    assert len(await env.store.records()) == 1


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("io.kubernetes.cri.sandbox-name", ""),
        ("io.kubernetes.cri.sandbox-namespace", "Bad_NS"),
        ("io.katacontainers.config.hypervisor.default_vcpus", "four"),
        ("io.katacontainers.config.hypervisor.default_memory", "-1"),
        ("io.katacontainers.config.hypervisor.default_gpu_model", "v1:bogus=1"),
        ("io.katacontainers.config.hypervisor.machine_type", "g5 xlarge"),
    ],
)
async def test_create_rejects_bad_annotations_naming_them(env: Env, key: str, value: str) -> None:
    with pytest.raises(AnnotationError) as info:
        await env.manager.create_vm("sb1", {**ANNOTATIONS, key: value})
    assert info.value.key == key
    assert await env.store.records() == []


@pytest.mark.parametrize("sandbox_id", ["", "..", "a/b", ".hidden", "x" * 129, "a\x00b"])
async def test_create_rejects_unsafe_ids(env: Env, sandbox_id: str) -> None:
    with pytest.raises(InvalidRequest, match="sandbox id"):
        await env.manager.create_vm(sandbox_id, ANNOTATIONS)
    assert await env.store.records() == []


async def test_start_and_stop(env: Env) -> None:
    await env.manager.create_vm("sb1", ANNOTATIONS)
    await env.manager.start_vm("sb1")
    (proxy,) = env.proxies.made
    assert proxy.calls == ["connect", "start"]
    assert (proxy.host, proxy.port) == ("10.0.0.7", 15150)
    assert [c.instance_type for c in env.provider.specs[0].candidates] == ["g5.xlarge"]
    assert env.provider.specs[0].gpus == 1
    record = await env.store.get("sb1")
    assert record is not None and record.state is SandboxState.RUNNING
    assert record.instance is not None and record.instance.id == "vm-sb1"
    assert Path(record.agent_socket).parent.is_dir()
    await env.manager.start_vm("sb1")  # repeated: nothing new
    assert len(env.proxies.made) == 1

    await env.manager.stop_vm("sb1")
    assert proxy.calls[-1] == "stop"
    assert env.provider.vms == {}
    assert await env.store.get("sb1") is None
    assert not (env.root / "pods" / "sb1").exists()
    with pytest.raises(SandboxNotFound):
        await env.manager.stop_vm("sb1")
    with pytest.raises(SandboxNotFound):
        await env.manager.start_vm("nope")


async def test_forwarder_unreachable_deletes_the_vm(env: Env) -> None:
    env.proxies.connect_error = TtrpcError(Code.UNAVAILABLE, "pod VM unreachable")
    await env.manager.create_vm("sb1", ANNOTATIONS)
    with pytest.raises(TtrpcError):
        await env.manager.start_vm("sb1")
    assert env.provider.deleted == ["vm-sb1"] and env.provider.vms == {}
    assert env.proxies.made[0].calls == ["connect", "stop"]
    record = await env.store.get("sb1")
    assert record is not None and record.state is SandboxState.FAILED
    assert record.instance is None and "unreachable" in record.reason
    # a failed start may be retried, and the sandbox can always be stopped
    env.proxies.connect_error = None
    await env.manager.start_vm("sb1")
    await env.manager.stop_vm("sb1")


async def test_cancelled_start_still_deletes_the_vm(env: Env) -> None:
    env.proxies.connect_gate = asyncio.Event()
    await env.manager.create_vm("sb1", ANNOTATIONS)
    start = asyncio.create_task(env.manager.start_vm("sb1"))
    await env.proxies.wait_made(1)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert env.provider.vms == {}
    record = await env.store.get("sb1")
    assert record is not None and record.state is SandboxState.FAILED


async def test_failed_delete_is_recorded_and_retried_until_the_cloud_confirms(env: Env) -> None:
    await env.manager.create_vm("sb1", ANNOTATIONS)
    await env.manager.start_vm("sb1")
    env.provider.fail_delete = True
    with pytest.raises(ProviderError, match="cloud said no"):
        await env.manager.stop_vm("sb1")
    record = await env.store.get("sb1")
    assert record is not None and record.state is SandboxState.STOPPING
    assert record.instance is not None and "cloud said no" in record.reason
    with pytest.raises(SandboxBusy):
        await env.manager.start_vm("sb1")
    env.provider.fail_delete = False
    await env.manager.stop_vm("sb1")  # joins the teardown still retrying
    assert await env.store.get("sb1") is None and env.provider.vms == {}


async def test_stop_cancels_a_start_in_flight_and_others_run_on(env: Env) -> None:
    gate = asyncio.Event()
    env.proxies.connect_gate = gate
    for sid in ("a", "b"):
        await env.manager.create_vm(sid, ANNOTATIONS)
    start_a = asyncio.create_task(env.manager.start_vm("a"))
    start_b = asyncio.create_task(env.manager.start_vm("b"))
    await env.proxies.wait_made(2)  # both starts reached the forwarder wait together
    await env.manager.stop_vm("a")  # never waits behind a's start
    with pytest.raises(StartAborted):
        await start_a
    assert await env.store.get("a") is None
    assert "vm-a" in env.provider.deleted and "vm-a" not in env.provider.vms
    assert not start_b.done()
    gate.set()
    await start_b
    b = await env.store.get("b")
    assert b is not None and b.state is SandboxState.RUNNING


async def test_recover_serves_running_and_fails_interrupted(env: Env) -> None:
    for sid in ("run", "mid"):
        await env.manager.create_vm(sid, ANNOTATIONS)
    await env.manager.start_vm("run")
    mid = await env.store.get("mid")
    assert mid is not None
    await env.store.put(mid.evolve(state=SandboxState.STARTING))
    await env.manager.close(0)

    env.manager = env.make_manager()
    await env.manager.recover()
    assert env.manager.serving("run")
    proxy = env.proxies.made[-1]
    await asyncio.sleep(0.01)
    assert proxy.calls[:2] == ["start", "connect"]
    failed = await env.store.get("mid")
    assert failed is not None and failed.state is SandboxState.FAILED
    await env.manager.stop_vm("run")
    assert env.provider.vms == {}
    await env.manager.stop_vm("mid")


async def test_create_failure_is_recorded(env: Env) -> None:
    env.provider.fail_create = ProviderError("quota")
    await env.manager.create_vm("sb1", ANNOTATIONS)
    with pytest.raises(ProviderError):
        await env.manager.start_vm("sb1")
    record = await env.store.get("sb1")
    assert record is not None and record.state is SandboxState.FAILED and "quota" in record.reason


async def test_startvm_enforces_its_own_limit(env: Env) -> None:
    env.proxies.connect_gate = asyncio.Event()  # the forwarder never answers
    env.manager = SandboxManager(
        SandboxTable(
            ManagerConfig(
                pods_dir=env.root / "pods", proxy_timeout_seconds=60, start_timeout_seconds=0.2
            ),
            env.store,
            env.provider,
            Placement(),
            env.proxies,
        )
    )
    await env.manager.create_vm("sb1", ANNOTATIONS)
    with pytest.raises(StartTimeout, match=r"within 0\.2s"):
        await env.manager.start_vm("sb1")
    record = await env.store.get("sb1")
    assert record is not None and record.state is SandboxState.FAILED and record.instance is None
    assert env.provider.vms == {} and env.provider.deleted == ["vm-sb1"]


async def test_the_reaper_deletes_what_interrupted_sandboxes_left(env: Env) -> None:
    from adaptor.hypervisor.reaper import Reaper
    from adaptor.runtime import metrics
    from providers.core.base import TAG_OWNER, TAG_SANDBOX, Instance

    # "failed": a StartVM cut short after its VM was recorded; "lost": one cut short before
    # (the VM carries the sandbox's tag only); "stopping": a StopVM the daemon never finished;
    # "running": left alone whatever its age
    for sid in ("failed", "lost", "stopping", "running"):
        await env.manager.create_vm(sid, ANNOTATIONS)
    for sid in ("failed", "stopping", "running"):
        await env.manager.start_vm(sid)
    tags = {TAG_OWNER: env.provider.owner_id, TAG_SANDBOX: "lost"}
    env.provider.vms["vm-lost"] = Instance("vm-lost", "lost", ("10.0.0.8",), "g5.xlarge", tags=tags)
    states = {"failed": SandboxState.FAILED, "lost": SandboxState.FAILED}
    states["stopping"] = SandboxState.STOPPING
    for sid, state in states.items():
        record = await env.store.get(sid)
        assert record is not None
        await env.store.put(record.evolve(state=state, reason="daemon restarted during StartVM"))
    before = metrics.REAPED_VMS.labels(provider="fake")._value.get()

    within_grace = await Reaper(env.manager, grace_seconds=3600).sweep()
    assert within_grace.deleted == {} and len(env.provider.vms) == 4

    result = await Reaper(env.manager, grace_seconds=0).sweep()
    assert result.deleted == {"failed": 1, "lost": 1, "stopping": 1}, result
    assert sorted(env.provider.vms) == ["vm-running"]
    assert metrics.REAPED_VMS.labels(provider="fake")._value.get() == before + 3
    for sid in ("failed", "lost"):
        record = await env.store.get(sid)
        assert record is not None and record.state is SandboxState.FAILED
        assert record.instance is None and "reaper" in record.reason
    assert await env.store.get("stopping") is None
    # a failed sandbox's StopVM may still come
    await env.manager.stop_vm("failed")
    await env.manager.stop_vm("running")
