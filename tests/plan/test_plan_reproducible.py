"""`peerpods plan` is a preview: the same pod plans to the same output in every process (the
contract seal included), so plans can be compared across machines and images."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_EXAMPLE = ("config/examples/gpu-pod.yaml",)


def _plan() -> str:
    result = subprocess.run(
        [sys.executable, "-m", "adaptor.cli.main", "plan", *_EXAMPLE, "--output", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout


def test_two_processes_plan_the_same_pod_identically() -> None:
    first = _plan()
    assert "peerpods.io/contract-seal" in first
    assert first == _plan()
