"""The wheel is complete: built from a clean copy of the repository, installed (not editable) into
a fresh virtual environment, and run from a directory that holds nothing of the source tree, its
`peerpods` selects and plans on the bundled catalogs (package data, found through
importlib.resources), validates CDI specs, starts the webhook's and the daemon's argument parsing
and reports the version its metadata carries."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.test_readme import clean_copy

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "config" / "examples").glob("*.yaml"))
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# What a working wheel must carry besides the modules.
PACKAGE_DATA = (
    "providers/snapshots/aws-us-east-1.json",
    "providers/snapshots/azure-eastus.json",
    "providers/snapshots/gcp-us-central1.json",
    "providers/snapshots/prices/aws-us-east-1.csv",
    "adaptor/ttrpc/protos/hypervisor.proto",
    "adaptor/ttrpc/gen/agent_pb2.py",
    "adaptor/py.typed",
    "providers/py.typed",
    "webhook/py.typed",
)
CDI_SPEC = """\
cdiVersion: "0.5.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - path: /dev/nvidia0
          type: c
          major: 195
          minor: 0
"""


def build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    clean_copy(source)
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(dist), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    shutil.rmtree(source)  # nothing of the source tree is left to be found by accident
    (wheel,) = dist.glob("peerpods-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """(venv, an unrelated working directory, the environment to run in)."""
    if shutil.which("git") is None:
        pytest.skip("git is needed to know the repository's files")
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp)
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in PACKAGE_DATA if name not in names]
    assert not missing, f"the wheel lacks {missing}"
    # every file the packages track, data included: a new kind of data file needs package-data
    tracked = subprocess.run(
        ["git", "ls-files", "adaptor", "providers", "webhook"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    left_out = sorted(set(tracked) - names)
    assert not left_out, f"tracked package files not in the wheel: {left_out}"
    assert not any(n.startswith(("tests/", "config/", "scripts/")) for n in names)
    # The three package names are generic: the wheel installs nothing else at the top level.
    top = {
        name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")
    }
    assert top == {"adaptor", "providers", "webhook"}, (
        f"unexpected top-level entries: {sorted(top)}"
    )
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PEERPODS_", "VIRTUAL_ENV", "PYTHON"))
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    for example in EXAMPLES:
        shutil.copy(example, elsewhere / example.name)
    (elsewhere / "gpu.yaml").write_text(CDI_SPEC)
    (elsewhere / "bad.yaml").write_text(CDI_SPEC.replace('"0.5.0"', '"9.9.9"'))
    return venv, elsewhere, env


def peerpods(
    installed: tuple[Path, Path, dict[str, str]], *args: str
) -> subprocess.CompletedProcess[str]:
    venv, elsewhere, env = installed
    done = subprocess.run(
        [str(venv / "bin" / "peerpods"), *args],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


@pytest.mark.slow
def test_the_installed_package_is_the_wheel(installed: tuple[Path, Path, dict[str, str]]) -> None:
    venv, elsewhere, env = installed
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import adaptor, providers, webhook; "
         "print(adaptor.__file__, providers.__file__, webhook.__file__)"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    for path in done.stdout.split():
        assert Path(path).is_relative_to(venv), done.stdout


@pytest.mark.slow
def test_version_agrees_with_the_package_metadata(
    installed: tuple[Path, Path, dict[str, str]],
) -> None:
    venv, elsewhere, env = installed
    metadata = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.metadata as m; print(m.version('peerpods'))"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    assert metadata == VERSION
    done = peerpods(installed, "--version")
    assert done.returncode == 0 and done.stdout == f"peerpods {VERSION}\n", done


@pytest.mark.slow
def test_select_reads_the_bundled_catalogs(installed: tuple[Path, Path, dict[str, str]]) -> None:
    for provider in ("aws", "azure", "gcp"):
        done = peerpods(installed, "select", "--provider", provider, "--gpus", "1", "--output",
                        "json")  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["selected"], done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("example", [e.name for e in EXAMPLES])
def test_plan_every_example(installed: tuple[Path, Path, dict[str, str]], example: str) -> None:
    done = peerpods(installed, "plan", example, "--output", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)


@pytest.mark.slow
def test_cdi_validate(installed: tuple[Path, Path, dict[str, str]]) -> None:
    assert peerpods(installed, "cdi", "validate", "gpu.yaml").returncode == 0
    bad = peerpods(installed, "cdi", "validate", "bad.yaml")
    assert bad.returncode != 0 and "bad.yaml" in bad.stdout + bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", ["webhook", "serve"])
def test_daemons_parse_their_flags(
    installed: tuple[Path, Path, dict[str, str]], command: str
) -> None:
    done = peerpods(installed, command, "--help")
    assert done.returncode == 0 and "--provider" in done.stdout, done.stderr


@pytest.mark.slow
def test_a_cloud_without_its_sdk_says_which_extra(
    installed: tuple[Path, Path, dict[str, str]],
) -> None:
    """Installed without extras: serving a cloud names its extra in one line, writing nothing."""
    _, elsewhere, _ = installed
    state = elsewhere / "serve"
    done = peerpods(
        installed, "serve", "--provider", "aws", "--aws-region", "us-east-1",
        "--pod-vm-image", "ami-0a1b2c3d4e5f60718", f"--socket={state}/h.sock",
        f"--pods-dir={state}/pods", f"--state-dir={state}/state", "--status-address=",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "pip install 'peerpods[aws]'" in done.stderr
    assert not state.exists()
