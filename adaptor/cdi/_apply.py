"""Applying container edits, with the CDI merge rules, to an OCI spec.

Every requested device contributes its spec's global edits (once per spec) and then its own, in
request order; the combined edits are applied in one pass:

- env: a variable whose key is already set is replaced in place, otherwise appended;
- device nodes: a node at the same path is replaced; `b`/`c` nodes also get a cgroup allow rule
  (access from `permissions`, default `rwm`); a node without type/major/minor needs a stat of its
  host path, which only the machine that owns the device can do (`stat=None` refuses it);
- mounts: a mount at the same destination is replaced, then mounts are sorted by path depth
  (ties by destination) so parents mount before children;
- hooks: appended to their OCI hook list; additional gids added once.

Targets: OCI runtime-spec JSON (a dict, edited in place) here, and the agent's protobuf Spec in
`adaptor.cdi._pbapply`, both through the small `EditTarget` interface so the rules live once.
"""

from __future__ import annotations

import os
import stat as stat_mod
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from adaptor.cdi._errors import EditError
from adaptor.cdi._spec import ContainerEdits, DeviceNode, Hook, Mount

# (type, major, minor) of a host path, e.g. ("c", 195, 0)
StatFn = Callable[[str], tuple[str, int, int]]
OCI_HOOK_KEYS = {
    "prestart": "prestart",
    "createRuntime": "createRuntime",
    "createContainer": "createContainer",
    "startContainer": "startContainer",
    "poststart": "poststart",
    "poststop": "poststop",
}


def host_stat(path: str) -> tuple[str, int, int]:
    """Type, major and minor of a device file on this machine (what runc's DeviceFromPath does)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise EditError(f"failed to stat CDI host device {path!r}: {exc.strerror}") from None
    if stat_mod.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat_mod.S_ISBLK(st.st_mode):
        kind = "b"
    elif stat_mod.S_ISFIFO(st.st_mode):
        return ("p", 0, 0)
    else:
        raise EditError(f"CDI host device {path!r} is not a device node")
    return (kind, os.major(st.st_rdev), os.minor(st.st_rdev))


def combine(edits: Iterable[ContainerEdits]) -> ContainerEdits:
    """Concatenate edits in order (what is applied in one pass)."""
    env: list[str] = []
    nodes: list[DeviceNode] = []
    hooks: list[Hook] = []
    mounts: list[Mount] = []
    gids: list[int] = []
    rdt = None
    nets: list[Any] = []
    for e in edits:
        env += e.env
        nodes += e.device_nodes
        hooks += e.hooks
        mounts += e.mounts
        gids += [g for g in e.additional_gids if g not in gids]
        rdt = e.intel_rdt if e.intel_rdt is not None else rdt
        nets += e.net_devices
    return ContainerEdits(
        tuple(env), tuple(nodes), tuple(hooks), tuple(mounts), rdt, tuple(gids), tuple(nets)
    )


def go_clean(path: str) -> str:
    """Go's filepath.Clean (differs from posixpath.normpath on '//' and on '')."""
    if path.startswith("/") and "//" not in path and "/." not in path and path[-1] != "/":
        return path  # already clean: the common case
    if not path:
        return "."
    rooted = path.startswith("/")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not rooted:
                parts.append("..")
            continue
        parts.append(part)
    out = "/".join(parts)
    return ("/" + out) if rooted else (out or ".")


def mount_order(destination: str) -> tuple[int, str]:
    return (go_clean(destination).count("/"), destination)


class EditTarget(Protocol):
    """What the merge rules need from an OCI spec representation."""

    def env(self) -> list[str]: ...
    def set_env(self, env: list[str]) -> None: ...
    def process_ids(self) -> tuple[int, int]: ...
    def device_paths(self) -> list[str]: ...
    def remove_device(self, index: int) -> None: ...
    def put_device(
        self, index: int | None, node: DeviceNode, uid: int | None, gid: int | None
    ) -> None: ...
    def add_cgroup_rule(self, type_: str, major: int, minor: int, access: str) -> None: ...
    def mount_destinations(self) -> list[str]: ...
    def remove_mount(self, index: int) -> None: ...
    def append_mount(self, mount: Mount) -> None: ...
    def reorder_mounts(self, order: list[int]) -> None: ...
    def append_hook(self, hook: Hook) -> None: ...
    def add_gids(self, gids: tuple[int, ...]) -> None: ...
    def set_intel_rdt(self, rdt: dict[str, Any]) -> None: ...
    def add_net_device(self, host_name: str, name: str) -> None: ...


def _fill(node: DeviceNode, stat: StatFn | None) -> DeviceNode:
    host = node.host_path or node.path
    if node.fully_specified:
        return node
    if stat is None:
        raise EditError(
            f"device node {node.path!r} has no type/major/minor: it would need a stat of "
            f"{host!r} on the pod VM; give type, major and minor in the spec"
        )
    kind, major, minor = stat(host)
    if node.type and node.type != kind:
        raise EditError(f"CDI device {node.path!r}: host type mismatch ({node.type}, {kind})")
    if node.major == 0 and kind != "p":
        return DeviceNode(
            node.path,
            host,
            kind,
            major,
            minor,
            node.file_mode,
            node.permissions,
            node.uid,
            node.gid,
        )
    return DeviceNode(
        node.path,
        host,
        kind,
        node.major,
        node.minor,
        node.file_mode,
        node.permissions,
        node.uid,
        node.gid,
    )


def check_applicable(edits: ContainerEdits, stat: StatFn | None) -> list[DeviceNode]:
    """Resolve every device node first so a refusal changes nothing."""
    return [_fill(n, stat) for n in edits.device_nodes]


