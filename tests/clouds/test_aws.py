"""AWS pod VM lifecycle against moto's EC2: tags, user data, fallback, retries, no leaks."""

from __future__ import annotations

import asyncio
import base64
import random
from typing import Any

import pytest

from adaptor.hypervisor.gc import GarbageCollector
from providers.clouds.aws import AwsConfig, AwsProvider, client_token
from providers.clouds.retry import FallbackExhausted, RetryPolicy, Site
from providers.core.base import (
    TAG_OWNER,
    TAG_POD_NAME,
    TAG_POD_NAMESPACE,
    TAG_SANDBOX,
    VMCandidate,
    VMSpec,
)
from providers.core.errors import CapacityError, InvalidRequest, ProviderError
from tests.clouds.aws_faults import Faults, by_instance_id
from tests.clouds.conftest import FORWARDER, Sleeps, loopback
from tests.clouds.scenarios import vm_spec

ZONES = ("us-east-1a", "us-east-1b")
OWNER = "owner-node-a"


def image(ec2: Any) -> str:
    """A pod VM image id (moto launches any; listing its images would cost seconds)."""
    return "ami-0a1b2c3d4e5f60718"


def provider(ec2: Any, policy: RetryPolicy, owner: str = OWNER, **config: Any) -> AwsProvider:
    settings: dict[str, Any] = {
        "region": "us-east-1",
        "image_id": image(ec2),
        "zones": ZONES,
        "poll_interval_seconds": 0.001,
        "policy": policy,
    }
    settings.update(config)
    return AwsProvider(AwsConfig(**settings), owner, client=ec2, resolve=loopback)


def spec(n: int = 1, **kw: Any) -> VMSpec:
    return vm_spec(n, **{"candidates": ("p5.48xlarge", "p4d.24xlarge"), **kw})


def live(ec2: Any) -> list[dict[str, Any]]:
    out = ec2.describe_instances(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running", "stopped"]}]
    )
    return [i for r in out["Reservations"] for i in r["Instances"]]


async def test_create_and_delete_real_shaped_instance(ec2: Any, policy: RetryPolicy) -> None:
    aws = provider(ec2, policy)
    vm = await aws.create(spec(1))
    assert vm.addresses == (FORWARDER[0],) and vm.port == FORWARDER[1]
    assert vm.extra["cloud_address"].startswith("10.")
    assert vm.instance_type == "p5.48xlarge" and vm.zone == "us-east-1a"
    [raw] = live(ec2)
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags[TAG_OWNER] == OWNER
    assert tags[TAG_SANDBOX] == f"{1:064x}"
    assert tags[TAG_POD_NAMESPACE] == "ml" and tags[TAG_POD_NAME] == "train-1"
    attr = ec2.describe_instance_attribute(InstanceId=vm.id, Attribute="userData")
    assert base64.b64decode(attr["UserData"]["Value"]).decode() == spec(1).user_data
    assert [i.id for i in await aws.list_owned()] == [vm.id]

    await aws.delete(vm.id)
    assert live(ec2) == []
    assert await aws.list_owned() == []
    await aws.delete(vm.id)  # already gone: not an error
    await aws.delete("i-0123456789abcdef0")


async def test_retried_create_finds_the_same_instance(ec2: Any, policy: RetryPolicy) -> None:
    aws = provider(ec2, policy)
    first = await aws.create(spec(2))
    again = await aws.create(spec(2))
    assert again.id == first.id
    assert len(live(ec2)) == 1
    token = client_token(f"{2:064x}", Site(VMCandidate("p5.48xlarge"), "us-east-1a"))
    assert len(token) <= 64 and token == client_token(
        f"{2:064x}", Site(VMCandidate("p5.48xlarge"), "us-east-1a")
    )
    assert token != client_token(f"{2:064x}", Site(VMCandidate("p5.48xlarge"), "us-east-1b"))


async def test_capacity_in_first_zone_moves_to_next_zone(ec2: Any, policy: RetryPolicy) -> None:
    aws = provider(ec2, policy)
    faults = Faults(
        [
            lambda a, p: (
                "InsufficientInstanceCapacity"
                if a == "RunInstances" and p.get("Placement.AvailabilityZone") == "us-east-1a"
                else None
            )
        ]
    )
    faults.install(ec2)
    vm = await aws.create(spec(3))
    assert (vm.instance_type, vm.zone) == ("p5.48xlarge", "us-east-1b")
    assert faults.launches() == [("p5.48xlarge", "us-east-1a"), ("p5.48xlarge", "us-east-1b")]


