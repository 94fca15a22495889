"""The shared GPU quota pool: its spec, usage accounting, racing reservations, StartVM's check."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from adaptor.cli.main import main
from adaptor.planning.placement import Placement, PlanCandidate, quota_pool, store_holdings
from adaptor.state import SandboxRecord, SandboxState, StateStore
from providers.core.base import Instance
from providers.core.catalog import Catalog
from providers.core.contract import GpuIntent, VMIntent
from providers.core.errors import InvalidRequest, QuotaExhausted
from providers.core.quota import QuotaLimit, QuotaPool, demand_of_name, demand_of_type, parse_quota
from providers.core.snapshots import load_snapshot


@pytest.fixture(scope="module")
def aws() -> Catalog:
    return load_snapshot("aws", "us-east-1", None)


def holdings_of(held: dict[str, str], delay: float = 0.0):  # type: ignore[no-untyped-def]
    """A holdings source over a dict; `delay` makes every read yield to other tasks."""

    async def holdings() -> Mapping[str, str]:
        if delay:
            await asyncio.sleep(delay)
        return dict(held)

    return holdings


def names(candidates: Sequence[PlanCandidate]) -> tuple[str, ...]:
    return tuple(c.instance_type for c in candidates)


def intent(gpus: int, *models: str) -> VMIntent:
    return VMIntent(pod_name="p", pod_namespace="ns", gpu=GpuIntent(gpus=gpus, models=models))


# --- the spec ----------------------------------------------------------------------------------


def test_parse_every_kind_and_alias() -> None:
    assert parse_quota(" NVIDIA H100 80GB HBM3 =0") == (QuotaLimit("gpus", "h100-80gb", 0),)
    limits = parse_quota("h100=8,gpus:t4=4,gpus=20,family:P5=16,vcpus:p5=192,vcpus=512")
    assert limits == (
        QuotaLimit("gpus", "h100-80gb", 8),
        QuotaLimit("gpus", "t4", 4),
        QuotaLimit("gpus", "", 20),
        QuotaLimit("family", "p5", 16),
        QuotaLimit("vcpus", "p5", 192),
        QuotaLimit("vcpus", "", 512),
    )
    assert parse_quota("") == ()
    assert parse_quota("a100-80gb=2")[0].label == "A100 80GB"
    assert parse_quota("h100-nvl=2")[0].label == "H100 NVL"
    assert parse_quota("t4=2")[0].label == "T4"
    assert parse_quota("h100=2")[0].label == "H100"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("h100", "want KEY=LIMIT"),
        ("=3", "want KEY=LIMIT"),
        ("h100=x", "whole number"),
        ("h100=-1", "whole number"),
        ("h100=1.5", "whole number"),
        ("warp-drive=2", "unknown GPU model 'warp-drive'"),
        ("gpus:warp=2", "unknown GPU model 'warp'"),
        ("h100=1,h100-80gb=2", "limited twice"),
        ("family:=2", "name an instance family"),
        ("family:p5/x=2", "name an instance family"),
        ("cores:p5=2", "unknown kind 'cores'"),
        ("h100=8,,t4=1", "empty item"),
    ],
)
def test_bad_specs_are_clear_errors(spec: str, words: str) -> None:
    with pytest.raises(InvalidRequest, match="--gpu-quota") as caught:
        parse_quota(spec)
    assert words in str(caught.value)


def test_serve_rejects_a_bad_quota_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The quota is a declared setting: argparse refuses it while parsing (usage, then one line).
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "serve",
                "--no-agent-tls",
                "--socket",
                str(tmp_path / "h.sock"),
                "--state-dir",
                str(tmp_path / "state"),
                "--pods-dir",
                str(tmp_path / "pods"),
                "--gpu-quota",
                "h100=lots",
            ]
        )
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2
    last = err.splitlines()[-1]
    assert "--gpu-quota" in last and "'h100=lots'" in last and "Traceback" not in err
    assert not (tmp_path / "state").exists() and not (tmp_path / "h.sock").exists()
    assert not (tmp_path / "state").exists()


# --- accounting --------------------------------------------------------------------------------


async def test_usage_counts_held_vms_by_model_family_and_vcpus(aws: Catalog) -> None:
    limits = parse_quota("h100=16,family:p5=16,vcpus:p5=400,gpus=20,l4=4,vcpus=1000")
    held = {
        "a": "p5.48xlarge",  # 8 H100, 192 vCPUs
        "b": "p5.4xlarge",  # 1 H100, 16 vCPUs
        "c": "g6.xlarge",  # 1 L4, 4 vCPUs
        "d": "g6f.large",  # 1/8 of an L4, 2 vCPUs
        "e": "",  # no VM yet: nothing held
        "f": "no-such.type",  # unknown to the catalog: nothing to count
    }
    pool = QuotaPool(limits, aws, holdings_of(held))
    usage = {str(k): v for k, v in (await pool.usage()).items()}
    assert usage == {
        "gpus:h100-80gb=16": 9,
        "family:p5=16": 9,
        "vcpus:p5=400": 208,
        "gpus=20": 9 + 1 + 0.125,
        "gpus:l4=4": 1.125,
        "vcpus=1000": 192 + 16 + 4 + 2,
    }


async def test_reservations_count_until_the_vm_exists_and_go_with_the_sandbox(
    aws: Catalog,
) -> None:
    held: dict[str, str] = {"x": "", "y": ""}
    pool = QuotaPool(parse_quota("h100=16"), aws, holdings_of(held))
    p5 = demand_of_name("p5.48xlarge", aws.by_name())
    assert p5 is not None
    kept = await pool.reserve("x", [("p5.48xlarge", p5)])
    assert kept.kept == ("p5.48xlarge",)
    assert list((await pool.usage()).values()) == [8]
    # Reserving again for the same sandbox replaces its reservation (a retried StartVM).
    await pool.reserve("x", [("p5.48xlarge", p5)])
    assert list((await pool.usage()).values()) == [8]
    # The VM exists: counted once, from the record, though the reservation is still there.
    held["x"] = "p5.48xlarge"
    assert list((await pool.usage()).values()) == [8]
    await pool.reserve("y", [("p5.48xlarge", p5)])
    assert list((await pool.usage()).values()) == [16]
    pool.release("y")
    assert list((await pool.usage()).values()) == [8]
    # A sandbox gone from the store (stopped) holds nothing, its reservation pruned.
    del held["x"]
    assert list((await pool.usage()).values()) == [0]
    assert pool.reserved == {}


async def test_a_reservation_for_several_candidates_holds_the_most_of_each(aws: Catalog) -> None:
    types = aws.by_name()
    p5, p4de = demand_of_name("p5.48xlarge", types), demand_of_name("p4de.24xlarge", types)
    assert p5 is not None and p4de is not None
    pool = QuotaPool(parse_quota("h100=8,a100-80gb=8,gpus=16"), aws, holdings_of({"x": ""}))
    await pool.reserve("x", [("p5.48xlarge", p5), ("p4de.24xlarge", p4de)])
    usage = {str(k): v for k, v in (await pool.usage()).items()}
    assert usage == {"gpus:h100-80gb=8": 8, "gpus:a100-80gb=8": 8, "gpus=16": 8}


async def test_n1_vms_report_their_machine_type_so_the_reservation_keeps_their_gpus() -> None:
    gcp = load_snapshot("gcp", "us-central1", None)
    held = {"x": ""}
    pool = QuotaPool(parse_quota("t4=4"), gcp, holdings_of(held))
    t4 = demand_of_type(gcp.by_name()["n1-standard-8"], ("t4", 2))
    assert t4.gpu_model == "t4" and t4.gpus == 2
    await pool.reserve("x", [("n1 with 2 T4", t4)])
    held["x"] = "n1-standard-8"
    assert list((await pool.usage()).values()) == [2]


# --- exhaustion and races ----------------------------------------------------------------------


async def test_exhausted_message_and_nothing_changes(aws: Catalog) -> None:
    pool = QuotaPool(parse_quota("h100=8"), aws, holdings_of({"a": "p5.48xlarge", "b": ""}))
    p5 = demand_of_name("p5.4xlarge", aws.by_name())
    assert p5 is not None
    with pytest.raises(QuotaExhausted) as caught:
        await pool.reserve("b", [("p5.4xlarge", p5)])
    assert str(caught.value) == "quota for H100 exhausted (8/8)"
    assert pool.reserved == {}
    partial = QuotaPool(parse_quota("vcpus:p5=200"), aws, holdings_of({"a": "p5.48xlarge"}))
    with pytest.raises(QuotaExhausted, match=r"^quota for p5 vCPUs exhausted \(192/200, this "):
        await partial.reserve("b", [("p5.4xlarge", p5)])


async def test_two_startvms_racing_for_the_last_gpus(aws: Catalog) -> None:
    held = {"old": "p5.48xlarge", "a": "", "b": ""}
    # Every holdings read yields, so both reservations are in flight together.
    pool = QuotaPool(parse_quota("h100=16"), aws, holdings_of(held, delay=0.01))
    p5 = demand_of_name("p5.48xlarge", aws.by_name())
    assert p5 is not None
    results = await asyncio.gather(
        pool.reserve("a", [("p5.48xlarge", p5)]),
        pool.reserve("b", [("p5.48xlarge", p5)]),
        return_exceptions=True,
    )
    won = [r for r in results if not isinstance(r, BaseException)]
    lost = [r for r in results if isinstance(r, BaseException)]
    assert len(won) == 1 and len(lost) == 1
    assert isinstance(lost[0], QuotaExhausted)
    assert str(lost[0]) == "quota for H100 exhausted (16/16)"
    assert list((await pool.usage()).values()) == [16]


async def test_many_racers_never_exceed_the_pool(aws: Catalog) -> None:
    held = {f"s{i}": "" for i in range(12)}
    pool = QuotaPool(parse_quota("h100=5"), aws, holdings_of(held, delay=0.001))
    one = demand_of_name("p5.4xlarge", aws.by_name())
    assert one is not None
    results = await asyncio.gather(
        *(pool.reserve(s, [("p5.4xlarge", one)]) for s in held), return_exceptions=True
    )
    assert sum(not isinstance(r, BaseException) for r in results) == 5
    assert all(isinstance(r, QuotaExhausted) for r in results if isinstance(r, BaseException))
    assert list((await pool.usage()).values()) == [5]


# --- through Placement (StartVM's selection) ---------------------------------------------------


async def test_placement_drops_candidates_over_the_pool(aws: Catalog) -> None:
    pool = QuotaPool(parse_quota("h100=8"), aws, holdings_of({"a": "p5.48xlarge", "b": ""}))
    placement = Placement(catalog=aws, quota=pool)
    wanted = intent(8, "h100", "a100-80gb")
    assert "p5.48xlarge" in names(placement.candidates(wanted))  # without the pool
    kept = names((await placement.plan(wanted, "b")).candidates)
    assert kept and "p5.48xlarge" not in kept
    assert all(aws.by_name()[n].gpu.model == "a100-80gb" for n in kept)  # type: ignore[union-attr]
    placement.release("b")
    assert pool.reserved == {}
    with pytest.raises(QuotaExhausted, match=r"^quota for H100 exhausted \(8/8\)$"):
        await placement.plan(intent(1, "h100"), "b")


async def test_placement_without_a_pool_reserves_nothing(aws: Catalog) -> None:
    placement = Placement(catalog=aws)
    wanted = intent(1, "h100")
    assert (await placement.plan(wanted, "x")).candidates == placement.candidates(wanted)
    placement.release("x")


async def test_placement_counts_the_state_store(aws: Catalog, tmp_path: Path) -> None:
    store = await StateStore.open(tmp_path)
    try:
        vm = Instance(id="i-1", name="vm", addresses=("127.0.0.1",), instance_type="p5.48xlarge")
        await store.put(SandboxRecord("old", "ns", "p", state=SandboxState.RUNNING, instance=vm))
        await store.put(SandboxRecord("gone", "ns", "p", state=SandboxState.FAILED))
        await store.put(SandboxRecord("new", "ns", "p"))
        holdings = store_holdings(store)
        assert quota_pool("", aws, holdings) is None
        placement = Placement(catalog=aws, quota=quota_pool("h100=9", aws, holdings))
        assert placement.quota is not None
        plan = await placement.plan(intent(1, "h100"), "new")
        assert names(plan.candidates) == ("p5.4xlarge",)
        with pytest.raises(QuotaExhausted, match=r"\(9/9\)"):
            await placement.plan(intent(1, "h100"), "gone")  # a failed sandbox retrying
        await store.delete("old")
        plan = await placement.plan(intent(1, "h100"), "gone")
        assert plan.candidates[0].instance_type == "p5.4xlarge"
    finally:
        await store.close()
