"""scripts/build-image drives podman, buildah or docker with the same build: the Containerfile,
the tag, the build arguments, global engine options before the build command and extra arguments
after it. Checked with stand-in engines that record how they were called."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "build-image"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def stand_in(directory: Path, name: str) -> Path:
    engine = directory / name
    engine.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{directory}/{name}.args"\n')
    engine.chmod(0o755)
    return engine


def build(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    clean = {k: v for k, v in os.environ.items() if k not in ("ENGINE", "ENGINE_OPTS", "IMAGE")}
    clean["PATH"] = f"{tmp_path}{os.pathsep}{clean['PATH']}"
    done = subprocess.run(
        [str(SCRIPT), *args], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    return done, tmp_path


@pytest.mark.parametrize("engine", ["podman", "buildah", "docker"])
def test_each_engine_gets_the_same_build(tmp_path: Path, engine: str) -> None:
    stand_in(tmp_path, engine)
    done, _ = build(
        tmp_path,
        "--engine", engine, "--tag", "registry.example.com/peerpods:1", "--base", "debian:x",
        "--extras", "aws", "--", "--isolation", "chroot",
        ENGINE_OPTS="--storage-driver vfs",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "registry.example.com/peerpods:1\n"
    called = (tmp_path / f"{engine}.args").read_text().splitlines()
    command = {"buildah": "bud", "podman": "build", "docker": "build"}[engine]
    assert called[:3] == ["--storage-driver", "vfs", command]
    assert called[-3:] == ["--isolation", "chroot", str(ROOT)]
    assert ["-f", str(ROOT / "Containerfile")] == called[3:5]
    pairs = {called[i + 1] for i, a in enumerate(called) if a == "--build-arg"}
    assert pairs == {"EXTRAS=aws", f"VERSION={VERSION}", "BASE=debian:x"}
    assert called[called.index("-t") + 1] == "registry.example.com/peerpods:1"


def test_defaults_the_tag_to_the_package_version(tmp_path: Path) -> None:
    stand_in(tmp_path, "podman")
    done, _ = build(tmp_path, "--engine", "podman")
    assert done.stdout == f"ghcr.io/peerpods/peerpods:{VERSION}\n"
    called = (tmp_path / "podman.args").read_text().splitlines()
    assert "EXTRAS=all" in called and not any(a.startswith("BASE=") for a in called)


def test_refuses_an_unknown_engine_or_argument(tmp_path: Path) -> None:
    stand_in(tmp_path, "nerdctl")
    done, _ = build(tmp_path, "--engine", "nerdctl")
    assert done.returncode == 2 and "unknown engine" in done.stderr
    done, _ = build(tmp_path, "--frobnicate")
    assert done.returncode == 2 and "unknown argument --frobnicate" in done.stderr