async def test_capacity_for_first_type_moves_to_next_type(ec2: Any, policy: RetryPolicy) -> None:
    aws = provider(ec2, policy)
    faults = Faults(
        [
            lambda a, p: (
                "InsufficientInstanceCapacity"
                if a == "RunInstances" and p.get("InstanceType") == "p5.48xlarge"
                else None
            ),
        ]
    )
    faults.install(ec2)
    vm = await aws.create(spec(4))
    assert (vm.instance_type, vm.zone) == ("p4d.24xlarge", "us-east-1a")
    assert faults.launches() == [
        ("p5.48xlarge", "us-east-1a"),
        ("p5.48xlarge", "us-east-1b"),
        ("p4d.24xlarge", "us-east-1a"),
    ]
    assert len(live(ec2)) == 1


async def test_no_capacity_anywhere_lists_what_was_tried(ec2: Any, policy: RetryPolicy) -> None:
    aws = provider(ec2, policy)
    faults = Faults(
        [
            lambda a, p: (
                ("Unsupported" if p.get("InstanceType") == "p4d.24xlarge" else None)
                if a == "RunInstances"
                else None
            ),
            lambda a, p: "InsufficientInstanceCapacity" if a == "RunInstances" else None,
        ]
    )
    faults.install(ec2)
    with pytest.raises(FallbackExhausted) as info:
        await aws.create(spec(5))
    message = str(info.value)
    assert "4 attempt(s)" in message
    for placement in ("p5.48xlarge in us-east-1a", "p4d.24xlarge in us-east-1b"):
        assert placement in message
    assert "Unsupported" in message and "InsufficientInstanceCapacity" in message
    assert isinstance(info.value, CapacityError)
    assert live(ec2) == []


async def test_failure_after_launch_terminates_the_instance(ec2: Any, policy: RetryPolicy) -> None:
    aws = provider(ec2, policy)
    faults = Faults([lambda a, p: "UnauthorizedOperation" if by_instance_id(a, p) else None])
    faults.install(ec2)
    with pytest.raises(ProviderError, match="UnauthorizedOperation"):
        await aws.create(spec(6))
    assert [a for a, _ in faults.calls].count("RunInstances") == 1
    assert "TerminateInstances" in [a for a, _ in faults.calls]
    assert live(ec2) == []


async def test_not_ready_in_time_terminates_the_instance(ec2: Any, policy: RetryPolicy) -> None:
    aws = provider(ec2, policy, ready_timeout_seconds=0.0)
    faults = Faults([lambda a, p: "InternalError" if by_instance_id(a, p) else None])
    faults.install(ec2)
    with pytest.raises(ProviderError, match="not running after"):
        await aws.create(spec(7))
    assert live(ec2) == []