def apply_to(target: EditTarget, edits: ContainerEdits, stat: StatFn | None = host_stat) -> None:
    """Apply combined edits to a target; raises EditError before changing anything."""
    nodes = check_applicable(edits, stat)
    if edits.env:
        env = target.env()
        index = {item.partition("=")[0]: i for i, item in enumerate(env)}
        for item in edits.env:
            key = item.partition("=")[0]
            if key in index:
                env[index[key]] = item
            else:
                index[key] = len(env)
                env.append(item)
        target.set_env(env)
    if nodes:
        uid0, gid0 = target.process_ids()
        for node in nodes:
            uid = node.uid if node.uid is not None else (uid0 if uid0 > 0 else None)
            gid = node.gid if node.gid is not None else (gid0 if gid0 > 0 else None)
            paths = target.device_paths()
            if node.path in paths:
                target.remove_device(paths.index(node.path))
                paths = target.device_paths()
            target.put_device(
                paths.index(node.path) if node.path in paths else None, node, uid, gid
            )
            if node.type in ("b", "c"):
                target.add_cgroup_rule(node.type, node.major, node.minor, node.permissions or "rwm")
    if edits.mounts:
        dests = target.mount_destinations()
        for mount in edits.mounts:
            if mount.container_path in dests:
                at = dests.index(mount.container_path)
                target.remove_mount(at)
                del dests[at]
            target.append_mount(mount)
            dests.append(mount.container_path)
        order = sorted(range(len(dests)), key=lambda i: mount_order(dests[i]))
        if order != list(range(len(dests))):
            target.reorder_mounts(order)
    for hook in edits.hooks:
        target.append_hook(hook)
    if edits.additional_gids:
        target.add_gids(edits.additional_gids)
    if edits.intel_rdt is not None:
        target.set_intel_rdt(dict(edits.intel_rdt))
    for net in edits.net_devices:
        target.add_net_device(net.host_interface_name, net.name)


class JsonTarget:
    """An OCI runtime-spec JSON document (dict), edited in place; other fields are untouched."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc

    def _process(self) -> dict[str, Any]:
        return self.doc.setdefault("process", {})  # type: ignore[no-any-return]

    def _linux(self) -> dict[str, Any]:
        return self.doc.setdefault("linux", {})  # type: ignore[no-any-return]

    def env(self) -> list[str]:
        return list((self.doc.get("process") or {}).get("env") or [])

    def set_env(self, env: list[str]) -> None:
        self._process()["env"] = env

    def process_ids(self) -> tuple[int, int]:
        user = (self.doc.get("process") or {}).get("user") or {}
        return int(user.get("uid") or 0), int(user.get("gid") or 0)

    def _devices(self) -> list[dict[str, Any]]:
        linux = self._linux()
        if linux.get("devices") is None:
            linux["devices"] = []
        return linux["devices"]  # type: ignore[no-any-return]

    def device_paths(self) -> list[str]:
        devices = (self.doc.get("linux") or {}).get("devices") or []
        return [str(d.get("path", "")) for d in devices]

    def remove_device(self, index: int) -> None:
        del self._devices()[index]

    def put_device(
        self, index: int | None, node: DeviceNode, uid: int | None, gid: int | None
    ) -> None:
        dev: dict[str, Any] = {
            "path": node.path,
            "type": node.type,
            "major": node.major,
            "minor": node.minor,
        }
        if node.file_mode is not None:
            dev["fileMode"] = node.file_mode
        if uid is not None:
            dev["uid"] = uid
        if gid is not None:
            dev["gid"] = gid
        devices = self._devices()
        if index is None:
            devices.append(dev)
        else:
            devices[index] = dev

    def add_cgroup_rule(self, type_: str, major: int, minor: int, access: str) -> None:
        resources = self._linux().setdefault("resources", {})
        if resources.get("devices") is None:
            resources["devices"] = []
        resources["devices"].append(
            {"allow": True, "type": type_, "major": major, "minor": minor, "access": access}
        )

    def mount_destinations(self) -> list[str]:
        return [str(m.get("destination", "")) for m in self.doc.get("mounts") or []]

    def remove_mount(self, index: int) -> None:
        del self.doc["mounts"][index]

    def append_mount(self, mount: Mount) -> None:
        entry: dict[str, Any] = {"destination": mount.container_path}
        if mount.type:
            entry["type"] = mount.type
        entry["source"] = mount.host_path
        if mount.options:
            entry["options"] = list(mount.options)
        if self.doc.get("mounts") is None:
            self.doc["mounts"] = []
        self.doc["mounts"].append(entry)

    def reorder_mounts(self, order: list[int]) -> None:
        mounts = self.doc["mounts"]
        self.doc["mounts"] = [mounts[i] for i in order]

    def append_hook(self, hook: Hook) -> None:
        if self.doc.get("hooks") is None:
            self.doc["hooks"] = {}
        entry: dict[str, Any] = {"path": hook.path}
        if hook.args:
            entry["args"] = list(hook.args)
        if hook.env:
            entry["env"] = list(hook.env)
        if hook.timeout is not None:
            entry["timeout"] = hook.timeout
        hooks = self.doc["hooks"]
        key = OCI_HOOK_KEYS[hook.hook_name]
        if hooks.get(key) is None:
            hooks[key] = []
        hooks[key].append(entry)

    def add_gids(self, gids: tuple[int, ...]) -> None:
        user = self._process().setdefault("user", {"uid": 0, "gid": 0})
        have = list(user.get("additionalGids") or [])
        user["additionalGids"] = have + [g for g in gids if g not in have]

    def set_intel_rdt(self, rdt: dict[str, Any]) -> None:
        self._linux()["intelRdt"] = rdt

    def add_net_device(self, host_name: str, name: str) -> None:
        self._linux().setdefault("netDevices", {})[host_name] = {"name": name}
