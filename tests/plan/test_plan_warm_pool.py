"""`peerpods plan --warm-pool`: whether StartVM would adopt a warm VM, by the very rule StartVM
uses (the placement's first choice, on demand, in the pool's zone), and why not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptor.cli.main import main

POD = """apiVersion: v1
kind: Pod
metadata: {name: train, namespace: default}
spec:
  runtimeClassName: kata-remote
  containers:
  - name: c
    image: busybox
    resources:
      limits: {nvidia.com/gpu: 1}
"""


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "pod.yaml"
    path.write_text(POD)
    return path


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_pod_whose_first_choice_is_pooled_gets_a_warm_vm(
    capsys: pytest.CaptureFixture[str], manifest: Path
) -> None:
    code, out, _ = plan(capsys, str(manifest), "--warm-pool", "g4dn.xlarge=2@us-east-1a")
    assert code == 0
    assert "warm VM: yes (pool g4dn.xlarge@us-east-1a)" in out.splitlines()
    code, out, _ = plan(
        capsys, str(manifest), "--warm-pool", "g4dn.xlarge=2@us-east-1a", "--output", "json"
    )
    assert json.loads(out)["warm_vm"] == {"adopted": True, "pool": "g4dn.xlarge@us-east-1a"}


def test_no_warm_vm_for_another_type_a_spot_pod_or_an_empty_pool(
    capsys: pytest.CaptureFixture[str], manifest: Path, tmp_path: Path
) -> None:
    _, out, _ = plan(
        capsys, str(manifest), "--warm-pool", "p5.4xlarge=2", "--warm-pool", "m5.large=1"
    )
    assert "warm VM: no: no warm pool of g4dn.xlarge" in out.splitlines()
    _, out, _ = plan(capsys, str(manifest), "--warm-pool", "g4dn.xlarge=0")
    assert "warm VM: no: no warm pool of g4dn.xlarge" in out.splitlines()
    spot = tmp_path / "spot.yaml"
    spot.write_text(POD.replace("namespace: default}", "namespace: default, annotations: "
                                "{peerpods.io/capacity-type: spot}}"))  # fmt: skip
    code, out, err = plan(capsys, str(spot), "--warm-pool", "g4dn.xlarge=2")
    assert code == 0, err
    assert "warm VM: no: Spot VMs are never pooled" in out.splitlines()


def test_without_pools_nothing_is_said(capsys: pytest.CaptureFixture[str], manifest: Path) -> None:
    _, out, _ = plan(capsys, str(manifest))
    assert "warm VM" not in out
    _, out, _ = plan(capsys, str(manifest), "--output", "json")
    assert json.loads(out)["warm_vm"] is None


def test_a_bad_pool_is_refused_without_a_traceback(
    capsys: pytest.CaptureFixture[str], manifest: Path
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["plan", str(manifest), "--warm-pool", "g4dn.xlarge=many"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid warm pool 'g4dn.xlarge=many' (write TYPE=N or TYPE=N@ZONE)" in err
    assert "Traceback" not in err
