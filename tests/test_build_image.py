"""scripts/build-image drives podman, buildah or docker with the same build: the Containerfile,
the tag, the build arguments, global engine options before the build command and extra arguments
after it. Checked with stand-in engines that record how they were called."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

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
    keep = ["botocore/data/ec2/2016-11-15/service-2.json.gz", "botocore/data/sts/x.json",
            "botocore/data/service-quotas/x.json", "botocore/data/endpoints.json.gz",
            "boto3/__init__.py", "azure/mgmt/compute/models/x.py"]  # fmt: skip
    gone = ["botocore/data/s3/x.json", "azure/mgmt/compute/aio/x.py", "somepkg/tests/test_x.py",
            "grpc_tools/protoc.py", "google/cloud/compute/__init__.py"]  # fmt: skip
    for name in keep + gone:
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(b"x" * 1024)
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "prune-venv.py"), str(site)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # kept (a Python source as its bytecode: test_prune_venv_ships_the_dependencies_as_bytecode)
    assert [n for n in keep if not (site / n).exists() and not _compiled(site / n)] == []
    assert [n for n in gone if (site / n).exists() or _compiled(site / n)] == []
    assert (site / "somepkg").is_dir()
    assert done.stdout.startswith("prune-venv: 0 MiB removed")
    usage = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "prune-venv.py")], capture_output=True, timeout=60
    )
    assert usage.returncode == 2 and b"usage" in usage.stderr


COMPUTE_INIT = """\
__lazy_modules__ = {
    "google.cloud.compute_v1.services.disks",
    "google.cloud.compute_v1.services.instances",
}
from .services.disks import (
    DisksClient,
)
from .services.instances import InstancesClient
from .services.zone_operations import ZoneOperationsClient
from .types.compute import Instance

__all__ = (
    "DisksClient",
    "Instance",
    "InstancesClient",
    "ZoneOperationsClient",
)
"""


def test_prune_venv_keeps_the_compute_clients_peerpods_creates(tmp_path: Path) -> None:
    """google-cloud-compute's clients of other APIs go, with their names in the package's
    __init__; a kept client's own imports of other services keep those; the rest imports."""
    package = tmp_path / "google" / "cloud" / "compute_v1"
    files = {
        "__init__.py": COMPUTE_INIT,
        "types/__init__.py": "",
        "types/compute.py": "class Instance: ...\n",
        "services/__init__.py": "",
        "services/disks/__init__.py": "from .client import DisksClient\n",
        "services/disks/client.py": "class DisksClient: ...\n",
        "services/instances/__init__.py": "from .client import InstancesClient\n",
        "services/instances/client.py": (
            "from google.cloud.compute_v1.services import zone_operations\n"
            "class InstancesClient: ...\n"
        ),
        "services/zone_operations/__init__.py": "from .client import ZoneOperationsClient\n",
        "services/zone_operations/client.py": "class ZoneOperationsClient: ...\n",
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    module = _prune_module()
    kept = module.prune_compute_services(package, frozenset({"instances", "regions"}))
    assert kept == {"instances", "zone_operations"}
    assert sorted(p.name for p in (package / "services").iterdir()) == [
        "__init__.py", "instances", "zone_operations",
    ]  # fmt: skip
    init = (package / "__init__.py").read_text()
    assert "Disks" not in init and "disks" not in init
    done = subprocess.run(
        [sys.executable, "-c", "from google.cloud import compute_v1 as c; print(*c.__all__)"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert done.stdout == "Instance InstancesClient ZoneOperationsClient\n", done.stderr


def test_prune_venv_keeps_the_network_interfaces_peerpods_calls(tmp_path: Path) -> None:
    """azure-mgmt-network loses its other operation groups (classes, request builders, the
    client's attributes for them); the provider's create-and-delete, which reads and deletes the
    VM's NIC through it, still passes on the pruned copy."""
    network = pytest.importorskip("azure.mgmt.network")
    package = tmp_path / "azure" / "mgmt" / "network"
    shutil.copytree(Path(network.__file__).parent, package, ignore=shutil.ignore_patterns("aio"))
    gone = _prune_module().prune_network_operations(
        package, frozenset({"NetworkInterfacesOperations"})
    )
    assert "ApplicationGatewaysOperations" in gone and "NetworkInterfacesOperations" not in gone
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    probe = (
        "import azure.mgmt.network as n, pathlib; from azure.mgmt.network import "
        "NetworkManagementClient as C; c = C(object(), 's'); "
        "print(pathlib.Path(n.__file__).is_relative_to(pathlib.Path.cwd()), "
        "hasattr(c, 'network_interfaces'), hasattr(c, 'application_gateways'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env=env,
    )  # fmt: skip
    assert done.stdout == "True True False\n", done.stderr
    test = "tests/clouds/test_azure.py::test_create_and_delete_with_checked_request_body"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-2000:]


def test_prune_venv_strips_debug_information_and_the_module_still_imports(tmp_path: Path) -> None:
    """uvloop's wheel ships its extension with debug information (12 MB of its 14)."""
    import uvloop

    site = tmp_path / "site-packages"
    shutil.copytree(Path(uvloop.__file__).parent, site / "uvloop")
    (extension,) = (site / "uvloop").glob("loop.*.so")
    before = extension.stat().st_size
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "prune-venv.py"), str(site)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(site)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("; 1 modules import\n"), done.stdout  # imported from the copy
    assert b".debug_info" not in extension.read_bytes()
    assert extension.stat().st_size < before / 2


def test_prune_venv_ships_the_dependencies_as_bytecode(tmp_path: Path) -> None:
    """One copy of the code (bytecode, where Python imports it with no source beside it); pip,
    which installs peerpods afterwards, keeps its sources; what does not compile stays."""
    site = tmp_path / "site-packages"
    files = {
        "dep/__init__.py": "VALUE = 1\n",
        "dep/sub.py": "def answer() -> int:\n    return 42\n",
        "dep/template.py": "this is not Python {{ }}\n",
        "pip/__init__.py": "",
        "single.py": "NAME = 'single'\n",
    }
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    (site / "dep" / "__pycache__").mkdir()
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "prune-venv.py"), str(site)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    left = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert left == [
        "dep/__init__.pyc", "dep/sub.pyc", "dep/template.py", "pip/__init__.py", "single.pyc",
    ]  # fmt: skip
    imported = subprocess.run(
        [sys.executable, "-B", "-c", "import dep.sub as d, single as s; print(d.answer(), s.NAME)"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(site)},
    )  # fmt: skip
    assert imported.stdout == "42 single\n", imported.stderr


def _compiled(source: Path) -> bool:
    return source.suffix == ".py" and source.with_suffix(".pyc").exists()


def _prune_module() -> Any:
    spec = importlib.util.spec_from_file_location("prune_venv", ROOT / "scripts" / "prune-venv.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
