"""Warm pools on AWS (moto) behind the latency-modelled cloud: the keeper fills each pool with
VMs that booted, powered off and stopped, tagged as the pool's and never as a sandbox's; an
adoption rewrites the VM's user data, moves it to the sandbox's tags and starts it, and the
pool refills; orphans, drained types and interrupted adoptions are cleaned; caps hold."""

from __future__ import annotations

import asyncio
import base64
import random
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from adaptor.hypervisor.gc import GarbageCollector
from adaptor.state import StateStore
from adaptor.warmpool import Pool, PoolRecord, SlotState, Sources, WarmConfig, WarmPool
from providers.clouds.aws import AwsConfig, AwsProvider
from providers.clouds.retry import RetryPolicy
from providers.core.base import TAG_OWNER, TAG_SANDBOX, VMCandidate, VMSpec
from providers.core.capacity import CapacityType
from providers.core.warm import TAG_WARM_POOL, TAG_WARM_SLOT, WarmSpec
from tests.clouds.conftest import loopback
from tests.clouds.latency import LatencyCloud, LatencyModel
from tests.clouds.warm_userdata import warm_request

OWNER = "warm-owner"
IMAGE = "ami-0a1b2c3d4e5f60718"
ZONE = "us-east-1a"
TYPE = "m5.large"
WARM_IMAGES = ("nvcr.io/nvidia/pytorch:25.01-py3", "busybox")
MODEL = LatencyModel(scale=0.001)  # cold 0.15 s, warm 0.025 s


def aws(ec2: Any, owner: str = OWNER, **settings: Any) -> AwsProvider:
    config = AwsConfig(
        **settings,
        region="us-east-1",
        image_id=IMAGE,
        zones=(ZONE,),
        poll_interval_seconds=0.005,
        ready_timeout_seconds=20,
        policy=RetryPolicy(rng=random.Random(1), base_delay_seconds=0.001),
    )
    return AwsProvider(config, owner, client=ec2, resolve=loopback)


@pytest.fixture
async def store() -> AsyncIterator[StateStore]:
    with tempfile.TemporaryDirectory() as directory:
        opened = await StateStore.open(Path(directory))
        yield opened
        await opened.close()


def pool_of(
    cloud: Any,
    store: StateStore,
    *pools: Pool,
    image: str = IMAGE,
    sources: Sources | None = None,
    **config: Any,
) -> WarmPool:
    settings: dict[str, Any] = {"interval_seconds": 0.05, "ready_timeout_seconds": 10}
    settings.update(config)
    return WarmPool(
        cloud,
        PoolRecord(store),
        WarmConfig(pools=pools or (Pool(TYPE, 2, ZONE),), **settings),
        default_image=image,
        zones=(ZONE,),
        sources=sources,
    )


def spec(sandbox: str, instance_type: str = TYPE, **kw: Any) -> VMSpec:
    return VMSpec(
        sandbox_id=sandbox,
        pod_namespace="default",
        pod_name=f"pod-{sandbox}",
        candidates=(VMCandidate(instance_type),),
        user_data=f"#cloud-config\n# pod {sandbox}\n",
        **kw,
    )


def instances(ec2: Any, *states: str) -> list[dict[str, Any]]:
    wanted = list(states or ("pending", "running", "stopping", "stopped"))
    out = ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": wanted}])
    return [i for r in out["Reservations"] for i in r["Instances"]]


def tags(raw: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}