async def test_cancelled_create_terminates_the_instance(ec2: Any, policy: RetryPolicy) -> None:
    aws = provider(ec2, policy, poll_interval_seconds=0.05)
    launched = asyncio.Event()
    faults = Faults(
        [
            lambda a, p: (
                (launched.set() or "InternalError")  # type: ignore[func-returns-value]
                if by_instance_id(a, p)
                else None
            )
        ]
    )
    faults.install(ec2)
    task = asyncio.create_task(aws.create(spec(8)))
    await asyncio.wait_for(launched.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert live(ec2) == []


async def test_throttling_is_retried_with_backoff(
    ec2: Any, policy: RetryPolicy, sleeps: Sleeps
) -> None:
    aws = provider(ec2, policy)
    budget = iter(range(2))
    faults = Faults(
        [
            lambda a, p: (
                "RequestLimitExceeded"
                if a == "RunInstances" and next(budget, None) is not None
                else None
            )
        ]
    )
    faults.install(ec2)
    vm = await aws.create(spec(9))
    assert (vm.instance_type, vm.zone) == ("p5.48xlarge", "us-east-1a")
    assert faults.launches() == [("p5.48xlarge", "us-east-1a")] * 3
    # the same placement retried under the same idempotency token
    tokens = {p["ClientToken"] for a, p in faults.calls if a == "RunInstances"}
    assert len(tokens) == 1
    assert len(sleeps.delays) == 2
    assert 0 <= sleeps.delays[0] <= policy.base_delay_seconds
    assert 0 <= sleeps.delays[1] <= policy.base_delay_seconds * 2


async def test_endless_throttling_gives_up_with_a_clear_error(
    ec2: Any, policy: RetryPolicy, sleeps: Sleeps
) -> None:
    aws = provider(ec2, policy, zones=("us-east-1a",))
    faults = Faults([lambda a, p: "RequestLimitExceeded" if a == "RunInstances" else None])
    faults.install(ec2)
    with pytest.raises(FallbackExhausted, match=r"RequestLimitExceeded.*gave up after 5 tries"):
        await aws.create(spec(10, candidates=("p5.48xlarge",)))
    assert len(faults.launches()) == policy.transient_retries + 1
    assert len(sleeps.delays) == policy.transient_retries
    assert live(ec2) == []


async def test_permanent_error_stops_at_once(ec2: Any, policy: RetryPolicy) -> None:
    aws = provider(ec2, policy)
    faults = Faults([lambda a, p: "InvalidAMIID.NotFound" if a == "RunInstances" else None])
    faults.install(ec2)
    with pytest.raises(ProviderError, match=r"InvalidAMIID\.NotFound"):
        await aws.create(spec(11))
    assert len(faults.launches()) == 1


async def test_bad_input_is_refused_and_creates_nothing(ec2: Any, policy: RetryPolicy) -> None:
    aws = provider(ec2, policy)
    with pytest.raises(InvalidRequest, match="candidate list is empty"):
        await aws.create(spec(12, candidates=()))
    with pytest.raises(InvalidRequest, match="16384"):
        await aws.create(spec(12, candidates=("g5.xlarge",), user_data="x" * (16 * 1024 + 1)))
    no_image = provider(ec2, policy, image_id="")
    with pytest.raises(InvalidRequest, match="image"):
        await no_image.create(spec(12))
    assert live(ec2) == []


async def test_restart_gc_removes_orphans_only(ec2: Any, policy: RetryPolicy) -> None:
    aws = provider(ec2, policy)
    kept = await aws.create(spec(20))
    orphan = await aws.create(spec(21))
    other_owner = await provider(ec2, policy, owner="owner-node-b").create(spec(22))
    untagged = ec2.run_instances(ImageId=image(ec2), MinCount=1, MaxCount=1)["Instances"][0]
    # the adaptor restarts: a new provider object, the store knows only sandbox 20
    restarted = provider(ec2, policy)

    async def known() -> set[str]:
        return {f"{20:064x}"}

    gc = GarbageCollector(restarted, OWNER, known, interval_seconds=3600)
    result = await gc.sweep()
    assert result.deleted == [orphan.id] and result.failed == [] and result.kept == 1
    assert {i["InstanceId"] for i in live(ec2)} == {
        kept.id,
        other_owner.id,
        untagged["InstanceId"],
    }
    # the periodic loop sweeps at once on start and stops cleanly
    gc.start()
    for _ in range(6000):  # the first sweep runs at once; wait for it, however busy the machine
        if gc.sweeps >= 2:
            break
        await asyncio.sleep(0.02)
    await gc.stop()
    assert gc.sweeps >= 2


@pytest.mark.slow
async def test_random_fault_cycles_leave_nothing(ec2: Any, sleeps: Sleeps) -> None:
    rng = random.Random(2024)
    policy = RetryPolicy(rng=random.Random(1), sleep=sleeps, transient_retries=2)
    aws = provider(ec2, policy, zones=ZONES)
    codes = {
        "RunInstances": ["InsufficientInstanceCapacity", "RequestLimitExceeded", "InternalError"],
        "DescribeInstances": ["RequestLimitExceeded", "UnauthorizedOperation"],
        "TerminateInstances": ["RequestLimitExceeded", "InternalError"],
    }

    def chaos(action: str, params: dict[str, str]) -> str | None:
        if action in codes and rng.random() < 0.25:
            return rng.choice(codes[action])
        return None

    Faults([chaos]).install(ec2)
    created = failed_creates = failed_deletes = 0
    recorded_for_retry: list[str] = []
    for n in range(200):
        try:
            vm = await aws.create(spec(1000 + n))
        except ProviderError:
            failed_creates += 1
            continue
        created += 1
        try:
            await aws.delete(vm.id)
        except ProviderError:
            failed_deletes += 1
            recorded_for_retry.append(vm.id)
    assert created > 80 and failed_creates > 10
    # what a failed delete left is retried by the daemon; anything else is the GC's
    for vm_id in recorded_for_retry:
        for _ in range(10):
            try:
                await aws.delete(vm_id)
                break
            except ProviderError:
                continue

    async def known() -> set[str]:
        return set()

    gc = GarbageCollector(aws, OWNER, known)
    for _ in range(20):
        try:
            await gc.sweep()
        except ProviderError:
            continue
        if not live(ec2):
            break
    assert live(ec2) == []


async def test_concurrent_creates_share_their_lookups(ec2: Any, policy: RetryPolicy) -> None:
    aws = provider(ec2, policy)
    faults = Faults()
    faults.install(ec2)
    vms = await asyncio.gather(*(aws.create(spec(40 + n)) for n in range(12)))
    assert len({vm.id for vm in vms}) == 12
    for n, vm in enumerate(vms):
        assert vm.tags[TAG_SANDBOX] == f"{40 + n:064x}"
    actions = [a for a, _ in faults.calls]
    assert actions.count("RunInstances") == 12
    # one look for an existing VM and one state poll each would be 24 calls
    assert actions.count("DescribeInstances") <= 8, actions

    # a restarted adaptor retrying every create adopts each sandbox's own VM, in shared lookups
    restarted = provider(ec2, policy)
    faults.calls.clear()
    again = await asyncio.gather(*(restarted.create(spec(40 + n)) for n in range(12)))
    assert [vm.id for vm in again] == [vm.id for vm in vms]
    actions = [a for a, _ in faults.calls]
    assert "RunInstances" not in actions and actions.count("DescribeInstances") <= 8, actions
    conditions = await asyncio.gather(*(restarted.inspect(vm.id) for vm in vms))
    assert all(c.alive for c in conditions)
    for vm in vms:
        await aws.delete(vm.id)
    assert not (await restarted.inspect(vms[0].id)).alive
    assert not (await restarted.inspect("i-0123456789abcdef0")).alive


async def test_concurrent_deletes_share_their_calls_and_keep_refusals_apart(
    ec2: Any, policy: RetryPolicy
) -> None:
    aws = provider(ec2, policy)
    vms = [await aws.create(spec(60 + n)) for n in range(8)]
    forbidden = vms[3].id
    faults = Faults(
        [
            lambda a, p: (
                "UnauthorizedOperation"
                if a == "TerminateInstances" and forbidden in p.values()
                else None
            )
        ]
    )
    faults.install(ec2)
    unknown = "i-0123456789abcdef0"
    outcomes = await asyncio.gather(
        *(aws.delete(i) for i in [vm.id for vm in vms] + [unknown]), return_exceptions=True
    )
    refused = outcomes.pop(3)
    assert isinstance(refused, ProviderError) and "UnauthorizedOperation" in str(refused)
    assert outcomes == [None] * 8  # the unknown id is already gone: no error
    assert [i["InstanceId"] for i in live(ec2)] == [forbidden]
    # the deletes share one call (refused whole for the forbidden and the unknown id, then sent
    # one each, so each refusal is its own instance's alone)
    shared = [p for a, p in faults.calls if a == "TerminateInstances" and "InstanceId.2" in p]
    assert len(shared) == 1 and {forbidden, vms[4].id} <= set(shared[0].values()), shared


async def test_a_shared_lookup_that_fails_for_a_moment_fails_none_of_its_creates(
    ec2: Any, policy: RetryPolicy, sleeps: Sleeps
) -> None:
    aws = provider(ec2, policy)
    budget = iter(range(1))

    def once_busy(action: str, params: dict[str, str]) -> str | None:
        looks = action == "DescribeInstances" and not by_instance_id(action, params)
        return "InternalError" if looks and next(budget, None) is not None else None

    faults = Faults([once_busy])
    faults.install(ec2)
    vms = await asyncio.gather(*(aws.create(spec(80 + n)) for n in range(6)))
    assert len({vm.id for vm in vms}) == 6
    assert faults.injected == [("DescribeInstances", "InternalError")] and len(sleeps.delays) == 1


def test_an_answer_that_is_not_ec2s_is_transient() -> None:
    from botocore.parsers import ResponseParserError

    from providers.clouds.aws import map_error
    from providers.core.errors import TransientError

    error = map_error(ResponseParserError("invalid XML received"), "list owned instances")
    assert isinstance(error, TransientError) and "list owned instances" in str(error)
