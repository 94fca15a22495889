"""`peerpods warm-pool list` and `drain` against moto's EC2 and the repository's GCE and ARM
fakes: an account holding this owner's warm VMs, one adopted by a sandbox, one a crash left
mid-adoption (both tags), and another owner's pool VM. A drain deletes only this owner's
unadopted pool VMs (of the type and zone asked), a dry run deletes nothing, `list --json`
parses, bad input deletes nothing and says why in one line; and a keeper that still runs
replaces what a drain deleted."""

from __future__ import annotations

import asyncio
import json
import os
import random
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adaptor.cli.main import main
from adaptor.state import StateStore
from adaptor.warmpool import Pool, PoolRecord, SlotState, WarmConfig, WarmPool
from adaptor.warmpool.inventory import drain
from providers.clouds.aws import AwsConfig, AwsProvider
from providers.clouds.azure import AzureConfig, AzureProvider
from providers.clouds.gcp import GcpConfig, GcpProvider
from providers.clouds.retry import RetryPolicy
from providers.core.base import TAG_SANDBOX, VMCandidate, VMSpec
from providers.core.warm import WarmSpec
from tests.clouds.conftest import mocked_aws
from tests.clouds.fake_arm import RG, SUBNET, FakeArm
from tests.clouds.fake_gce import FakeGce, http_error
from tests.clouds.latency import LatencyCloud, LatencyModel
from tests.providers.fakes.azure import SUBSCRIPTION
from tests.providers.fakes.gcp import PROJECT

OWNER = "drain-owner"
OTHER = "another-node"
POLICY = RetryPolicy(rng=random.Random(1), base_delay_seconds=0.001)


@dataclass
class Account:
    """One cloud account through its provider and the CLI's flags for it."""

    name: str
    zone: str
    types: tuple[str, str]
    make: Any  # owner -> provider
    flags: tuple[str, ...]
    mark: Any  # (provider, vm id, sandbox) -> None: the sandbox tag put on, pool tags kept
    fake: Any = None  # the GCE or ARM fake

    def provider(self, owner: str = OWNER) -> Any:
        return self.make(owner)


def _aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Account]:
    def make(owner: str) -> AwsProvider:
        config = AwsConfig(
            region="us-east-1",
            image_id="ami-0a1b2c3d4e5f60718",
            zones=("us-east-1a",),
            poll_interval_seconds=0.005,
            ready_timeout_seconds=20,
            policy=POLICY,
        )
        return AwsProvider(config, owner)

    def mark(provider: AwsProvider, vm_id: str, sandbox: str) -> None:
        tag = [{"Key": TAG_SANDBOX, "Value": sandbox}]
        provider.client.create_tags(Resources=[vm_id], Tags=tag)

    with mocked_aws(monkeypatch):
        flags = ("--provider", "aws", "--aws-region", "us-east-1")
        yield Account("aws", "us-east-1a", ("m5.large", "c5.large"), make, flags, mark)


def _gcp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Account]:
    gce = FakeGce()
    monkeypatch.setattr("providers.clouds.gcp.make_client", gce.client)
    zone = "us-central1-a"

    def make(owner: str) -> GcpProvider:
        config = GcpConfig(
            project=PROJECT, zones=(zone,), image="projects/p/global/images/x", policy=POLICY
        )
        return GcpProvider(config, owner, client=gce.client())

    def mark(_provider: GcpProvider, vm_id: str, sandbox: str) -> None:
        zone, _, name = vm_id.partition("/")
        gce.instances[(zone, name)]["labels"][TAG_SANDBOX] = sandbox

    flags = ("--provider", "gcp", "--gcp-project", PROJECT, "--gcp-zones", zone)
    yield Account("gcp", zone, ("g2-standard-4", "n2-standard-8"), make, flags, mark, gce)


def _azure(monkeypatch: pytest.MonkeyPatch) -> Iterator[Account]:
    arm = FakeArm()
    monkeypatch.setattr("providers.clouds.azure.make_clients", lambda _config: arm.clients())

    def make(owner: str) -> AzureProvider:
        compute, network = arm.clients()
        config = AzureConfig(
            subscription_id=SUBSCRIPTION,
            resource_group=RG,
            location="eastus",
            subnet_id=SUBNET,
            image_id="/subscriptions/x/resourceGroups/img/providers/Microsoft.Compute/images/p",
            zones=("1",),
            policy=POLICY,
        )
        return AzureProvider(config, owner, compute=compute, network=network)

    def mark(_provider: AzureProvider, vm_id: str, sandbox: str) -> None:
        arm.vms[vm_id]["tags"][TAG_SANDBOX] = sandbox

    flags = (
        "--provider",
        "azure",
        "--azure-subscription-id",
        SUBSCRIPTION,
        "--azure-resource-group",
        RG,
        "--azure-region",
        "eastus",
        "--azure-subnet-id",
        SUBNET,
    )
    yield Account("azure", "1", ("Standard_NC24ads_A100_v4", "Standard_D4as_v5"), make, flags, mark)