async def until(check: Callable[[], Awaitable[bool] | bool], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while True:
        outcome = check()
        if not isinstance(outcome, bool):
            outcome = await outcome
        if outcome:
            return
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def warm_count(pool: WarmPool) -> int:
    return sum(s.state is SlotState.WARM for s in pool.slots.values())


async def test_refill_launches_tagged_vms_that_stop_once_ready(ec2: Any, store: StateStore) -> None:
    cloud = LatencyCloud(aws(ec2), MODEL)
    pool = pool_of(cloud, store, images=WARM_IMAGES)
    pool.start()
    try:
        await until(lambda: warm_count(pool) == 2)
    finally:
        await pool.stop()
        await cloud.close()
    vms = instances(ec2)
    assert len(vms) == 2
    for raw in vms:
        assert raw["State"]["Name"] == "stopped"
        assert raw["InstanceType"] == TYPE
        assert raw["Placement"]["AvailabilityZone"] == ZONE
        found = tags(raw)
        assert found[TAG_WARM_POOL] == OWNER and found[TAG_OWNER] == OWNER
        assert found[TAG_WARM_SLOT] in pool.slots
        assert TAG_SANDBOX not in found  # never a sandbox's: the GC and reaper leave it
    # the warm VM's own user data: its apf.json asks the pod VM to pull the pool's images
    attribute = ec2.describe_instance_attribute(
        InstanceId=vms[0]["InstanceId"], Attribute="userData"
    )
    user_data = base64.b64decode(attribute["UserData"]["Value"]).decode()
    assert warm_request(user_data).images == WARM_IMAGES
    assert set(await PoolRecord(store).members()) == set(pool.slots)
    # the sandbox orphan collector keeps them
    gc = GarbageCollector(aws(ec2), OWNER, lambda: _none())
    assert (await gc.sweep()).deleted == []


async def _none() -> list[str]:
    return []


async def test_adoption_rewrites_user_data_retags_starts_and_refills(
    ec2: Any, store: StateStore
) -> None:
    cloud = LatencyCloud(aws(ec2), MODEL)
    pool = pool_of(cloud, store)
    pool.start()
    try:
        await until(lambda: warm_count(pool) == 2)
        warm_ids = {s.instance_id for s in pool.slots.values()}
        instance = await pool.adopt(spec("sb-1"))
        assert instance is not None and instance.id in warm_ids
        raw = next(i for i in instances(ec2) if i["InstanceId"] == instance.id)
        assert raw["State"]["Name"] == "running"
        found = tags(raw)
        assert found[TAG_SANDBOX] == "sb-1" and found[TAG_OWNER] == OWNER
        assert TAG_WARM_POOL not in found and TAG_WARM_SLOT not in found
        attribute = ec2.describe_instance_attribute(InstanceId=instance.id, Attribute="userData")
        assert base64.b64decode(attribute["UserData"]["Value"]).decode() == spec("sb-1").user_data
        # out of the pool at once, in memory and in the record
        assert instance.id not in {s.instance_id for s in pool.slots.values()}
        assert await PoolRecord(store).claims() == {}
        # refilled to its size within one launch time (plus boot and pull: the warm-up)
        started = time.monotonic()
        await until(lambda: warm_count(pool) == 2)
        refill = time.monotonic() - started
        assert cloud.warm_launches == 3
    finally:
        await pool.stop()
        await cloud.close()
    assert refill > 0
    assert len(instances(ec2)) == 3


async def test_a_drained_warm_vm_leaves_no_root_volume(ec2: Any, store: StateStore) -> None:
    """A resized root volume (--aws-root-volume-gib) goes with a pool VM as with a sandbox's:
    EC2 keeps a volume whose mapping says otherwise, billing after its VM is gone."""
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]  # names its root
    cloud = LatencyCloud(aws(ec2, root_volume_gib=200), MODEL)
    pool = pool_of(cloud, store, image=image)
    pool.start()
    try:
        await until(lambda: warm_count(pool) == 2)
        for raw in instances(ec2):
            (mapping,) = raw["BlockDeviceMappings"]
            assert mapping["Ebs"]["DeleteOnTermination"] is True
        assert len(ec2.describe_volumes()["Volumes"]) == 2
        await pool.drain()
    finally:
        await pool.stop()
        await cloud.close()
    assert ec2.describe_volumes()["Volumes"] == []


async def test_the_adoption_sends_user_data_ec2_decodes_once(ec2: Any, store: StateStore) -> None:
    """What goes on the wire, not what moto makes of it: EC2 base64-decodes a
    ModifyInstanceAttribute user data value once (the user guide's `--attribute userData --value
    BASE64` form). Through the SDK's `UserData` blob, base64 text would arrive encoded twice and
    the VM would boot with the base64 text as its user data."""
    from urllib.parse import parse_qs

    bodies: list[dict[str, list[str]]] = []

    def capture(request: Any, **_: Any) -> None:
        body = request.body
        bodies.append(parse_qs(body.decode() if isinstance(body, bytes) else body))

    ec2.meta.events.register("before-send.ec2.ModifyInstanceAttribute", capture)
    pool = pool_of(LatencyCloud(aws(ec2), MODEL), store)
    pool.start()
    try:
        await until(lambda: warm_count(pool) == 2)
        assert await pool.adopt(spec("sb-wire")) is not None
    finally:
        await pool.stop()
    (form,) = bodies
    assert form["Attribute"] == ["userData"] and "UserData.Value" not in form
    assert base64.b64decode(form["Value"][0], validate=True).decode() == spec("sb-wire").user_data


async def test_misses_spot_other_types_images_and_an_empty_pool(
    ec2: Any, store: StateStore
) -> None:
    cloud = LatencyCloud(aws(ec2), MODEL)
    pool = pool_of(cloud, store, Pool(TYPE, 1, ZONE))
    pool.start()
    try:
        await until(lambda: warm_count(pool) == 1)
        assert await pool.adopt(spec("s", capacity_type=CapacityType.SPOT)) is None
        assert await pool.adopt(spec("s", capacity_type=CapacityType.SPOT_OR_ON_DEMAND)) is None
        assert await pool.adopt(spec("t", instance_type="m5.xlarge")) is None
        assert await pool.adopt(spec("i", image="ami-0ffffffffffffffff")) is None
        assert warm_count(pool) == 1 and cloud.adoptions == 0
        assert await pool.adopt(spec("first")) is not None
        assert await pool.adopt(spec("second")) is None  # empty until refilled
    finally:
        await pool.stop()
        await cloud.close()


