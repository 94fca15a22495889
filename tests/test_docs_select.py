"""Every whole `peerpods select ...` command docs/gpus.md quotes inline runs and selects a type
(the MI300X example needs `--provider azure`: AWS's catalog has no MI300X, the command failed)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from adaptor.cli.main import main

GPUS = Path(__file__).resolve().parent.parent / "docs" / "gpus.md"


def quoted_commands() -> list[str]:
    text = re.sub(r"\n\s*", " ", GPUS.read_text())  # a command may wrap across lines
    return list(re.findall(r"`peerpods (select [^`]+)`", text))


def test_the_mi300x_example_names_its_provider() -> None:
    assert "select --provider azure --gpu-model mi300x" in quoted_commands()


@pytest.mark.parametrize("command", quoted_commands())
def test_a_quoted_select_command_selects(capsys: pytest.CaptureFixture[str], command: str) -> None:
    code = main(shlex.split(command))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith("selected: ")
