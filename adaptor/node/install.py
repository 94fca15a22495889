"""`peerpods node install|uninstall`: make a worker node able to run `kata-remote` pods, and undo
exactly that.

What it writes (host paths; the installer sees the host under --host-root):
- Kata's remote configuration (the shim's ConfigPath): the hypervisor socket `serve` listens on,
  the annotations the webhook writes, no network namespace or resources of its own.
- A containerd drop-in naming the `kata-remote` runtime handler. containerd 2.x (config version
  3) merges drop-ins key by key, so ours holds only the runtime. containerd 1.x (version 2)
  replaces a plugin's whole section with an imported one, so ours carries the main file's CRI
  section with the runtime added (rewritten at every install, so it follows the main file).
- The main config's `imports` gets the drop-in only when no pattern there covers it already.
- A record of every path written and its digest, so `uninstall` removes only files still as it
  wrote them, puts the `imports` line back as it found it, and removes directories it created.

Nothing is restarted unless --restart-command is given, and then only when containerd's
configuration changed (a new runtime is read at containerd's start).
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from adaptor.node.tomlwrite import dumps
from providers.core.errors import PeerpodsError

CRI_V2 = "io.containerd.grpc.v1.cri"  # containerd 1.x, config version 2
CRI_V3 = "io.containerd.cri.v1.runtime"  # containerd 2.x, config version 3
MARK = "# added by peerpods node install"
# The hypervisor keys the webhook writes and the adaptor reads, as plain names: the Go shim
# matches them as regexps, and a plain name means the same whichever way it is matched.
ANNOTATIONS = (
    "default_vcpus",
    "default_memory",
    "default_gpus",
    "default_gpu_model",
    "machine_type",
    "image",
    "cc_init_data",
)


class InstallError(PeerpodsError):
    """The node cannot be set up (or cleaned) as asked; nothing was changed."""


class NodeInstall(BaseModel):
    """Where things go on the host, and what the runtime handler looks like."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host_root: Path = Path("/")
    containerd_config: PurePosixPath = PurePosixPath("/etc/containerd/config.toml")
    dropin: PurePosixPath = PurePosixPath("/etc/containerd/conf.d/50-peerpods-kata-remote.toml")
    kata_config: PurePosixPath = PurePosixPath("/opt/peerpods/share/kata/configuration-remote.toml")
    record: PurePosixPath = PurePosixPath("/var/lib/peerpods/node-install.json")
    # a RuntimeClass handler: a DNS label (the RuntimeClass API's own rule)
    handler: str = Field("kata-remote", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    runtime_type: str = Field("io.containerd.kata.v2", pattern=r"^io\.containerd\.[\w.-]+\.v\d+$")
    # Kata's Go runtime or runtime-rs (the only one from Kata 4.1): their configurations differ
    shim: Literal["go", "rs"] = "go"
    shim_path: str = Field("", description="the shim binary ('': kata-deploy's for `shim`)")
    socket: str = "/run/peerpod/hypervisor.sock"
    snapshotter: str = Field("nydus", pattern=r"^[\w.-]*$")
    # nydus-snapshotter's socket (kata-deploy's path), declared to containerd as a proxy plugin
    nydus_address: str = "/run/containerd-nydus/containerd-nydus-grpc.sock"
    pod_annotations: tuple[str, ...] = ("io.katacontainers.*",)

    @field_validator("containerd_config", "dropin", "kata_config", "record")
    @classmethod
    def _absolute(cls, value: PurePosixPath) -> PurePosixPath:
        if not value.is_absolute() or ".." in value.parts:
            raise ValueError(f"{value} must be an absolute host path without '..'")
        return value

    @field_validator("shim_path", "socket", "nydus_address")
    @classmethod
    def _absolute_or_empty(cls, value: str) -> str:
        if value and not value.startswith("/"):
            raise ValueError(f"{value} must be an absolute path")
        return value

    @classmethod
    def build(cls, **fields: object) -> NodeInstall:
        """Validate; a bad value raises InstallError naming the setting."""
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "settings"
            message = str(first["msg"]).removeprefix("Value error, ")
            raise InstallError(f"{where}: {message}") from None

    def host(self, path: PurePosixPath) -> Path:
        """A host path as this process reaches it."""
        return self.host_root / path.relative_to("/")


@dataclass
class Outcome:
    """What an install or uninstall did."""

    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # changed by someone else: left alone
    containerd_changed: bool = False


SHIM_PATHS = {
    "go": "/opt/kata/bin/containerd-shim-kata-v2",
    "rs": "/opt/kata/runtime-rs/bin/containerd-shim-kata-v2",
}


def kata_configuration(settings: NodeInstall) -> dict[str, Any]:
    """Kata's remote hypervisor configuration (docs/install.md): the adaptor makes the VM,
    sized per pod, so the shim sizes nothing and makes no network of its own."""
    runtime: dict[str, Any] = {}
    if settings.shim == "rs":
        runtime = {"name": "virt_container", "hypervisor_name": "remote", "agent_name": "kata"}
    runtime.update(
        internetworking_model="none",
        # runtime-rs needs the pod's own netns to hand its path on; the Go shim must not make one
        disable_new_netns=settings.shim == "go",
        disable_guest_seccomp=True,
        static_sandbox_resource_mgmt=True,
    )
    return {
        "hypervisor": {
            "remote": {
                "remote_hypervisor_socket": settings.socket,
                "remote_hypervisor_timeout": 600,
                "enable_annotations": list(ANNOTATIONS),
            }
        },
        "runtime": runtime,
    }


def _runtime(settings: NodeInstall) -> dict[str, Any]:
    runtime: dict[str, Any] = {
        "runtime_type": settings.runtime_type,
        "pod_annotations": list(settings.pod_annotations),
        "privileged_without_host_devices": True,
    }
    runtime["runtime_path"] = settings.shim_path or SHIM_PATHS[settings.shim]
    if settings.snapshotter:
        runtime["snapshotter"] = settings.snapshotter  # containerd >= 1.7
    runtime["options"] = {"ConfigPath": str(settings.kata_config)}
    return runtime


def _proxy_plugins(settings: NodeInstall, main: Mapping[str, Any]) -> dict[str, Any]:
    """nydus-snapshotter as containerd's proxy plugin, unless the main file declares it."""
    declared = main.get("proxy_plugins", {})
    if settings.snapshotter != "nydus" or (isinstance(declared, Mapping) and "nydus" in declared):
        return {}
    return {"proxy_plugins": {"nydus": {"type": "snapshot", "address": settings.nydus_address}}}


def containerd_dropin(settings: NodeInstall, main: Mapping[str, Any]) -> dict[str, Any]:
    """The drop-in for the main config `main` (its version decides the layout)."""
    version = main.get("version", 1)
    if version == 3:
        runtimes = {settings.handler: _runtime(settings)}
        return {
            "version": 3,
            **_proxy_plugins(settings, main),
            "plugins": {CRI_V3: {"containerd": {"runtimes": runtimes}}},
        }
    if version != 2:
        raise InstallError(
            f"{settings.containerd_config}: config version {version!r} is not supported "
            "(containerd 1.7 writes version 2, containerd 2.x version 3)"
        )
    plugins = main.get("plugins", {})
    cri = copy.deepcopy(plugins.get(CRI_V2, {})) if isinstance(plugins, Mapping) else {}
    section = cri.setdefault("containerd", {})
    runtimes = section.setdefault("runtimes", {})
    # This section replaces containerd's defaults: keep its default runtime when the main file
    # left it implicit, or the CRI plugin refuses to load.
    default = section.get("default_runtime_name", "runc")
    if default not in runtimes:
        runtimes[default] = {"runtime_type": "io.containerd.runc.v2"}
    runtimes[settings.handler] = _runtime(settings)
    if settings.snapshotter:
        # the guest pull's snapshotter reads the image reference from these labels
        section["disable_snapshot_annotations"] = False
    return {"version": 2, **_proxy_plugins(settings, main), "plugins": {CRI_V2: cri}}


def _covered(settings: NodeInstall, imports: list[str]) -> bool:
    base = settings.containerd_config.parent
    target = str(settings.dropin)
    return any(fnmatch.fnmatchcase(target, str(base / pattern)) for pattern in imports)


_IMPORTS_LINE = re.compile(r"^imports\s*=\s*\[[^\]\n]*\]\s*(#.*)?$", re.MULTILINE)


def _with_import(settings: NodeInstall, text: str, main: Mapping[str, Any]) -> str | None:
    """The main config with the drop-in imported; None when it already is."""
    imports = main.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise InstallError(f"{settings.containerd_config}: imports is not a list of paths")
    if _covered(settings, imports):
        return None
    line = f"imports = {json.dumps([*imports, str(settings.dropin)])} {MARK}"
    if "imports" not in main:
        # top-level keys come before the first table: the first line is always before it
        return f"{line}\n{text}"
    found = list(_IMPORTS_LINE.finditer(text))
    if len(found) != 1:
        raise InstallError(
            f"{settings.containerd_config}: its imports span several lines; add "
            f"{settings.dropin} to them by hand and run the install again"
        )
    match = found[0]
    return text[: match.start()] + f"{line}\n# was: {match.group(0)}" + text[match.end() :]


def _without_import(text: str) -> str:
    """The main config as it was before `_with_import`."""
    lines = text.split("\n")
    out: list[str] = []
    for index, line in enumerate(lines):
        if line.startswith("imports =") and line.endswith(MARK):
            following = lines[index + 1] if index + 1 < len(lines) else ""
            if following.startswith("# was: "):
                lines[index + 1] = following.removeprefix("# was: ")
            continue
        out.append(line)
    return "\n".join(out)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write(path: Path, data: bytes, created: list[str], root: Path) -> None:
    """Atomic write; directories made on the way are noted (host paths)."""
    missing = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        directory.mkdir(mode=0o755)
        created.append(str(PurePosixPath("/") / directory.relative_to(root)))
    temporary = path.with_name(f".{path.name}.peerpods")
    temporary.write_bytes(data)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def _read_record(settings: NodeInstall) -> dict[str, Any]:
    path = settings.host(settings.record)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return {"files": {}, "directories": [], "imports": False}
    except (OSError, ValueError) as exc:
        raise InstallError(f"{settings.record}: unreadable install record: {exc}") from None
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        raise InstallError(f"{settings.record}: not an install record")
    return record


def install(settings: NodeInstall) -> Outcome:
    """Write the Kata configuration and the drop-in, import it; idempotent."""
    main_path = settings.host(settings.containerd_config)
    try:
        text = main_path.read_text()
    except FileNotFoundError:
        raise InstallError(
            f"{settings.containerd_config} not found (is containerd installed on this node? "
            "write its config with `containerd config default` first)"
        ) from None
    try:
        main = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InstallError(f"{settings.containerd_config}: not TOML: {exc}") from None
    record = _read_record(settings)
    # Everything is computed before the first write: a refusal changes nothing.
    planned: list[tuple[PurePosixPath, bytes]] = [
        (settings.kata_config, dumps(kata_configuration(settings)).encode()),
        (settings.dropin, dumps(containerd_dropin(settings, main)).encode()),
    ]
    new_main = _with_import(settings, text, main)
    outcome = Outcome()
    created: list[str] = list(record.get("directories", []))
    files: dict[str, str] = dict(record["files"])
    for path, data in planned:
        host = settings.host(path)
        current = host.read_bytes() if host.exists() else None
        if current != data:
            _write(host, data, created, settings.host_root)
            outcome.written.append(str(path))
            outcome.containerd_changed |= path == settings.dropin
        files[str(path)] = _digest(data)
    if new_main is not None:
        _write(main_path, new_main.encode(), created, settings.host_root)
        outcome.written.append(str(settings.containerd_config))
        outcome.containerd_changed = True
        record["imports"] = True
    record_path = settings.host(settings.record)
    # its own directories are in the record too: written once they exist
    _write(record_path, b"{}", created, settings.host_root)
    record.update(files=files, directories=created)
    _write(
        record_path,
        (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(),
        created,
        settings.host_root,
    )
    return outcome


def uninstall(settings: NodeInstall) -> Outcome:
    """Remove what install wrote (files still as written), restore `imports`."""
    record = _read_record(settings)
    outcome = Outcome()
    main_path = settings.host(settings.containerd_config)
    if record.get("imports") and main_path.exists():
        text = main_path.read_text()
        restored = _without_import(text)
        if restored != text:
            _write(main_path, restored.encode(), [], settings.host_root)
            outcome.written.append(str(settings.containerd_config))
            outcome.containerd_changed = True
    for name, digest in record["files"].items():
        host = settings.host(PurePosixPath(name))
        if not host.exists():
            continue
        if _digest(host.read_bytes()) != digest:
            outcome.kept.append(name)
            continue
        host.unlink()
        outcome.removed.append(name)
        outcome.containerd_changed |= name == str(settings.dropin)
    record_path = settings.host(settings.record)
    record_path.unlink(missing_ok=True)
    for name in sorted(record.get("directories", []), key=len, reverse=True):
        directory = settings.host(PurePosixPath(name))
        try:
            directory.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            outcome.kept.append(name)  # something else lives there now
        else:
            outcome.removed.append(name)
    return outcome
