"""`peerpods node install|uninstall`: make a worker node able to run `kata-remote` pods, and undo
exactly that.

What it writes (host paths; the installer sees the host under --host-root, and follows links
there as a chroot would, so nothing outside it is ever read, written or removed):
- Kata's remote configuration (the shim's ConfigPath): the file Kata installed for the shim
  (kata-deploy's `configuration-remote.toml`) with only the keys peerpods needs changed, comments
  and layout kept; where Kata installed none, the whole file (kataconfig.py). A file that was
  there before is saved first and put back by uninstall.
- containerd's `kata-remote` runtime handler (containerdconf.py): a drop-in imported by a version
  3 main file (containerd 2.x), or marked lines in a version 2 main file (containerd 1.x).
- A record of what it wrote, with digests, so `uninstall` removes or restores only files still
  as it left them, takes its lines out of containerd's file, and removes directories it made.

Every file keeps the mode and owner of the one it replaces; a drop-in gets the main file's (it
sits beside it and may be read by the same people only). Nothing is restarted unless
--restart-command is given, and then only when containerd's configuration changed.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from adaptor.node import containerdconf, kataconfig
from adaptor.node.hostfiles import ROOT_0600, ROOT_0644, HostFiles, Owner, digest
from adaptor.node.hostpath import HostPathError, host_path
from adaptor.toml import edit as tomledit
from adaptor.toml.write import dumps
from providers.core.errors import PeerpodsError

ANNOTATIONS = kataconfig.ANNOTATIONS
SHIM_PATHS = {
    "go": "/opt/kata/bin/containerd-shim-kata-v2",
    "rs": "/opt/kata/runtime-rs/bin/containerd-shim-kata-v2",
}


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
    # Kata's Go runtime or runtime-rs: their configurations differ (kata-deploy's `remote` shim
    # is the Go one, 4.1 included)
    shim: Literal["go", "rs"] = "go"
    shim_path: str = Field("", description="the shim binary ('': kata-deploy's for `shim`)")
    socket: str = "/run/peerpod/hypervisor.sock"
    # the runtime's snapshotter: 'auto' (a nydus the node declares, else kata-deploy's
    # nydus-for-kata-tee), a proxy plugin's name, or '' (containerd's default)
    snapshotter: str = Field("auto", pattern=r"^[\w.-]*$")
    # its socket when the installer declares it ('': the usual one for that name)
    nydus_address: str = ""
    pod_annotations: tuple[str, ...] = ("io.katacontainers.*",)
    # the Kata configuration to start from ('': the one kata-deploy installs for `shim`;
    # 'none': write the whole file)
    kata_source: str = ""
    # containerd's version ('auto': ask `version_command`, else infer from the file)
    containerd_version: str = Field("auto", pattern=r"^(auto|v?\d+\.\d+(\.\d+)?)$")
    version_command: str = "containerd --version"

    @field_validator("containerd_config", "dropin", "kata_config", "record")
    @classmethod
    def _absolute(cls, value: PurePosixPath) -> PurePosixPath:
        if not value.is_absolute() or ".." in value.parts:
            raise ValueError(f"{value} must be an absolute host path without '..'")
        return value

    @field_validator("kata_source")
    @classmethod
    def _source(cls, value: str) -> str:
        if value and value != "none":
            try:
                host_path(value)
            except HostPathError as exc:
                raise ValueError(str(exc)) from None
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

    def backup_path(self, path: PurePosixPath) -> PurePosixPath:
        """Where the file at `path` that was there before install is kept."""
        name = digest(str(path).encode())[:16] + "-" + path.name
        return self.record.parent / "node-install-backup" / name

    def managed(self) -> set[PurePosixPath]:
        """The files install may create or replace."""
        return {self.kata_config, self.dropin}


@dataclass
class Outcome:
    """What an install or uninstall did."""

    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # changed by someone else: left alone
    notes: list[str] = field(default_factory=list)
    containerd_changed: bool = False


@dataclass
class _Record:
    """The install record, every path in it checked against what these settings manage."""

    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    edited: list[str] = field(default_factory=list)
    directories: list[str] = field(default_factory=list)

    def dump(self) -> bytes:
        data = {"format": 2, "files": self.files, "edited": self.edited,
                "directories": self.directories}  # fmt: skip
        return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def _read_record(settings: NodeInstall, files: HostFiles) -> _Record:
    try:
        data = files.read(settings.record)
    except HostPathError as exc:
        raise InstallError(f"{settings.record}: {exc}") from None
    if data is None:
        return _Record()
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise InstallError(f"{settings.record}: unreadable install record: {exc}") from None
    try:
        return _checked(settings, raw, files)
    except (HostPathError, TypeError, ValueError, KeyError) as exc:
        raise InstallError(
            f"{settings.record}: refusing an install record that names what this installer "
            f"never writes ({exc}); nothing was changed"
        ) from None


def _checked(settings: NodeInstall, raw: Any, files: HostFiles) -> _Record:
    if not isinstance(raw, dict) or not isinstance(raw.get("files"), dict):
        raise ValueError("not an install record")
    record = _Record()
    managed = settings.managed()
    for name, entry in raw["files"].items():
        path = host_path(name)
        if path not in managed:
            raise ValueError(f"file {name}")
        if isinstance(entry, str):  # the first format: a digest
            entry = {"digest": entry, "backup": None}
        if not isinstance(entry, dict) or not isinstance(entry.get("digest"), str):
            raise ValueError(f"entry of {name}")
        backup = entry.get("backup")
        if backup is not None and host_path(backup) != settings.backup_path(path):
            raise ValueError(f"backup {backup}")
        owner = entry.get("owner")
        if owner is not None and not (
            isinstance(owner, list) and len(owner) == 3 and all(type(i) is int for i in owner)
        ):
            raise ValueError(f"owner of {name}")
        record.files[name] = {"digest": entry["digest"], "backup": backup, "owner": owner}
    edited = raw.get("edited", [])
    if raw.get("imports"):  # the first format: the main file's imports line
        edited = [str(settings.containerd_config)]
    for name in edited:
        if host_path(name) != settings.containerd_config:
            raise ValueError(f"edited {name}")
        record.edited = [name]
    # directories install may have made: those above the files it writes, as named and as
    # reached through the host's links
    ours = (*managed, settings.record, settings.backup_path(settings.kata_config))
    reached = [PurePosixPath(files.host_name(files.real(path))) for path in ours]
    allowed = {parent for path in (*ours, *reached) for parent in path.parents}
    allowed.discard(PurePosixPath("/"))
    for name in raw.get("directories", []):
        if host_path(name) not in allowed:
            raise ValueError(f"directory {name}")
        record.directories.append(name)
    return record


def _parse(name: PurePosixPath, text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InstallError(f"{name}: not TOML: {exc}") from None


def _text(name: PurePosixPath, data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise InstallError(f"{name}: not UTF-8 text") from None


@dataclass
class _Plan:
    """Every write an install makes, computed before the first one."""

    writes: list[tuple[PurePosixPath, bytes, Owner]] = field(default_factory=list)
    backups: list[tuple[PurePosixPath, bytes]] = field(default_factory=list)
    record: _Record = field(default_factory=_Record)
    notes: list[str] = field(default_factory=list)


def _kata(settings: NodeInstall, files: HostFiles, old: _Record, plan: _Plan) -> None:
    """Kata's configuration: from the file Kata installed (or the one there), keys fixed."""
    target = settings.kata_config
    current = files.read(target)
    entry = old.files.get(str(target))
    backup = entry["backup"] if entry else None
    owner_list = entry.get("owner") if entry else None
    if current is None or (entry and not backup and digest(current) == entry["digest"]):
        base, where = _kata_source(settings, files)
        owner = files.owner(target) or ROOT_0644
    else:
        base, where = _text(target, current), str(target)
        owner = files.owner(target) or ROOT_0644
        # someone else's file, or one its owner wrote again since (no edit of ours left in
        # it, e.g. Kata upgraded): kept as it is now, for uninstall
        if entry is None or (backup and not tomledit.marked(base)):
            backup = str(settings.backup_path(target))
            owner_list = [owner.mode, owner.uid, owner.gid]
            plan.backups.append((settings.backup_path(target), current))
    try:
        edits = kataconfig.required_edits(_parse(target, base), settings.shim, settings.socket)
        data = tomledit.apply(base, edits).encode()
    except tomledit.TomlEditError as exc:
        raise InstallError(f"{where}: cannot set peerpods' keys in place: {exc}") from None
    plan.notes.append(f"Kata configuration from {where}")
    plan.writes.append((target, data, owner))
    plan.record.files[str(target)] = {"digest": digest(data), "backup": backup,
                                      "owner": owner_list}  # fmt: skip