@pytest.fixture(params=["aws", "gcp", "azure"])
def account(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Account]:
    for key in [k for k in os.environ if k.startswith("PEERPODS_")]:
        monkeypatch.delenv(key)
    yield from {"aws": _aws, "gcp": _gcp, "azure": _azure}[request.param](monkeypatch)


@dataclass
class Filled:
    """The VM ids the account was filled with."""

    warm: list[str]  # this owner's, stopped, the first type
    other_type: str  # this owner's, stopped, the second type
    adopted: str  # adopted by a sandbox (pool tags off)
    mid: str  # a crash mid-adoption: the sandbox's tag on, the pool's still there
    foreign: str  # another owner's pool VM


async def _warm(provider: Any, slot: str, instance_type: str, zone: str) -> str:
    vm = await provider.launch_warm(WarmSpec(slot, instance_type, zone))
    await provider.stop_warm(vm.id)
    return str(vm.id)


async def _fill(account: Account) -> Filled:
    ours, theirs = account.provider(), account.provider(OTHER)
    first, second = account.types
    warm = [await _warm(ours, f"wp-ours-{i}", first, account.zone) for i in range(2)]
    other_type = await _warm(ours, "wp-ours-other", second, account.zone)
    adopted = await _warm(ours, "wp-ours-adopted", first, account.zone)
    spec = VMSpec(
        sandbox_id="sb-adopted",
        pod_namespace="default",
        pod_name="train",
        candidates=(VMCandidate(first),),
        user_data="#cloud-config\n",
    )
    await ours.adopt_warm(adopted, spec)
    mid = await _warm(ours, "wp-ours-mid", first, account.zone)
    account.mark(ours, mid, "sb-mid")
    foreign = await _warm(theirs, "wp-theirs", first, account.zone)
    return Filled(warm, other_type, adopted, mid, foreign)


def _live(account: Account) -> set[str]:
    """Every VM of both owners the account still holds (pool VMs and sandbox VMs)."""

    async def both() -> set[str]:
        found: set[str] = set()
        for owner in (OWNER, OTHER):
            provider = account.provider(owner)
            found |= {vm.id for vm in await provider.list_owned()}
        return found

    return asyncio.run(both())


