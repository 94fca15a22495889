"""The CDI spec model and its strict loader.

A spec file is read as the CDI spec 1.1.0 says: unknown fields are an error, every field has its
type (no number where a string belongs, no float where an integer belongs), names follow the naming
rules, and a feature newer than the file's `cdiVersion` is an error rather than silently used.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from adaptor.cdi._errors import DeviceNameError, SpecError
from adaptor.cdi._names import parse_kind, validate_device_name

VALID_VERSIONS = (
    "0.1.0",
    "0.2.0",
    "0.3.0",
    "0.4.0",
    "0.5.0",
    "0.6.0",
    "0.7.0",
    "0.8.0",
    "1.0.0",
    "1.1.0",
)
CURRENT_VERSION = "1.1.0"
HOOK_NAMES = (
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
)
DEVICE_TYPES = ("", "b", "c", "u", "p")
_INT64 = (-(1 << 63), (1 << 63) - 1)
_UINT32 = (0, (1 << 32) - 1)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


@dataclass(frozen=True)
class DeviceNode:
    path: str
    host_path: str = ""
    type: str = ""
    major: int = 0
    minor: int = 0
    file_mode: int | None = None
    permissions: str = ""
    uid: int | None = None
    gid: int | None = None

    @property
    def fully_specified(self) -> bool:
        """True when applying it needs no stat of a device file (type, major, minor given)."""
        return self.type == "p" or (self.type in ("b", "c", "u") and self.major != 0)


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str = ""


@dataclass(frozen=True)
class Hook:
    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


@dataclass(frozen=True)
class NetDevice:
    host_interface_name: str
    name: str


@dataclass(frozen=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    hooks: tuple[Hook, ...] = ()
    mounts: tuple[Mount, ...] = ()
    intel_rdt: Mapping[str, Any] | None = None
    additional_gids: tuple[int, ...] = ()
    net_devices: tuple[NetDevice, ...] = ()

    @property
    def empty(self) -> bool:
        return not (
            self.env
            or self.device_nodes
            or self.hooks
            or self.mounts
            or self.intel_rdt is not None
            or self.additional_gids
            or self.net_devices
        )


@dataclass(frozen=True)
class Device:
    name: str
    edits: ContainerEdits
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Spec:
    """One loaded, validated CDI spec; `priority` comes from its spec dir (higher wins)."""

    version: str
    kind: str
    devices: tuple[Device, ...]
    edits: ContainerEdits = ContainerEdits()
    annotations: Mapping[str, str] = field(default_factory=dict)
    path: str = ""
    priority: int = 0

    @property
    def vendor(self) -> str:
        return self.kind.partition("/")[0]

    @property
    def class_(self) -> str:
        return self.kind.partition("/")[2]

    def device(self, name: str) -> Device | None:
        for dev in self.devices:
            if dev.name == name:
                return dev
        return None

    def qualified_names(self) -> list[str]:
        return [f"{self.kind}={d.name}" for d in self.devices]


# --- strict reading ----------------------------------------------------------------------------


class _Reader:
    """Reads one JSON object strictly; `where` names the position for error messages."""

    def __init__(self, raw: object, where: str) -> None:
        if not isinstance(raw, dict):
            raise SpecError(f"{where}: expected an object, got {_typename(raw)}")
        self.raw: dict[str, Any] = raw
        self.where = where
        self.seen: set[str] = set()

    def _get(self, key: str) -> Any:
        self.seen.add(key)
        return self.raw.get(key)

    def string(self, key: str, *, required: bool = False) -> str:
        value = self._get(key)
        if value is None:
            if required:
                raise SpecError(f"{self.where}: missing {key!r}")
            return ""
        if not isinstance(value, str):
            raise SpecError(f"{self.where}.{key}: expected a string, got {_typename(value)}")
        return value

    def integer(self, key: str, bounds: tuple[int, int]) -> int | None:
        value = self._get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{self.where}.{key}: expected an integer, got {_typename(value)}")
        if not bounds[0] <= value <= bounds[1]:
            raise SpecError(f"{self.where}.{key}: {value} is out of range")
        return value

    def boolean(self, key: str) -> bool | None:
        value = self._get(key)
        if value is not None and not isinstance(value, bool):
            raise SpecError(f"{self.where}.{key}: expected true or false, got {_typename(value)}")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        items = self.array(key)
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise SpecError(f"{self.where}.{key}[{i}]: expected a string")
        return tuple(items)

    def array(self, key: str) -> list[Any]:
        value = self._get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise SpecError(f"{self.where}.{key}: expected a list, got {_typename(value)}")
        return value

    def string_map(self, key: str) -> dict[str, str]:
        value = self._get(key)
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise SpecError(f"{self.where}.{key}: expected a map of strings")
        return dict(value)

    def present(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def finish(self) -> None:
        unknown = sorted(set(self.raw) - self.seen)
        if unknown:
            raise SpecError(f"{self.where}: unknown field {unknown[0]!r}")


def _typename(value: object) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _check_env(env: tuple[str, ...], where: str) -> None:
    for item in env:
        if item.find("=") <= 0:
            raise SpecError(f"{where}: invalid environment variable {item!r} (want KEY=VALUE)")


def _read_node(raw: object, where: str) -> DeviceNode:
    r = _Reader(raw, where)
    node = DeviceNode(
        path=r.string("path"),
        host_path=r.string("hostPath"),
        type=r.string("type"),
        major=r.integer("major", _INT64) or 0,
        minor=r.integer("minor", _INT64) or 0,
        file_mode=r.integer("fileMode", _UINT32),
        permissions=r.string("permissions"),
        uid=r.integer("uid", _UINT32),
        gid=r.integer("gid", _UINT32),
    )
    r.finish()
    if not node.path:
        raise SpecError(f"{where}: invalid (empty) device path")
    if node.type not in DEVICE_TYPES:
        raise SpecError(f"{where}: device {node.path!r}: invalid type {node.type!r}")
    if any(c not in "rwm" for c in node.permissions):
        raise SpecError(f"{where}: device {node.path!r}: invalid permissions {node.permissions!r}")
    return node


def _read_mount(raw: object, where: str) -> Mount:
    r = _Reader(raw, where)
    mount = Mount(
        host_path=r.string("hostPath"),
        container_path=r.string("containerPath"),
        options=r.strings("options"),
        type=r.string("type"),
    )
    r.finish()
    if not mount.host_path:
        raise SpecError(f"{where}: invalid mount, empty hostPath")
    if not mount.container_path:
        raise SpecError(f"{where}: invalid mount, empty containerPath")
    return mount


def _read_hook(raw: object, where: str) -> Hook:
    r = _Reader(raw, where)
    hook = Hook(
        hook_name=r.string("hookName"),
        path=r.string("path"),
        args=r.strings("args"),
        env=r.strings("env"),
        timeout=r.integer("timeout", _INT64),
    )
    r.finish()
    if hook.hook_name not in HOOK_NAMES:
        raise SpecError(f"{where}: invalid hook name {hook.hook_name!r}")
    if not hook.path:
        raise SpecError(f"{where}: hook {hook.hook_name!r} has an empty path")
    _check_env(hook.env, f"{where}.env")
    return hook


_RDT_STRINGS = ("closID", "l3CacheSchema", "memBwSchema")
_RDT_BOOLS = ("enableCMT", "enableMBM", "enableMonitoring")


def _read_rdt(raw: object, where: str) -> Mapping[str, Any]:
    r = _Reader(raw, where)
    out: dict[str, Any] = {}
    for key in _RDT_STRINGS:
        if r.present(key):
            out[key] = r.string(key)
    for key in _RDT_BOOLS:
        flag = r.boolean(key)
        if flag is not None:
            out[key] = flag
    if r.present("schemata"):
        out["schemata"] = list(r.strings("schemata"))
    r.finish()
    return out


def _read_edits(raw: object, where: str) -> ContainerEdits:
    r = _Reader(raw if raw is not None else {}, where)
    env = r.strings("env")
    _check_env(env, f"{where}.env")
    nodes = tuple(
        _read_node(x, f"{where}.deviceNodes[{i}]") for i, x in enumerate(r.array("deviceNodes"))
    )
    hooks = tuple(_read_hook(x, f"{where}.hooks[{i}]") for i, x in enumerate(r.array("hooks")))
    mounts = tuple(_read_mount(x, f"{where}.mounts[{i}]") for i, x in enumerate(r.array("mounts")))
    rdt = _read_rdt(r.raw["intelRdt"], f"{where}.intelRdt") if r.present("intelRdt") else None
    r.seen.add("intelRdt")
    gids: list[int] = []
    for i, gid in enumerate(r.array("additionalGids")):
        if isinstance(gid, bool) or not isinstance(gid, int) or not 0 <= gid < 1 << 32:
            raise SpecError(f"{where}.additionalGids[{i}]: expected a uint32")
        if gid not in gids:
            gids.append(gid)
    nets: list[NetDevice] = []
    for i, x in enumerate(r.array("netDevices")):
        nr = _Reader(x, f"{where}.netDevices[{i}]")
        net = NetDevice(nr.string("hostInterfaceName"), nr.string("name"))
        nr.finish()
        if not net.host_interface_name or not net.name:
            raise SpecError(f"{where}.netDevices[{i}]: hostInterfaceName and name are required")
        nets.append(net)
    r.finish()
    return ContainerEdits(env, nodes, hooks, mounts, rdt, tuple(gids), tuple(nets))


def _required_version(spec: Spec) -> tuple[tuple[int, ...], str]:
    """The lowest cdiVersion able to express this spec, and the feature that needs it."""
    need: tuple[tuple[int, ...], str] = ((0, 1, 0), "")

    def bump(version: tuple[int, ...], why: str) -> None:
        nonlocal need
        if version > need[0]:
            need = (version, why)

    all_edits = [spec.edits, *(d.edits for d in spec.devices)]
    for edits in all_edits:
        if edits.net_devices:
            bump((1, 1, 0), "netDevices")
        if edits.intel_rdt is not None:
            bump((0, 7, 0), "intelRdt")
        if edits.additional_gids:
            bump((0, 7, 0), "additionalGids")
        if any(n.host_path for n in edits.device_nodes):
            bump((0, 5, 0), "a device node hostPath")
        if any(m.type for m in edits.mounts):
            bump((0, 4, 0), "a mount type")
    if spec.annotations or any(d.annotations for d in spec.devices):
        bump((0, 6, 0), "annotations")
    if "." in spec.class_:
        bump((0, 6, 0), "a '.' in the device class")
    if any(d.name[:1].isdigit() for d in spec.devices):
        bump((0, 5, 0), "a device name starting with a digit")
    return need


def minimum_version(spec: Spec) -> str:
    """The lowest cdiVersion able to express `spec` (what a spec writer should declare, so the
    oldest CDI consumers can still read it); never below 0.3.0, the oldest version in use."""
    need, _ = _required_version(spec)
    return ".".join(map(str, max(need, (0, 3, 0))))


def parse_spec(data: bytes | str, path: str = "<spec>", priority: int = 0) -> Spec:
    """Parse and validate spec text (JSON, or YAML when `path` ends in .yaml/.yml)."""
    text = data.decode("utf-8", "strict") if isinstance(data, bytes) else data
    try:
        if path.endswith((".yaml", ".yml")):
            raw = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
        else:
            raw = json.loads(text, object_pairs_hook=_no_duplicates)
    except (ValueError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: cannot parse: {_first_line(exc)}") from None
    try:
        return _build(raw, path, priority)
    except (SpecError, DeviceNameError) as exc:
        raise SpecError(f"{path}: {exc}") from None


def _build(raw: object, path: str, priority: int) -> Spec:
    r = _Reader(raw, "spec")
    version = r.string("cdiVersion", required=True)
    kind = r.string("kind", required=True)
    annotations = r.string_map("annotations")
    devices_raw = r.array("devices")
    edits = _read_edits(r.raw.get("containerEdits"), "containerEdits")
    r.seen.add("containerEdits")
    r.finish()
    if version not in VALID_VERSIONS:
        raise SpecError(f"invalid cdiVersion {version!r}")
    parse_kind(kind)
    devices: list[Device] = []
    names: set[str] = set()
    for i, draw in enumerate(devices_raw):
        where = f"devices[{i}]"
        dr = _Reader(draw, where)
        name = dr.string("name")
        dev_annotations = dr.string_map("annotations")
        dev_edits = _read_edits(dr.raw.get("containerEdits"), f"{where}.containerEdits")
        dr.seen.add("containerEdits")
        dr.finish()
        try:
            validate_device_name(name)
        except DeviceNameError as exc:
            raise SpecError(f"{where}: {exc}") from None
        if dev_edits.empty:
            raise SpecError(f"device {name!r}: empty containerEdits")
        if name in names:
            raise SpecError(f"device {name!r} defined twice")
        names.add(name)
        devices.append(Device(name, dev_edits, dev_annotations))
    spec = Spec(version, kind, tuple(devices), edits, annotations, os.path.normpath(path), priority)
    need, why = _required_version(spec)
    if version_tuple(version) < need:
        wanted = ".".join(map(str, need))
        raise SpecError(f"cdiVersion {version} is too old for {why} (needs {wanted})")
    return spec


def load_spec(path: str, priority: int = 0) -> Spec:
    """Read and validate one spec file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return parse_spec(data, path, priority)
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not UTF-8 text") from None


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    keys = [loader.construct_object(k, deep=True) for k, _ in node.value]
    if len(keys) != len(set(map(repr, keys))):
        raise yaml.constructor.ConstructorError(None, None, "duplicate key", node.start_mark)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def spec_to_dict(spec: Spec) -> dict[str, Any]:
    """The spec as CDI JSON (for listing and for feeding other tools)."""

    def edits(e: ContainerEdits) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if e.env:
            out["env"] = list(e.env)
        if e.device_nodes:
            out["deviceNodes"] = [_node_json(n) for n in e.device_nodes]
        if e.hooks:
            out["hooks"] = [_hook_json(h) for h in e.hooks]
        if e.mounts:
            out["mounts"] = [_mount_json(m) for m in e.mounts]
        if e.intel_rdt is not None:
            out["intelRdt"] = dict(e.intel_rdt)
        if e.additional_gids:
            out["additionalGids"] = list(e.additional_gids)
        if e.net_devices:
            out["netDevices"] = [
                {"hostInterfaceName": n.host_interface_name, "name": n.name} for n in e.net_devices
            ]
        return out

    doc: dict[str, Any] = {"cdiVersion": spec.version, "kind": spec.kind}
    if spec.annotations:
        doc["annotations"] = dict(spec.annotations)
    doc["devices"] = []
    for d in spec.devices:
        dev: dict[str, Any] = {"name": d.name}
        if d.annotations:
            dev["annotations"] = dict(d.annotations)
        dev["containerEdits"] = edits(d.edits)
        doc["devices"].append(dev)
    if not spec.edits.empty:
        doc["containerEdits"] = edits(spec.edits)
    return doc


def _node_json(n: DeviceNode) -> dict[str, Any]:
    out: dict[str, Any] = {"path": n.path}
    for key, value in (
        ("hostPath", n.host_path),
        ("type", n.type),
        ("major", n.major),
        ("minor", n.minor),
        ("fileMode", n.file_mode),
        ("permissions", n.permissions),
        ("uid", n.uid),
        ("gid", n.gid),
    ):
        if value not in (None, "", 0) or (key in ("fileMode", "uid", "gid") and value == 0):
            out[key] = value
        elif key == "minor" and n.major != 0:
            out[key] = value  # minor 0 is a real minor once a major names the device (nvidia0)
    return out


def _hook_json(h: Hook) -> dict[str, Any]:
    out: dict[str, Any] = {"hookName": h.hook_name, "path": h.path}
    if h.args:
        out["args"] = list(h.args)
    if h.env:
        out["env"] = list(h.env)
    if h.timeout is not None:
        out["timeout"] = h.timeout
    return out


def _mount_json(m: Mount) -> dict[str, Any]:
    out: dict[str, Any] = {"hostPath": m.host_path, "containerPath": m.container_path}
    if m.options:
        out["options"] = list(m.options)
    if m.type:
        out["type"] = m.type
    return out
