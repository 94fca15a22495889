"""README stays true: every `peerpods ...` command it shows runs and says what it claims (the
set-up commands themselves run in a fresh virtual environment in tests/test_readme.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from adaptor.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SETUP = "pip install -c config/constraints.txt -e . && peerpods plan config/examples/gpu-pod.yaml"


def documented_commands() -> list[tuple[list[str], str]]:
    """(argv, comment) for each indented `peerpods ...` line after the set-up section."""
    after_setup = README.split("## What peerpods does", 1)[1]
    found = []
    for line in after_setup.splitlines():
        match = re.match(r"^    peerpods (.*?)(?:\s+#\s*(.*))?$", line)
        if match:
            found.append((shlex.split(match[1]), match[2] or ""))
    return found


def _ids(value: object) -> str:
    return " ".join(value) if isinstance(value, list) else ""


def test_setup_section_keeps_its_commands() -> None:
    setup = README.split("## Set up", 1)[1].split("\n## ", 1)[0]
    assert f"\n    {SETUP}\n" in setup
    assert "\n    ./tests/run\n" in setup


@pytest.mark.parametrize(
    ("argv", "comment"),
    documented_commands(),
    ids=_ids,
)
def test_documented_command_runs(
    capsys: pytest.CaptureFixture[str], argv: list[str], comment: str
) -> None:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    # a comment naming an instance type or price must be what the command prints
    for claim in re.findall(r"[a-z][a-z0-9]*[.-][a-z0-9-]+|\$[0-9.]+/h", comment):
        assert claim in out, (claim, out[:400])


def test_documented_commands_cover_plan_and_select() -> None:
    commands = {argv[0] for argv, _ in documented_commands()}
    assert {"plan", "select"} <= commands
