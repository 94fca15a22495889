"""What the `kata-remote` runtime handler looks like in containerd's configuration, per
configuration version and containerd version, and which nydus snapshotter it uses.

- Version 3 (containerd 2.x) merges imported files key by key: a drop-in holds the runtime, the
  image service's per-runtime snapshotter (`runtime_platforms`, which the image pull reads) and
  `disable_snapshot_annotations = false` in the images plugin (2.x defaults to true).
- Version 2 (containerd 1.6 and 1.7): an imported file replaces a plugin's whole section, so a
  drop-in would freeze the main file's CRI section as it was at install time and hide runtimes
  added to it later. The runtime goes into the main file itself, as marked lines that uninstall
  takes out again.
- containerd 1.6 has no per-runtime snapshotter (it drops the key without a word): a guest pull
  cannot be configured there, and the installer says so rather than write a runtime whose images
  would be unpacked on the node.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from adaptor.node import goglob
from adaptor.node.hostpath import HostPathError, resolve
from adaptor.toml.edit import Edit

CRI_V2 = "io.containerd.grpc.v1.cri"  # containerd 1.x, config version 2
CRI_V3 = "io.containerd.cri.v1.runtime"  # containerd 2.x, config version 3
IMAGES_V3 = "io.containerd.cri.v1.images"
# kata-deploy >= 3.29 runs its nydus-snapshotter for guest pull under this name, as containerd's
# proxy plugin, the systemd unit and the socket's directory alike.
KATA_DEPLOY_NYDUS = "nydus-for-kata-tee"
NYDUS_SOCKET = "containerd-nydus-grpc.sock"
# nydus-snapshotter's own default socket (a `nydus` installed by hand or by its DaemonSet)
NYDUS_DEFAULT_ADDRESS = "/run/containerd-nydus/containerd-nydus-grpc.sock"
_VERSION = re.compile(r"(?<![\w.])v?(\d+)\.(\d+)\.\d+")


class ContainerdError(ValueError):
    """containerd's configuration cannot carry the runtime as asked."""


