"""Container edits applied to the agent protocol's `Spec` message (edits mode).

The agent's Spec is decoded with a partial schema: fields we do not model stay as unknown fields
and survive. What the partial schema cannot express is refused rather than dropped: additional
gids, Intel RDT and network devices.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.unknown_fields import UnknownFieldSet

from adaptor.cdi._apply import OCI_HOOK_KEYS, StatFn, apply_to
from adaptor.cdi._errors import EditError
from adaptor.cdi._spec import ContainerEdits, DeviceNode, Hook, Mount

_PB_HOOKS = {
    "prestart": "Prestart",
    "createRuntime": "CreateRuntime",
    "createContainer": "CreateContainer",
    "startContainer": "StartContainer",
    "poststart": "Poststart",
    "poststop": "Poststop",
}
assert set(_PB_HOOKS) == set(OCI_HOOK_KEYS)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of a serialized message; enough to read Process.User."""
    out: list[tuple[int, int, Any]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.append((number, wire, value))
    return out


class ProtoTarget:
    """An agent `Spec` message, edited in place."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    def env(self) -> list[str]:
        return list(self.spec.Process.Env)

    def set_env(self, env: list[str]) -> None:
        del self.spec.Process.Env[:]
        self.spec.Process.Env.extend(env)

    def process_ids(self) -> tuple[int, int]:
        """UID and GID from Process.User (field 3), which the partial schema keeps unparsed."""
        if not self.spec.HasField("Process"):
            return 0, 0
        uid = gid = 0
        try:
            for field in UnknownFieldSet(self.spec.Process):
                if field.field_number == 3 and isinstance(field.data, bytes):
                    for sub, sub_wire, sub_value in _fields(field.data):
                        if sub == 1 and sub_wire == 0:
                            uid = int(sub_value)
                        elif sub == 2 and sub_wire == 0:
                            gid = int(sub_value)
        except ValueError:
            return 0, 0
        return uid, gid

    def device_paths(self) -> list[str]:
        return [d.Path for d in self.spec.Linux.Devices]

    def remove_device(self, index: int) -> None:
        del self.spec.Linux.Devices[index]

    def put_device(
        self, index: int | None, node: DeviceNode, uid: int | None, gid: int | None
    ) -> None:
        devices = self.spec.Linux.Devices
        dev = devices.add() if index is None else devices[index]
        dev.Clear()
        dev.Path, dev.Type, dev.Major, dev.Minor = node.path, node.type, node.major, node.minor
        dev.FileMode = node.file_mode or 0
        dev.UID = uid or 0
        dev.GID = gid or 0

    def add_cgroup_rule(self, type_: str, major: int, minor: int, access: str) -> None:
        rule = self.spec.Linux.Resources.Devices.add()
        rule.Allow, rule.Type, rule.Major, rule.Minor, rule.Access = (
            True,
            type_,
            major,
            minor,
            access,
        )

    def mount_destinations(self) -> list[str]:
        return [m.destination for m in self.spec.Mounts]

    def remove_mount(self, index: int) -> None:
        del self.spec.Mounts[index]

    def append_mount(self, mount: Mount) -> None:
        entry = self.spec.Mounts.add()
        entry.destination, entry.source, entry.type = (
            mount.container_path,
            mount.host_path,
            mount.type,
        )
        entry.options.extend(mount.options)

    def reorder_mounts(self, order: list[int]) -> None:
        mounts = self.spec.Mounts
        copies = []
        for i in order:
            item = type(mounts[i])()
            item.CopyFrom(mounts[i])
            copies.append(item)
        del mounts[:]
        mounts.extend(copies)

    def append_hook(self, hook: Hook) -> None:
        entry = getattr(self.spec.Hooks, _PB_HOOKS[hook.hook_name]).add()
        entry.Path = hook.path
        entry.Args.extend(hook.args)
        entry.Env.extend(hook.env)
        entry.Timeout = hook.timeout or 0

    def add_gids(self, gids: tuple[int, ...]) -> None:
        raise AssertionError("refused by check_proto_edits")

    def set_intel_rdt(self, rdt: dict[str, Any]) -> None:
        raise AssertionError("refused by check_proto_edits")

    def add_net_device(self, host_name: str, name: str) -> None:
        raise AssertionError("refused by check_proto_edits")


def apply_to_proto(spec: Any, edits: ContainerEdits, stat: StatFn | None = None) -> None:
    """Apply edits to an agent `Spec` message; refuses (changing nothing) what it cannot carry.

    `stat` defaults to None: the adaptor is not the machine that owns the devices, so a device
    node must be fully specified (type, major, minor) in the spec.
    """
    for what, present in (
        ("additionalGids", bool(edits.additional_gids)),
        ("intelRdt", edits.intel_rdt is not None),
        ("netDevices", bool(edits.net_devices)),
    ):
        if present:
            raise EditError(f"CDI edits with {what} cannot be applied to the agent's OCI spec")
    apply_to(ProtoTarget(spec), edits, stat)