async def test_no_slot_is_adopted_twice_by_concurrent_starts(ec2: Any, store: StateStore) -> None:
    cloud = LatencyCloud(aws(ec2), MODEL)
    pool = pool_of(cloud, store, Pool(TYPE, 2, ZONE))
    pool.start()
    try:
        await until(lambda: warm_count(pool) == 2)
        await pool.stop()  # no refill: exactly two to hand out
        got = await asyncio.gather(*(pool.adopt(spec(f"c-{n}")) for n in range(6)))
    finally:
        await cloud.close()
    adopted = [i.id for i in got if i is not None]
    assert len(adopted) == 2 and len(set(adopted)) == 2
    sandboxes = sorted(tags(i)[TAG_SANDBOX] for i in instances(ec2) if TAG_SANDBOX in tags(i))
    assert len(sandboxes) == 2


async def test_failed_adoption_deletes_the_vm_and_falls_back(ec2: Any, store: StateStore) -> None:
    cloud = LatencyCloud(aws(ec2), MODEL)
    pool = pool_of(cloud, store, Pool(TYPE, 1, ZONE))
    pool.start()
    try:
        await until(lambda: warm_count(pool) == 1)
        await pool.stop()
        (slot,) = pool.slots.values()
        too_big = spec("big").__class__(**{**spec("big").__dict__, "user_data": "x" * 20000})
        assert await pool.adopt(too_big) is None  # over EC2's 16 KiB: refused, VM deleted
    finally:
        await cloud.close()
    gone = [i for i in instances(ec2, "shutting-down", "terminated")]
    assert [i["InstanceId"] for i in gone] == [slot.instance_id]
    assert pool.slots == {} and await PoolRecord(store).members() == {}


async def test_orphans_drained_types_and_interrupted_adoptions_are_cleaned(
    ec2: Any, store: StateStore
) -> None:
    provider = aws(ec2)
    record = PoolRecord(store)
    # an orphan: a pool VM of this owner whose slot is not recorded
    orphan = await provider.launch_warm(WarmSpec("wp-orphan", TYPE, ZONE))
    # another owner's pool VM: never touched
    theirs = await aws(ec2, "someone-else").launch_warm(WarmSpec("wp-theirs", TYPE, ZONE))
    # an interrupted adoption: recorded, claimed, still the pool's
    claimed = await provider.launch_warm(WarmSpec("wp-claimed", TYPE, ZONE))
    await record.add("wp-claimed", _member(TYPE))
    assert await record.claim("wp-claimed", "sb-crashed")
    assert not await record.claim("wp-claimed", "sb-other")  # taken: never twice
    # a slot of a type no longer configured
    drained = await provider.launch_warm(WarmSpec("wp-old", "m5.xlarge", ZONE))
    await record.add("wp-old", _member("m5.xlarge"))
    cloud = LatencyCloud(provider, MODEL)
    pool = pool_of(cloud, store, Pool(TYPE, 1, ZONE))
    try:
        await pool.keep()
        deleted = {i["InstanceId"] for i in instances(ec2, "shutting-down", "terminated")}
        assert deleted == {orphan.id, claimed.id, drained.id}
        assert theirs.id not in deleted
        assert await record.claims() == {}
        assert set(await record.members()) == set(pool.slots)  # only the refill's new slot
        assert [s.pool.instance_type for s in pool.slots.values()] == [TYPE]
    finally:
        await pool.stop()
        await cloud.close()


def _member(instance_type: str) -> Any:
    from adaptor.warmpool import Member

    return Member(instance_type, ZONE, IMAGE)


async def test_a_restart_keeps_the_pool(ec2: Any, store: StateStore) -> None:
    cloud = LatencyCloud(aws(ec2), MODEL)
    first = pool_of(cloud, store)
    first.start()
    try:
        await until(lambda: warm_count(first) == 2)
    finally:
        await first.stop()
    kept = {s.instance_id for s in first.slots.values()}
    second = pool_of(cloud, store)
    try:
        await second.keep()
        assert {s.instance_id for s in second.slots.values()} == kept
        assert warm_count(second) == 2 and cloud.warm_launches == 2
    finally:
        await second.stop()
        await cloud.close()


