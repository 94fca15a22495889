"""README stays true: its set-up command works from a copy of the tree installed into a new
virtual environment, and every `peerpods ...` command it shows runs and says what it claims."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

from adaptor.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SETUP = "pip install -e . && peerpods plan config/examples/gpu-pod.yaml"


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


def _copy_tree(target: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            destination = target / name.decode()
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to list the tree")
def test_setup_command_in_a_new_virtual_environment(tmp_path: Path) -> None:
    tree = tmp_path / "peerpods"
    _copy_tree(tree)
    env_dir = tmp_path / "venv"
    # the dependencies come from this interpreter (the suite runs offline); the package itself
    # is installed fresh, so the console script, the package data and the catalogs are tested
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    bin_dir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PEERPODS_")}
    environ.pop("PYTHONPATH", None)
    environ["PATH"] = f"{bin_dir}{os.pathsep}{environ.get('PATH', '')}"
    environ["VIRTUAL_ENV"] = str(env_dir)
    install = [
        str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps",
        "--no-build-isolation", "--no-index", "-e", ".",
    ]  # fmt: skip
    result = subprocess.run(
        [*install], cwd=tree, env=environ, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    command = SETUP.split("&&", 1)[1].split()
    result = subprocess.run(
        command, cwd=tree, env=environ, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert shutil.which("peerpods", path=str(bin_dir)) is not None
    lines = result.stdout.splitlines()
    assert lines[0].startswith("pod default/cuda-vectoradd  (aws us-east-1")
    assert any(line.split() == ["cuda", "nvidia.com/gpu=0"] for line in lines)
    assert "Traceback" not in result.stderr