def _kata_source(settings: NodeInstall, files: HostFiles) -> tuple[str, str]:
    if settings.kata_source != "none":
        source = PurePosixPath(settings.kata_source or kataconfig.INSTALLED[settings.shim])
        found = files.read(source)
        if found is not None:
            return _text(source, found), str(source)
        if settings.kata_source:
            raise InstallError(f"--kata-source {source} not found")
    return kataconfig.complete(settings.shim, settings.socket), "the whole file peerpods writes"


def _containerd(settings: NodeInstall, files: HostFiles, plan: _Plan) -> None:
    """The runtime handler: a drop-in (version 3) or marked lines in the main file (version 2)."""
    name = settings.containerd_config
    data = files.read(name)
    if data is None:
        raise InstallError(
            f"{name} not found (is containerd installed on this node? write its config with "
            "`containerd config default` first)"
        )
    original = tomledit.unmark(_text(name, data))  # as it was before any install
    main = _parse(name, original)
    version = main.get("version", 1)
    if version not in (2, 3):
        raise InstallError(
            f"{name}: config version {version!r} is not supported "
            "(containerd 1.7 writes version 2, containerd 2.x version 3)"
        )
    imports = main.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise InstallError(f"{name}: imports is not a list of paths")
    runtime = _runtime(settings, files, main, imports, plan)
    owner = files.owner(name) or ROOT_0600
    try:
        if version == 3:
            dropin = dumps(containerdconf.dropin_v3(runtime)).encode()
            plan.writes.append((settings.dropin, dropin, owner))
            plan.record.files[str(settings.dropin)] = {"digest": digest(dropin), "backup": None,
                                                       "owner": None}  # fmt: skip
            covered = containerdconf.covers(name, imports, settings.dropin)
            added = [*imports, str(settings.dropin)]
            edits = [] if covered else [tomledit.Edit((), "imports", added)]
        else:
            edits = containerdconf.edits_v2(runtime)
        edited = tomledit.apply(original, edits)
    except (tomledit.TomlEditError, containerdconf.ContainerdError) as exc:
        raise InstallError(f"{name}: {exc}") from None
    if edited != original:
        plan.record.edited = [str(name)]
    plan.writes.append((name, edited.encode(), owner))


