"""`peerpods dra publish`: once, delete, print; bad input is one line and exit 2."""

from __future__ import annotations

import pytest
import yaml

from adaptor.cli.main import main
from providers.dra.publisher import SLICES
from tests.dra.fake_kube import FakeKube


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in __import__("os").environ if k.startswith("PEERPODS_")]:
        monkeypatch.delenv(key)


def test_once_publishes_then_delete_removes(
    kube: FakeKube, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    argv = ["dra", "publish", "--provider", "aws", "--region", "us-east-1"]
    assert main([*argv, "--once", "--gpu-limit", "h100=2"]) == 0
    out = capsys.readouterr().out
    assert "pool aws-us-east-1 generation 1" in out and "created" in out
    devices = [d for s in kube.store.items(SLICES) for d in s["spec"].get("devices", [])]
    assert sum(d["attributes"]["model"]["string"] == "h100-80gb" for d in devices) == 2
    assert main([*argv, "--once", "--gpu-limit", "h100=2"]) == 0
    assert "generation 1" in capsys.readouterr().out and kube.store.items(SLICES)
    monkeypatch.setenv("PEERPODS_GPU_LIMIT", "h100=3")
    assert main([*argv, "--once"]) == 0
    assert "generation 2" in capsys.readouterr().out
    assert main([*argv, "--once", "--gpu-limit", "h100=1", "--gpu-limit", "l4=2,t4=1"]) == 0
    assert "generation 3" in capsys.readouterr().out
    devices = [d for s in kube.store.items(SLICES) for d in s["spec"].get("devices", [])]
    models = [
        d["attributes"]["model"]["string"] for d in devices if not d.get("allowMultipleAllocations")
    ]
    assert (models.count("h100-80gb"), models.count("l4"), models.count("t4")) == (1, 2, 1)
    assert main([*argv, "--delete"]) == 0
    assert kube.store.items(SLICES) == []


def test_print_writes_the_slices_and_needs_no_cluster(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    assert main(["dra", "publish", "--provider", "gcp", "--print"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert docs and all(d["kind"] == "ResourceSlice" for d in docs)
    assert docs[0]["spec"]["pool"]["name"] == "gcp-us-central1"


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpu-limit", "h100"],
        ["--gpu-limit", "warp-drive=1"],
        ["--region", "nowhere-9"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    assert main(["dra", "publish", "--print", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("peerpods dra: ") and "Traceback" not in err[0]


def test_account_quotas_become_the_pools_account_counters(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from providers.core.account_quota import AccountLimit, AccountQuota

    p_class = AccountLimit(
        "L-417A185B Running On-Demand P instances", "vcpus", "class", ("p",), 96, 0
    )
    seen: list[str] = []

    def read(region: str, ec2: object, quotas: object, vcpus: dict[str, int]) -> AccountQuota:
        seen.append(region)
        return AccountQuota("aws", region, (p_class,), notes=("L-DB2E81BA: AccessDenied",))

    monkeypatch.setattr("providers.clouds.quotas.aws_quota", read)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    assert main(["dra", "publish", "--account-quotas", "--print"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    sets = {c["name"]: c["counters"] for c in docs[0]["spec"]["sharedCounters"]}
    assert sets["account"] == {"l-417a185b-running-on-demand-p-instances": {"value": "96"}}
    assert seen == ["us-east-1"]


def test_account_quotas_of_another_cloud_are_one_clear_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["dra", "publish", "--provider", "gcp", "--account-quotas", "--print"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "AWS accounts only" in err[0]
