"""scripts/build-image drives podman, buildah or docker with the same build: the Containerfile,
the tag, the build arguments, global engine options before the build command and extra arguments
after it. Checked with stand-in engines that record how they were called."""

from __future__ import annotations

import os
import subprocess
import sys
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


@pytest.mark.parametrize("cloud", ["aws", "azure", "gcp"])
def test_one_clouds_image_has_its_sdk_only(tmp_path: Path, cloud: str) -> None:
    stand_in(tmp_path, "podman")
    done, _ = build(tmp_path, "--engine", "podman", "--cloud", cloud)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"ghcr.io/peerpods/peerpods:{VERSION}-{cloud}\n"
    called = (tmp_path / "podman.args").read_text().splitlines()
    assert f"EXTRAS={cloud}" in called and "EXTRAS=all" not in called
    done, _ = build(tmp_path, "--engine", "podman", "--cloud", "tpu")
    assert done.returncode == 2 and "unknown cloud tpu" in done.stderr


def test_prune_venv_removes_only_what_peerpods_never_imports(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    keep = ["kubernetes/client/api.py", "botocore/data/ec2/2016-11-15/service-2.json.gz",
            "botocore/data/sts/x.json", "botocore/data/endpoints.json.gz", "boto3/__init__.py",
            "azure/mgmt/compute/models/x.py"]  # fmt: skip
    gone = ["kubernetes/aio/client.py", "aiohttp/__init__.py", "botocore/data/s3/x.json",
            "azure/mgmt/compute/aio/x.py", "somepkg/tests/test_x.py"]  # fmt: skip
    for name in keep + gone:
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(b"x" * 1024)
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "prune-venv.py"), str(site)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [n for n in keep if not (site / n).exists()] == []
    assert [n for n in gone if (site / n).exists()] == []
    assert not (site / "kubernetes" / "aio").exists() and (site / "somepkg").is_dir()
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "prune-venv.py")], capture_output=True, timeout=60
    )
    assert done.returncode == 2 and b"usage" in done.stderr
