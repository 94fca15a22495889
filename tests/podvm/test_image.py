"""The image side: the systemd unit's ordering, NVML imported only when prepare runs, and the
read-only check script (against the fake NVML and a stand-in nvidia-ctk)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.podvm import fake_nvml

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "config/podvm/systemd/peerpods-podvm-prepare.service"


def unit_keys(text: str) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            keys.setdefault(key.strip(), []).extend(value.split())
    return keys


def test_the_unit_runs_once_before_kata_agent_after_user_data() -> None:
    keys = unit_keys(UNIT.read_text())
    assert keys["Type"] == ["oneshot"] and keys["RemainAfterExit"] == ["yes"]
    assert "kata-agent.service" in keys["Before"] and keys["WantedBy"] == ["kata-agent.service"]
    assert "process-user-data.service" in keys["After"]
    assert "Requires" not in keys and "RequiredBy" not in keys  # kata-agent starts regardless
    assert keys["ExecStart"][-2:] == ["podvm", "prepare"]
    assert keys["SuccessExitStatus"] == ["3"]
    assert "journal+console" in keys["StandardOutput"]


def test_nvml_is_imported_only_when_prepare_runs() -> None:
    code = (
        "import sys, adaptor.cli.main, adaptor.planning.userdata, adaptor.node.wiring,"
        " adaptor.podvm.prepare;"
        "adaptor.cli.main.build_parser(); assert 'pynvml' not in sys.modules, 'imported'"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("podvm_check", ROOT / "scripts/podvm_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FAKE_CTK = """#!/bin/sh
# stands in for `nvidia-ctk cdi generate --output=FILE ...`: whole GPUs with a DRM node each
for arg in "$@"; do case "$arg" in --output=*) out="${arg#--output=}";; esac; done
cat > "$out" <<'JSON'
%s
JSON
"""


def test_the_check_script_compares_profiles_and_the_whole_gpu_spec(
    make_vm: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    vm = make_vm(gpus=2, seed=5)
    vm.machine.gpus[1].mig_current = vm.machine.gpus[1].mig_pending = 1
    whole = vm.machine.gpus[0].minor
    ctk_spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {
                "name": "0",
                "containerEdits": {
                    "deviceNodes": [{"path": f"/dev/nvidia{whole}"}, {"path": "/dev/dri/card1"}]
                },
            }
        ],
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl"}],
            "mounts": [{"hostPath": "/usr/bin/nvidia-smi", "containerPath": "/usr/bin/nvidia-smi"}],
        },
    }
    ctk = tmp_path / "nvidia-ctk"
    ctk.write_text(FAKE_CTK % json.dumps(ctk_spec))
    ctk.chmod(0o755)
    script = load_script()
    code = script.main(["--root", str(vm.root), "--nvidia-ctk", str(ctk)], lib=fake_nvml)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "GPU 1 (h100-80gb): 3g.40gb id 9 enum 2: agrees" in out
    assert "GPU 0 NVIDIA H100 80GB HBM3 (h100-80gb): MIG mode off" in out
    assert "nvidia-ctk also binds ['/dev/dri/card1']" in out
    assert out.rstrip().endswith("OK")
    assert [g.mig_current for g in vm.machine.gpus] == [0, 1]  # nothing changed
    assert vm.machine.calls == []


def test_the_check_script_reports_a_table_that_differs(
    make_vm: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    vm = make_vm(gpus=1, mig_enabled=True)
    wrong = dict(fake_nvml.profiles_of("h100-80gb")[4].__dict__, starts=(0, 2, 4))
    real = fake_nvml.profiles_of
    monkeypatch.setattr(
        fake_nvml,
        "profiles_of",
        lambda model: [
            fake_nvml.Profile(**wrong) if p.name == "3g.40gb" else p for p in real(model)
        ],
    )
    script = load_script()
    code = script.main(["--root", str(vm.root), "--nvidia-ctk", ""], lib=fake_nvml)
    out = capsys.readouterr().out
    assert code == 1
    assert "3g.40gb id 9 enum 2: starts NVML (0, 2, 4) vs table (0, 4)" in out
