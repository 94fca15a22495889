"""The cloud permission files under config/permissions grant exactly what the code calls.

The calls are found in the providers' and catalog loaders' source (scripts/gen_permissions.py
reads it and checks every name against the SDK's own operations); each found call must have its
permissions in that cloud's file, and the file may grant nothing no call needs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_permissions", ROOT / "scripts" / "gen_permissions.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_permissions", module)
    spec.loader.exec_module(module)
    return module


gen = _generator()
CLOUDS = ["aws", "azure", "gcp"]
# Calls the lifecycle cannot do without: a scan that misses them is broken, not the code.
CORE = {
    "aws": {"RunInstances", "TerminateInstances", "DescribeInstances", "DescribeInstanceTypes"},
    "azure": {
        "compute.virtual_machines.begin_create_or_update",
        "compute.virtual_machines.begin_delete",
        "compute.resource_skus.list",
    },
    "gcp": {"InstancesClient.insert", "InstancesClient.delete", "MachineTypesClient.list"},
}


@pytest.fixture(autouse=True)
def _sdks() -> None:
    for module in ("botocore", "azure.mgmt.compute", "azure.mgmt.network", "google.cloud.compute"):
        pytest.importorskip(module)


@pytest.mark.parametrize("cloud", CLOUDS)
def test_the_scan_finds_the_lifecycle_calls(cloud: str) -> None:
    assert CORE[cloud] <= gen.calls(cloud)


@pytest.mark.parametrize("cloud", CLOUDS)
def test_every_call_is_granted_and_nothing_else(cloud: str) -> None:
    granted = gen.read_file(cloud)
    needed: set[str] = set()
    for call in sorted(gen.calls(cloud)):
        wanted = set(gen.TABLES[cloud][call])
        assert wanted <= granted, f"{cloud}: {call} needs {sorted(wanted - granted)}"
        needed |= wanted
    assert granted == needed, f"{cloud}: granted but never needed: {sorted(granted - needed)}"


def test_the_files_are_what_the_generator_writes() -> None:
    assert gen.main(["--check"]) == 0


def test_a_new_call_in_the_code_is_noticed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extra = tmp_path / "more_aws.py"
    extra.write_text("def snap(client):\n    return client.create_snapshot(VolumeId='v')\n")
    monkeypatch.setitem(gen.MODULES, "aws", (*gen.MODULES["aws"], str(extra)))
    assert "CreateSnapshot" in gen.calls("aws")
    with pytest.raises(gen.ScanError, match="CreateSnapshot"):
        gen.permissions("aws")
