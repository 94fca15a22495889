"""The operator's surface of `peerpods`: log flags before or after the subcommand and through
their env twins, plan's exit codes, --version."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptor.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PEERPODS_")}
    return subprocess.run(
        [sys.executable, "-m", "adaptor.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **(env or {})},
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--log-level", "debug", "--log-format", "text", "select", "--provider", "aws"],
        ["select", "--provider", "aws", "--log-level", "debug", "--log-format", "text"],
    ],
)
def test_log_flags_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.log_level, args.log_format) == ("debug", "text")


def test_log_flags_env_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PEERPODS_LOG_LEVEL", "warning")
    monkeypatch.setenv("PEERPODS_LOG_FORMAT", "text")
    args = build_parser().parse_args(["select", "--provider", "aws"])
    assert (args.log_level, args.log_format) == ("warning", "text")
    given = build_parser().parse_args(["select", "--provider", "aws", "--log-level", "error"])
    assert given.log_level == "error"
    logging.getLogger().handlers.clear()


def test_plan_exit_codes(tmp_path: Path) -> None:
    missing = run("plan", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"peerpods plan: {tmp_path / 'nope.yaml'}: cannot read it: No such file or directory"
    ]
    unreadable = tmp_path / "secret.yaml"
    unreadable.write_text("kind: Pod\n")
    unreadable.chmod(0)
    if os.access(unreadable, os.R_OK):  # root reads anything
        unreadable = tmp_path  # a directory stands in: also unreadable as a manifest
    assert run("plan", str(unreadable)).returncode == 2
    good = ROOT / "config" / "examples" / "gpu-pod.yaml"
    assert run("plan", str(good), "--output", "json").returncode == 0


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("peerpods ")


def test_plan_json_is_json() -> None:
    done = run("plan", str(ROOT / "config" / "examples" / "gpu-pod.yaml"), "--output", "json")
    assert json.loads(done.stdout)