@dataclass(frozen=True)
class Runtime:
    """The runtime handler: what containerd is told, whatever the file's layout."""

    handler: str
    runtime_type: str
    runtime_path: str
    config_path: str
    pod_annotations: tuple[str, ...]
    snapshotter: str  # '' for containerd's default
    declare_address: str  # the proxy plugin to declare ('' when declared already)


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from `containerd --version` output or a version like '1.7'."""
    found = _VERSION.search(text) or re.fullmatch(r"v?(\d+)\.(\d+)", text.strip())
    return (int(found.group(1)), int(found.group(2))) if found else None


def ask_version(command: str) -> tuple[int, int] | None:
    """containerd's version from `command` (e.g. `containerd --version` in the host's mount
    namespace); None when it cannot be run or says nothing readable."""
    if not command:
        return None
    try:
        done = subprocess.run(
            shlex.split(command), capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return parse_version(done.stdout) if done.returncode == 0 else None


def imported(main_path: PurePosixPath, imports: list[str], root: Path) -> list[PurePosixPath]:
    """The host files containerd imports, as it resolves them (relative to the main file's
    directory; globbed only when the path has a `*`, with Go's glob rules)."""
    out: list[PurePosixPath] = []
    for entry in imports:
        path = PurePosixPath(entry)
        if not path.is_absolute():
            path = main_path.parent / path
        if not goglob.is_glob(str(path)):
            out.append(path)
            continue
        directory = PurePosixPath("/")
        for part in path.parent.parts[1:]:
            if goglob.is_glob(part):
                break  # a glob in a directory part: not expanded here
            directory = directory / part
        else:
            try:
                folder = resolve(root, directory)
                names = sorted(p.name for p in folder.iterdir())
            except (OSError, HostPathError):
                continue
            out.extend(directory / n for n in names if goglob.match(str(path), str(directory / n)))
    return out


def covers(main_path: PurePosixPath, imports: list[str], dropin: PurePosixPath) -> bool:
    """Whether containerd would read `dropin` through one of `imports` (it exists by then)."""
    for entry in imports:
        path = PurePosixPath(entry)
        if not path.is_absolute():
            path = main_path.parent / path
        if goglob.is_glob(str(path)):
            try:
                if goglob.match(str(path), str(dropin)):
                    return True
            except goglob.BadPattern:
                raise ContainerdError(f"imports: {entry!r} is not a valid glob") from None
        elif path == dropin:
            return True
    return False


def proxy_snapshotters(documents: list[Mapping[str, Any]]) -> dict[str, str]:
    """Snapshotter proxy plugins the files declare: name -> socket."""
    found: dict[str, str] = {}
    for document in documents:
        plugins = document.get("proxy_plugins", {})
        if not isinstance(plugins, Mapping):
            continue
        for name, plugin in plugins.items():
            if isinstance(plugin, Mapping) and plugin.get("type") == "snapshot":
                found[name] = str(plugin.get("address", ""))
    return found


def runtimes(document: Mapping[str, Any]) -> set[str]:
    """The CRI runtime handlers a configuration file names (either version's layout)."""
    names: set[str] = set()
    plugins = document.get("plugins", {})
    for plugin in (CRI_V2, CRI_V3):
        table: Any = plugins.get(plugin, {}) if isinstance(plugins, Mapping) else {}
        for part in ("containerd", "runtimes"):
            table = table.get(part, {}) if isinstance(table, Mapping) else {}
        if isinstance(table, Mapping):
            names.update(table)
    return names


def choose_snapshotter(asked: str, address: str, declared: Mapping[str, str]) -> tuple[str, str]:
    """(snapshotter name, address to declare or '') for `--snapshotter` `asked`.

    'auto' takes a nydus the node declares already (kata-deploy's first), else kata-deploy's
    name and socket; a name that is not declared is declared at `address` or its usual socket.
    """
    if not asked:
        return "", ""
    if asked == "auto":
        nydus = sorted(n for n in declared if n.startswith("nydus"))
        if KATA_DEPLOY_NYDUS in declared:
            return KATA_DEPLOY_NYDUS, ""
        if nydus:
            return nydus[0], ""
        asked = KATA_DEPLOY_NYDUS
    if asked in declared:
        return asked, ""
    if not address:
        address = NYDUS_DEFAULT_ADDRESS if asked == "nydus" else f"/run/{asked}/{NYDUS_SOCKET}"
    return asked, address


def check_versions(
    config_version: int, containerd: tuple[int, int] | None, snapshotter: str
) -> None:
    """Refuse what the running containerd would not do with this file."""
    if containerd is not None and containerd < (2, 0) and config_version == 3:
        raise ContainerdError(
            f"containerd {containerd[0]}.{containerd[1]} cannot read a version 3 configuration"
        )
    if not snapshotter or containerd is None:
        return
    if containerd < (1, 7):
        raise ContainerdError(
            f"containerd {containerd[0]}.{containerd[1]} has no per-runtime snapshotter (1.7 "
            f"added it; 1.6 drops the key without a word), so {snapshotter} would never pull "
            "kata-remote images in the pod VM: upgrade containerd to 1.7 or 2.x, or install "
            "with --snapshotter '' if images reach the pod VM another way"
        )
    if containerd >= (2, 0) and config_version == 2:
        raise ContainerdError(
            "containerd 2.x migrates a version 2 configuration, and a migrated file cannot name "
            "the image service's per-runtime snapshotter (runtime_platforms), so images would be "
            "pulled on the node: migrate the file first (`containerd config migrate`)"
        )


def _runtime_table(runtime: Runtime) -> dict[str, Any]:
    table: dict[str, Any] = {
        "runtime_type": runtime.runtime_type,
        "runtime_path": runtime.runtime_path,
        "pod_annotations": list(runtime.pod_annotations),
        "privileged_without_host_devices": True,
    }
    if runtime.snapshotter:
        table["snapshotter"] = runtime.snapshotter
    return table


def dropin_v3(runtime: Runtime) -> dict[str, Any]:
    """The version 3 drop-in: merged key by key into the main file by containerd 2.x."""
    table = _runtime_table(runtime)
    table["options"] = {"ConfigPath": runtime.config_path}
    document: dict[str, Any] = {"version": 3}
    if runtime.declare_address:
        document["proxy_plugins"] = {
            runtime.snapshotter: {"type": "snapshot", "address": runtime.declare_address}
        }
    plugins: dict[str, Any] = {}
    if runtime.snapshotter:
        # the image pull reads these: the runtime's snapshotter alone is not enough in 2.x
        plugins[IMAGES_V3] = {
            "disable_snapshot_annotations": False,
            "runtime_platforms": {runtime.handler: {"snapshotter": runtime.snapshotter}},
        }
    plugins[CRI_V3] = {"containerd": {"runtimes": {runtime.handler: table}}}
    document["plugins"] = plugins
    return document


def edits_v2(runtime: Runtime) -> list[Edit]:
    """The keys set in a version 2 main file (containerd 1.7, or 1.6 without a snapshotter)."""
    base = ("plugins", CRI_V2, "containerd")
    table = (*base, "runtimes", runtime.handler)
    edits: list[Edit] = []
    if runtime.snapshotter:
        # the snapshotter reads the image reference from these labels
        edits.append(Edit(base, "disable_snapshot_annotations", False))
    edits.extend(Edit(table, key, value) for key, value in _runtime_table(runtime).items())
    edits.append(Edit((*table, "options"), "ConfigPath", runtime.config_path))
    if runtime.declare_address:
        proxy = ("proxy_plugins", runtime.snapshotter)
        edits.append(Edit(proxy, "type", "snapshot"))
        edits.append(Edit(proxy, "address", runtime.declare_address))
    return edits