def _cli(account: Account, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """The command's exit code and what it printed on stdout (its log lines go to stderr)."""
    action, *rest = args
    code = main(["warm-pool", action, *account.flags, *rest])
    return code, capsys.readouterr().out


def test_list_json_shows_only_this_owners_pool_vms(
    account: Account, capsys: pytest.CaptureFixture[str]
) -> None:
    filled = asyncio.run(_fill(account))
    code, out = _cli(account, capsys, "list", "--owner", OWNER, "--json")
    assert code == 0, out
    listed = {vm["vm_id"]: vm for vm in json.loads(out)["vms"]}
    # the adopted VM is the sandbox's (no pool tag), the foreign one another owner's
    assert set(listed) == {*filled.warm, filled.other_type, filled.mid}
    for vm_id in filled.warm:
        vm = listed[vm_id]
        assert vm["owner"] == OWNER and vm["slot"].startswith("wp-ours-")
        assert vm["instance_type"] == account.types[0] and vm["zone"] == account.zone
        assert vm["state"] == "stopped" and vm["sandbox"] == ""
        assert isinstance(vm["age_seconds"], int) and 0 <= vm["age_seconds"] < 3600
    assert listed[filled.mid]["sandbox"] == "sb-mid"
    code, out = _cli(account, capsys, "list", "--owner", OTHER)
    assert code == 0 and filled.foreign in out and "wp-theirs" in out
    assert all(vm_id not in out for vm_id in filled.warm)


def test_drain_deletes_only_this_owners_unadopted_pool_vms(
    account: Account, capsys: pytest.CaptureFixture[str]
) -> None:
    filled = asyncio.run(_fill(account))
    before = _live(account)
    assert {*filled.warm, filled.other_type, filled.adopted, filled.mid, filled.foreign} <= before

    code, out = _cli(account, capsys, "drain", "--owner", OWNER, "--dry-run", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["dry_run"] is True
    assert {vm["vm_id"] for vm in report["deleted"]} == {*filled.warm, filled.other_type}
    assert [vm["vm_id"] for vm in report["kept"]] == [filled.mid]
    assert _live(account) == before  # a dry run deletes nothing

    code, out = _cli(account, capsys, "drain", "--owner", OWNER, "--type", account.types[1])
    assert code == 0, out
    assert f"deleted {filled.other_type}" in out
    assert _live(account) == before - {filled.other_type}

    code, out = _cli(account, capsys, "drain", "--owner", OWNER, "--zone", "elsewhere-9")
    assert code == 0 and "no pool VM" in out
    code, out = _cli(account, capsys, "drain", "--owner", OWNER)
    assert code == 0, out
    assert f"kept {filled.mid}: adopted by sandbox sb-mid" in out
    # the sandbox's VMs and the other owner's pool VM stay
    assert _live(account) == {filled.adopted, filled.mid, filled.foreign}


def test_bad_input_deletes_nothing_and_says_why_in_one_line(
    account: Account, capsys: pytest.CaptureFixture[str]
) -> None:
    filled = asyncio.run(_fill(account))
    before = _live(account)
    # the cloud's required settings missing: the flags of another cloud
    wrong = {"aws": "gcp", "gcp": "azure", "azure": "gcp"}[account.name]
    capsys.readouterr()
    quiet = ["--log-level", "warning", "warm-pool", "drain"]  # no SDK's info lines
    code = main([*quiet, "--provider", wrong, "--owner", OWNER])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("peerpods warm-pool: ") and "required" in err
    with pytest.raises(SystemExit) as exited:  # an unknown provider: argparse's usage error
        main([*quiet, "--provider", "static", "--owner", OWNER])
    assert exited.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    assert _live(account) == before
    assert filled.warm[0] in before


async def test_a_running_keeper_replaces_what_a_drain_deleted() -> None:
    """A serve that still runs refills its pool: its warm slots whose VMs a drain deleted are
    forgotten and launched again (why the uninstall deletes the DaemonSet first)."""
    gce = FakeGce()
    zone = "us-central1-a"
    config = GcpConfig(project=PROJECT, zones=(zone,), image="img", policy=POLICY)
    cloud = LatencyCloud(GcpProvider(config, OWNER, client=gce.client()), LatencyModel(scale=0.001))
    with tempfile.TemporaryDirectory() as directory:
        store = await StateStore.open(Path(directory))
        pool = WarmPool(
            cloud,
            PoolRecord(store),
            WarmConfig(pools=(Pool("g2-standard-4", 2, zone),), interval_seconds=0.05),
            default_image="img",
            zones=(zone,),
        )

        async def warm_ids() -> set[str]:
            for _ in range(400):
                ids = {s.instance_id for s in pool.slots.values() if s.state is SlotState.WARM}
                if len(ids) == 2:
                    return ids
                await asyncio.sleep(0.02)
            raise AssertionError("the pool was not warm")

        pool.start()
        try:
            first = await warm_ids()
            report = await drain([GcpProvider(config, OWNER, client=gce.client())])
            assert {vm.vm_id for vm in report.deleted} == first
            for _ in range(400):
                second = await warm_ids()
                if not second & first:
                    break
                await asyncio.sleep(0.02)
            assert len(second) == 2 and not second & first
            assert set(await PoolRecord(store).members()) == set(pool.slots)
        finally:
            await pool.stop()
            await cloud.close()
            await store.close()


def test_the_owner_defaults_to_serves(
    account: Account, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    filled = asyncio.run(_fill(account))
    monkeypatch.setenv("PEERPODS_OWNER_ID", OWNER)  # as the DaemonSet sets it for serve
    code, out = _cli(account, capsys, "list", "--json")
    assert code == 0
    assert {vm["vm_id"] for vm in json.loads(out)["vms"]} == {
        *filled.warm,
        filled.other_type,
        filled.mid,
    }
    monkeypatch.delenv("PEERPODS_OWNER_ID")  # serve's default: peerpods-<hostname>
    code, out = _cli(account, capsys, "list", "--json")
    assert code == 0 and json.loads(out)["vms"] == []


@pytest.mark.parametrize("account", ["gcp"], indirect=True)
def test_a_refused_delete_exits_1_naming_it_and_the_others_are_deleted(
    account: Account, capsys: pytest.CaptureFixture[str]
) -> None:
    filled = asyncio.run(_fill(account))
    refused = filled.warm[0].partition("/")[2]

    def forbid(action: str, _zone: str, body: dict[str, Any]) -> Any:
        if action == "delete" and body["name"] == refused:
            return http_error(403, "forbidden", "deleting this instance is not allowed")
        return None

    account.fake.faults.append(forbid)
    code = main(["--log-level", "warning", "warm-pool", "drain", *account.flags, "--owner", OWNER])
    out, err = capsys.readouterr()
    assert code == 1
    assert f"failed {filled.warm[0]}: " in err and "not allowed" in err
    assert f"deleted {filled.warm[1]}" in out and f"deleted {filled.other_type}" in out
    assert _live(account) == {filled.warm[0], filled.adopted, filled.mid, filled.foreign}
