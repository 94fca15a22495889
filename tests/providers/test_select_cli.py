"""`peerpods select` end to end: flags in, table or JSON out, one clear line on failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptor.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["select", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--gpus", "1", "--gpu-model", "h100", "--output", "json")
    assert code == 0 and not err
    data = json.loads(out)
    assert data["selected"] == "p5.4xlarge"
    assert data["provider"] == "aws" and data["region"] == "us-east-1"
    first = data["candidates"][0]
    assert first["name"] == "p5.4xlarge" and first["price_per_hour"] == pytest.approx(6.88)
    assert first["gpu_model"] == "h100-80gb" and first["gpus"] == 1
    assert [c["name"] for c in data["candidates"]] == ["p5.4xlarge", "p5.48xlarge"]
    assert data["rejections"] and all(r["reason"] for r in data["rejections"])


def test_mig_json_has_the_layout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "--provider", "gcp", "--mig", "3g.40gb=1,4g.40gb=1", "--output", "json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["selected"] == "a2-ultragpu-1g"
    layout = data["candidates"][0]["mig_layout"]
    assert sorted((p["profile"], p["gpu"], p["start"]) for p in layout) == [
        ("3g.40gb", 0, 4),
        ("4g.40gb", 0, 0),
    ]
    # GCP list price: A2 Instance Core and Ram + one A100 80GB GPU (us-central1)
    assert data["candidates"][0]["price_per_hour"] == pytest.approx(5.0277, abs=1e-3)
    assert data["candidates"][0]["price_estimated"] is False


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--provider", "azure", "--gpus", "1", "--gpu-model", "a10",
                       "--fractional", "--limit", "2")  # fmt: skip
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("selected: Standard_NV6ads_A10_v5  (azure eastus")
    assert lines[1].split()[:3] == ["#", "TYPE", "USD/H"]
    assert "1/6 of one a10" in lines[2]
    assert lines[2].split()[2] == "0.4540"  # Azure Retail Prices, eastus
    assert lines[4].startswith("... 3 more candidates")
    assert "rejected:" in lines[5]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus", "16", "--gpu-model", "h100"], "16 h100-80gb GPUs exceed the largest type, 8"),
        (["--mig", "9g.99gb=1"], "no type offers MIG profile 9g.99gb"),
        (["--gpu-model", "h900"], "unknown GPU model 'h900'"),
        (["--mig", "1g.10gb=zero"], "--mig: count in '1g.10gb=zero' must be a positive integer"),
        (["--mig", "big"], "--mig: 'big' is not PROFILE=COUNT"),
        (["--memory", "12XB"], "invalid quantity '12XB'"),
        (["--gpu-memory=-1Gi"], "negative quantity"),
        (["--vcpus", "two"], "--vcpus must be a whole number"),
        (["--gpus", "-1"], "--gpus must not be negative"),
        (["--region", "eu-west-9"], "no catalog snapshot for aws eu-west-9"),
        (["--instance-type", "p9.huge"], "not in the aws us-east-1 catalog"),
        (["--provider", "azure", "--gpu-model", "l4"], "no type offers GPU model l4"),
    ],
)
def test_failures_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("peerpods select: ")
    assert message in err, err
    assert "Traceback" not in err


def test_bad_flag_choice_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["select", "--provider", "oracle"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_env_twins_and_catalog_dir(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = ROOT / "providers" / "snapshots" / "gcp-us-central1.json"
    (tmp_path / "gcp-us-central1.json").write_bytes(source.read_bytes())
    monkeypatch.setenv("PEERPODS_PROVIDER", "gcp")
    monkeypatch.setenv("PEERPODS_GPU_MODEL", "l4")
    monkeypatch.setenv("PEERPODS_GPUS", "1")
    code, out, _ = run(capsys, "--catalog-dir", str(tmp_path), "--output", "json")
    assert code == 0 and json.loads(out)["selected"] == "g2-standard-4"


def test_console_script_does_not_import_other_clouds() -> None:
    # `select --provider aws` on the snapshot needs neither the Azure nor the GCP SDK.
    code = (
        "import sys; from adaptor.cli.main import main; "
        "rc = main(['select', '--gpus', '1', '--output', 'json']); "
        "bad = [m for m in sys.modules if m.startswith(('azure', 'google.cloud', 'boto3'))]; "
        "print(rc, bad, file=sys.stderr)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT
    )
    assert done.stderr.strip().splitlines()[-1] == "0 []", done.stderr
    assert json.loads(done.stdout)["selected"] == "g4dn.xlarge"  # NVIDIA, not g4ad (AMD)


def test_live_uses_the_loader(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import providers.clouds.loaders.aws as aws_loader
    from providers.core import snapshots
    from providers.core.catalog import Catalog

    snapshot = snapshots.load_catalog("aws", "us-west-2")
    asked: list[str] = []

    def load_catalog(region: str, *, client: object = None, progress: object = None) -> Catalog:
        asked.append(region)
        assert callable(progress)
        progress("instance types", 100)
        return snapshot.model_copy(update={"source": "live"})

    monkeypatch.setattr(aws_loader, "load_catalog", load_catalog)
    code, out, _ = run(capsys, "--live", "--region", "us-west-2", "--gpus", "1",
                       "--gpu-model", "h100", "--output", "json")  # fmt: skip
    assert code == 0 and asked == ["us-west-2"]
    data = json.loads(out)
    assert data["source"] == "live" and data["region"] == "us-west-2"
    assert data["selected"].startswith("p5")