def _runtime(
    settings: NodeInstall,
    files: HostFiles,
    main: Mapping[str, Any],
    imports: list[str],
    plan: _Plan,
) -> containerdconf.Runtime:
    version = main["version"]
    if settings.containerd_version == "auto":
        running = containerdconf.ask_version(settings.version_command)
        if running is None:
            running = (2, 0) if version == 3 else None
            plan.notes.append(
                "containerd's version unknown (--version-command gave none): "
                + ("2.x, from the version 3 file" if running else "taken as 1.7")
            )
    else:
        running = containerdconf.parse_version(settings.containerd_version)
    documents: list[Mapping[str, Any]] = [main]
    for path in containerdconf.imported(settings.containerd_config, imports, files.root):
        if path == settings.dropin:
            continue
        try:
            found = files.read(path)
            if found is not None:
                documents.append(tomllib.loads(found.decode()))
        except (HostPathError, OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue  # containerd says what is wrong with it
        if settings.handler in containerdconf.runtimes(documents[-1]):
            plan.notes.append(
                f"{path} registers a {settings.handler} runtime too (kata-deploy's remote "
                "shim?): containerd takes the one imported last; --handler names another"
            )
    declared = containerdconf.proxy_snapshotters(documents)
    snapshotter, address = containerdconf.choose_snapshotter(
        settings.snapshotter, settings.nydus_address, declared
    )
    try:
        containerdconf.check_versions(version, running, snapshotter)
    except containerdconf.ContainerdError as exc:
        raise InstallError(f"{settings.containerd_config}: {exc}") from None
    if snapshotter:
        plan.notes.append(f"snapshotter {snapshotter}" + (f" at {address}" if address else ""))
    return containerdconf.Runtime(
        handler=settings.handler,
        runtime_type=settings.runtime_type,
        runtime_path=settings.shim_path or SHIM_PATHS[settings.shim],
        config_path=str(settings.kata_config),
        pod_annotations=settings.pod_annotations,
        snapshotter=snapshotter,
        declare_address=address,
    )


def install(settings: NodeInstall) -> Outcome:
    """Write Kata's configuration and containerd's runtime; idempotent."""
    files = HostFiles(settings.host_root)
    try:
        old = _read_record(settings, files)
        plan = _Plan()
        _kata(settings, files, old, plan)
        _containerd(settings, files, plan)
        return _carry_out(settings, files, old, plan)
    except HostPathError as exc:
        raise InstallError(str(exc)) from None
    except OSError as exc:  # a read-only mount, a full disk: said in one line
        raise InstallError(_os_error(settings, exc)) from None


def _carry_out(settings: NodeInstall, files: HostFiles, old: _Record, plan: _Plan) -> Outcome:
    outcome = Outcome(notes=plan.notes)
    created = list(old.directories)
    for path, data in plan.backups:
        if files.read(path) != data:
            files.write(path, data, ROOT_0600, created, private=True)
    # What was there before is recorded before anything of it changes.
    for name, entry in old.files.items():
        if name not in plan.record.files:  # no longer written (e.g. the layout changed)
            current = files.read(PurePosixPath(name))
            if current is not None and digest(current) == entry["digest"] and not entry["backup"]:
                files.remove(PurePosixPath(name))
                outcome.removed.append(name)
                outcome.containerd_changed |= name == str(settings.dropin)
    plan.record.directories = created
    _write_record(settings, files, plan.record)
    for path, data, owner in plan.writes:
        if files.read(path) != data:
            files.write(path, data, owner, plan.record.directories, private=False)
            outcome.written.append(str(path))
            outcome.containerd_changed |= path in (settings.dropin, settings.containerd_config)
    _write_record(settings, files, plan.record)
    return outcome


def _write_record(settings: NodeInstall, files: HostFiles, record: _Record) -> None:
    data = record.dump()
    if files.read(settings.record) != data:
        files.write(settings.record, data, ROOT_0600, record.directories, private=True)
        data = record.dump()  # directories made for the record itself
        if files.read(settings.record) != data:
            files.write(settings.record, data, ROOT_0600, record.directories, private=True)


def uninstall(settings: NodeInstall) -> Outcome:
    """Take out what install put in: its lines, its files (if unchanged), saved files back."""
    files = HostFiles(settings.host_root)
    try:
        record = _read_record(settings, files)
        outcome = Outcome()
        _unedit(settings, files, record, outcome)
        for name, entry in record.files.items():
            _undo_file(settings, files, PurePosixPath(name), entry, outcome)
        if files.read(settings.record) is not None:
            files.remove(settings.record)
        for name in sorted(record.directories, key=len, reverse=True):
            if files.remove_directory(PurePosixPath(name)):
                outcome.removed.append(name)
            else:
                outcome.kept.append(name)  # something else lives there now
        return outcome
    except HostPathError as exc:
        raise InstallError(str(exc)) from None
    except OSError as exc:
        raise InstallError(_os_error(settings, exc)) from None


def _os_error(settings: NodeInstall, exc: OSError) -> str:
    where = str(exc.filename or "")
    root = str(settings.host_root.resolve())
    if where.startswith(root) and root != "/":
        where = "/" + where[len(root) :].lstrip("/")
    return f"{where or 'host files'}: {exc.strerror or exc}"


def _unedit(settings: NodeInstall, files: HostFiles, record: _Record, outcome: Outcome) -> None:
    name = settings.containerd_config
    data = files.read(name) if record.edited else None
    if data is None:
        return
    text = _text(name, data)
    restored = tomledit.unmark(text)
    if restored != text:
        files.write(name, restored.encode(), files.owner(name) or ROOT_0600, [], private=False)
        outcome.written.append(str(name))
        outcome.containerd_changed = True


def _undo_file(
    settings: NodeInstall, files: HostFiles, path: PurePosixPath, entry: dict[str, Any],
    outcome: Outcome,
) -> None:  # fmt: skip
    current = files.read(path)
    backup = PurePosixPath(entry["backup"]) if entry["backup"] else None
    saved = files.read(backup) if backup else None
    if current is not None and digest(current) != entry["digest"]:
        outcome.kept.append(str(path) + (f" (what was there before: {backup})" if saved else ""))
        return
    if backup is not None and saved is not None:
        mode, uid, gid = entry["owner"] or (0o644, -1, -1)
        files.write(path, saved, Owner(mode, uid, gid), [], private=False)
        files.remove(backup)
        outcome.written.append(str(path))
    elif current is not None:
        files.remove(path)
        outcome.removed.append(str(path))
    outcome.containerd_changed |= path == settings.dropin
