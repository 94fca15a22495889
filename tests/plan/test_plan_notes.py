"""`peerpods plan` says why the webhook rewrote the pod: limits removed, CPU rounded up to whole
vCPUs (with the pod's own figure), the contract seal, and that a `requests.nvidia.com/gpu` quota
does not see the pod while `kata.peerpods.io/gpu` does (the DRA-driver mode binds it natively)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from adaptor.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def plan(capsys: pytest.CaptureFixture[str], path: Path, *flags: str) -> tuple[int, str]:
    code = main(["plan", str(path), *flags])
    out, _ = capsys.readouterr()
    return code, out


def why(out: str) -> list[str]:
    lines = out.split("\nwhy:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [line.removeprefix("  - ") for line in lines]


def test_the_example_gpu_pod_is_told_why(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = plan(capsys, ROOT / "config/examples/gpu-pod.yaml")
    assert code == 0
    notes = why(out)
    assert notes[0].startswith("limits and requests removed from the containers: they run in")
    assert "CPU 4.25 (the pod's total by Kubernetes' rules" in notes[1]
    assert notes[1].endswith("rounded up to 5 vCPUs: a VM has whole vCPUs")
    assert notes[2].startswith("peerpods.io/contract-seal: a MAC over the contract keys")
    assert "a requests.nvidia.com/gpu quota does not see this pod" in notes[3]
    assert "requests.kata.peerpods.io/gpu" in notes[3] and "docs/dra.md" in notes[3]


def pod(tmp_path: Path, cpu: str, gpus: int) -> Path:
    limits = {"cpu": cpu, "memory": "4Gi", **({"nvidia.com/gpu": gpus} if gpus else {})}
    document = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {
            "runtimeClassName": "kata-remote",
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": limits}}],
        },
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_whole_cpus_and_no_gpus_say_nothing_about_rounding_or_quotas(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out = plan(capsys, pod(tmp_path, "4", 0), "--output", "json")
    assert code == 0
    notes = json.loads(out)["notes"]
    assert not any("rounded up" in n or "quota" in n for n in notes), notes
    assert any(n.startswith("limits and requests removed") for n in notes)


def test_millicores_are_shown_as_the_pod_wrote_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out = plan(capsys, pod(tmp_path, "2500m", 1), "--output", "json")
    assert code == 0
    notes = json.loads(out)["notes"]
    assert any(n.startswith("CPU 2.5 (") and "rounded up to 3 vCPUs" in n for n in notes), notes
    assert any("requests.nvidia.com/gpu quota does not see this pod" in n for n in notes)
