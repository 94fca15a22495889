"""README's two set-up commands, run as written in a fresh virtual environment on a clean copy of
the repository: the install-and-run command must print a decision with no cloud and no cluster,
and the test command must install what it needs and pass (run here on one small test file, so
the suite does not run itself recursively)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMOKE_TEST = "tests/test_guard.py"


def readme_commands() -> tuple[str, str]:
    """The indented command following "Install and run" and the one following "Run the tests"."""
    text = (ROOT / "README.md").read_text()
    commands = re.findall(
        r"\n\n    (\S[^\n]*)\n", text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    )
    assert len(commands) == 2, f"README's Set up section must hold two commands, found {commands}"
    return commands[0], commands[1]


def clean_copy(target: Path) -> None:
    """What a clean clone holds: the tracked files (plus untracked, not ignored, ones)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / name.decode()
        if source.is_file():
            destination = target / name.decode()
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)


@pytest.mark.slow
def test_readme_commands_work_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is needed to know the repository's files")
    run_command, test_command = readme_commands()
    repo = tmp_path / "repo"
    clean_copy(repo)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PEERPODS_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env.pop("PYTHONPATH", None)

    ran = subprocess.run(
        ["bash", "-c", run_command], cwd=repo, env=env, capture_output=True, text=True, timeout=900
    )
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-4000:]
    assert "Traceback" not in ran.stderr
    # pip may print its index configuration first; the plan starts with the pod line
    lines = ran.stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("pod default/cuda-vectoradd")]
    assert starts, ran.stdout
    lines = lines[starts[0] :]
    assert lines[0].startswith("pod default/cuda-vectoradd  (aws us-east-1"), ran.stdout
    assert any(line.split() == ["cuda", "peerpods.io/gpu=gpu0"] for line in lines), ran.stdout

    tested = subprocess.run(
        ["bash", "-c", f"{test_command} {SMOKE_TEST} -q -p no:cacheprovider"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-3000:]
    assert re.search(r"\b2 passed\b", tested.stdout), tested.stdout[-2000:]
