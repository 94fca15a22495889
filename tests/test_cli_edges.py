"""`peerpods cdi`, `select` and the edits mode at their edges: a device node's minor 0 is kept in
JSON once a major names the device; a spec directory that does not exist is an error, never an
empty list, and stops `serve --cdi-mode edits` at start; a memory flag needs its unit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptor.cli.main import main
from adaptor.devices.config import cdi_config
from adaptor.settings import CdiSettings
from providers.core.errors import InvalidRequest

SPEC = """cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - path: /dev/nvidia0
          type: c
          major: 195
          minor: 0
        - path: /dev/nvidiactl
"""


def test_list_json_keeps_minor_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "gpu.yaml").write_text(SPEC)
    assert main(["cdi", "list", "--spec-dir", str(tmp_path), "--output", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    nodes = listed["nvidia.com/gpu=0"]["containerEdits"]["deviceNodes"]
    assert nodes[0] == {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}
    assert nodes[1] == {"path": "/dev/nvidiactl"}  # nothing to say: no major, no minor


def test_a_missing_spec_directory_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    for command in (["list"], ["apply", "--oci", "-", "nvidia.com/gpu=0"]):
        assert main(["cdi", *command[:1], "--spec-dir", str(missing), *command[1:]]) == 2
        err = capsys.readouterr().err
        assert err == f"peerpods cdi: {missing}: no such spec directory\n"


def test_edits_mode_refuses_a_missing_spec_directory(tmp_path: Path) -> None:
    settings = CdiSettings(cdi_mode="edits", cdi_spec_dir=str(tmp_path / "nowhere"))
    with pytest.raises(InvalidRequest, match=r"--cdi-spec-dir: .*nowhere: no such directory"):
        cdi_config(settings)
    (tmp_path / "gpu.yaml").write_text(SPEC)
    assert cdi_config(CdiSettings(cdi_mode="edits", cdi_spec_dir=str(tmp_path))).registry


@pytest.mark.parametrize("flag", ["--gpu-memory", "--memory"])
def test_a_memory_flag_without_a_unit_is_refused(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["select", "--gpus", "1", flag, "40"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"peerpods select: {flag} 40 has no unit: write 40Gi or 40Mi (a bare number is bytes)\n"
    )
    assert main(["select", "--gpus", "1", flag, "40Gi"]) == 0