async def test_caps_hold_the_refill(ec2: Any, store: StateStore) -> None:
    cloud = LatencyCloud(aws(ec2), MODEL)
    by_count = pool_of(cloud, store, Pool(TYPE, 5, ZONE), max_vms=3)
    try:
        await by_count.keep()
        assert len(by_count.slots) == 3
        assert "--warm-pool-max-vms" in by_count.refused[f"{TYPE}@{ZONE}"]
    finally:
        await by_count.stop()
    per_vm = aws(ec2).stopped_cost_per_hour(TYPE)
    assert per_vm == pytest.approx(100 * 0.08 / 730)
    with tempfile.TemporaryDirectory() as directory:
        other = await StateStore.open(Path(directory))
        by_cost = pool_of(cloud, other, Pool(TYPE, 5, ZONE), max_cost_per_hour=per_vm * 2.5)
        try:
            await by_cost.keep()
            assert len(by_cost.slots) == 2
            assert by_cost.cost_per_hour() <= per_vm * 2.5
            assert "--warm-pool-max-cost-per-hour" in by_cost.refused[f"{TYPE}@{ZONE}"]
        finally:
            await by_cost.stop()
            await other.close()
    await cloud.close()


async def test_a_type_leaving_the_allow_list_drains_its_pool(ec2: Any, store: StateStore) -> None:
    cloud = LatencyCloud(aws(ec2), MODEL)
    allowed = {TYPE}
    pool = pool_of(
        cloud, store, Pool(TYPE, 1, ZONE), sources=Sources(allowed=lambda name: name in allowed)
    )
    pool.start()
    try:
        await until(lambda: warm_count(pool) == 1)
        allowed.clear()
        await until(lambda: f"{TYPE}@{ZONE}" in pool.refused)
        assert "not in the allowed" in pool.refused[f"{TYPE}@{ZONE}"]
        assert not pool.slots
    finally:
        await pool.stop()
        await cloud.close()
    assert instances(ec2, "pending", "running", "stopped") == []


async def test_drain_deletes_every_pool_vm(ec2: Any, store: StateStore) -> None:
    cloud = LatencyCloud(aws(ec2), MODEL)
    pool = pool_of(cloud, store)
    pool.start()
    try:
        await until(lambda: len(pool.slots) == 2)  # some may still be warming
        await pool.drain()
    finally:
        await cloud.close()
    assert instances(ec2, "pending", "running", "stopped") == []
    assert await PoolRecord(store).members() == {}


class Quota:
    """An AccountQuotaCache's stand-in: the account's quotas as last read."""

    def __init__(self, value: Any) -> None:
        self.value = value

    async def get(self) -> Any:
        return self.value


async def test_a_refill_counts_against_the_account_quota(ec2: Any, store: StateStore) -> None:
    from providers.core.account_quota import AccountLimit, AccountQuota
    from providers.core.snapshots import load_catalog

    catalog = load_catalog("aws", "us-east-1")
    vcpus = catalog.by_name()[TYPE].vcpus  # m5.large: 2
    # the account's standard-class quota has room for two more VMs of the type, no more
    limit = AccountLimit("L-1216C47A Standard", "vcpus", "class", ("m",), 10, 10 - 2 * vcpus)
    quota = Quota(AccountQuota("aws", "us-east-1", (limit,)))
    cloud = LatencyCloud(aws(ec2), MODEL)
    pool = pool_of(
        cloud,
        store,
        Pool(TYPE, 4, ZONE),
        sources=Sources(catalog=lambda: catalog, account_quota=lambda: quota),  # type: ignore[arg-type,return-value]
    )
    try:
        await pool.keep()
        assert len(pool.slots) == 2  # the launching ones count as pending usage
        assert "L-1216C47A Standard" in pool.refused[f"{TYPE}@{ZONE}"]
    finally:
        await pool.stop()
        await cloud.close()


async def test_a_type_leaving_the_catalog_drains_its_pool(ec2: Any, store: StateStore) -> None:
    from providers.core.snapshots import load_catalog

    full = load_catalog("aws", "us-east-1")
    fields = {name: getattr(full, name) for name in type(full).model_fields}
    fields["types"] = tuple(t for t in full.types if t.name != TYPE)
    without = type(full).model_construct(**fields)
    current = [full]
    cloud = LatencyCloud(aws(ec2), MODEL)
    pool = pool_of(cloud, store, Pool(TYPE, 1, ZONE), sources=Sources(catalog=lambda: current[0]))
    pool.start()
    try:
        await until(lambda: warm_count(pool) == 1)
        current[0] = without
        await until(lambda: f"{TYPE}@{ZONE}" in pool.refused)
        assert "is not in the aws us-east-1 catalog" in pool.refused[f"{TYPE}@{ZONE}"]
        assert not pool.slots
    finally:
        await pool.stop()
        await cloud.close()
    assert instances(ec2, "pending", "running", "stopped") == []
