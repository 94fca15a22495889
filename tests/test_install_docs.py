"""docs/install.md's node set-up agrees with the code: both Kata shims' remote configurations let
through every hypervisor annotation the contract writes or reads and dial the adaptor's default
socket; containerd's runtime handler is the RuntimeClass's and its pod_annotations glob passes the
device plan; the permission files and the pod VM docs it points at exist."""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import yaml

from providers.core import contract

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ROOT / "docs" / "install.md"
TEXT = INSTALL.read_text()
BLOCKS: list[dict[str, Any]] = [
    tomllib.loads(block) for block in re.findall(r"```toml\n(.*?)```", TEXT, flags=re.S)
]
# Hypervisor annotations the webhook writes and the adaptor reads, by Kata's short name.
CONTRACT_KEYS = {
    key.removeprefix(contract.KATA_HYPERVISOR_PREFIX)
    for key in (
        contract.DEFAULT_VCPUS,
        contract.DEFAULT_MEMORY,
        contract.DEFAULT_GPUS,
        contract.DEFAULT_GPU_MODEL,
        contract.MACHINE_TYPE,
        contract.IMAGE,
    )
}


def kata_configs() -> list[dict[str, Any]]:
    return [b for b in BLOCKS if "remote" in b.get("hypervisor", {})]


def containerd_runtimes() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for block in BLOCKS:
        for plugin in block.get("plugins", {}).values():
            found += list(plugin.get("containerd", {}).get("runtimes", {}).items())
    return found


def test_both_shims_are_configured() -> None:
    configs = kata_configs()
    assert len(configs) == 2, "one remote configuration for the Go runtime, one for runtime-rs"
    assert any(c["runtime"].get("hypervisor_name") == "remote" for c in configs)  # runtime-rs


def test_enable_annotations_let_the_contract_through() -> None:
    for config in kata_configs():
        allowed = config["hypervisor"]["remote"]["enable_annotations"]
        for key in sorted(CONTRACT_KEYS):
            assert any(re.fullmatch(pattern, key) for pattern in allowed), (key, allowed)


def test_the_shims_dial_the_adaptors_socket() -> None:
    from adaptor.cli.main import build_parser

    socket = str(build_parser().parse_args(["serve"]).socket)
    for config in kata_configs():
        assert config["hypervisor"]["remote"]["remote_hypervisor_socket"] == socket


def test_containerd_runtime_is_the_runtime_class_handler() -> None:
    handler = yaml.safe_load((ROOT / "config" / "deploy" / "runtimeclass.yaml").read_text())
    runtimes = containerd_runtimes()
    assert len(runtimes) == 2, "containerd 1.7 and 2.x"
    for name, runtime in runtimes:
        assert name == handler["handler"]
        assert runtime["options"]["ConfigPath"].endswith(".toml")
        # containerd matches with Go's path.Match: `*` never crosses "/" (the key has none)
        assert "/" not in contract.DEVICES
        globs = runtime["pod_annotations"]
        assert any(fnmatchcase(contract.DEVICES, glob) for glob in globs), globs
        for key in CONTRACT_KEYS:
            full = contract.KATA_HYPERVISOR_PREFIX + key
            assert any(fnmatchcase(full, glob) for glob in globs), (full, globs)


def test_linked_files_exist() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", TEXT)
    assert any(link.endswith("podvm.md") for link in links)
    assert sum("config/permissions/" in link for link in links) == 3
    for link in links:
        if "://" not in link:
            assert (INSTALL.parent / link).resolve().exists(), link


def test_readme_points_a_cluster_install_at_these_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    deploy = readme[readme.index("Deploy to a cluster") :].split("kubectl apply -k")[0]
    assert "[docs/install.md](docs/install.md)" in deploy
    for need in ("scripts/build-image", "Kata", "pod VM image", "config/permissions/"):
        assert need in deploy, need
