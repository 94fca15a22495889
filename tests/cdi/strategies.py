"""Hypothesis strategies for CDI specs (cdiVersion <= 0.5.0, what the reference accepts) and OCI
runtime specs, plus the mutations that make a spec invalid for both implementations."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

VENDORS = ["vendor.com", "nvidia.com", "ex-ample_1.org", "ab"]
CLASSES = ["gpu", "net-dev", "x_y", "Cls9"]
ENV_KEYS = ["A", "PATH", "NVIDIA_VISIBLE_DEVICES", "B_1"]
DEV_PATHS = ["/dev/x0", "/dev/x1", "/dev/vendor/ctl", "/dev/x3"]
MOUNT_PATHS = ["/a", "/a/b", "/a/b/c", "/usr/lib/x.so", "/z", "//x/y", "/a/../q", "/m/./n/"]
HOOK_NAMES = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
]
NAME_CHARS = "abcXYZ019_.-:"

word = st.text("abcdefxyz019", min_size=1, max_size=6)
device_name = st.builds(
    lambda first, inner, last: first + inner + last if last else first,
    st.sampled_from("ab0Z9"),
    st.text(NAME_CHARS, max_size=5),
    st.sampled_from(["", "a", "7", "Q"]),
)
env_item = st.builds(lambda k, v: f"{k}={v}", st.sampled_from(ENV_KEYS), word)


@st.composite
def device_node(draw: st.DrawFn) -> dict[str, Any]:
    node: dict[str, Any] = {"path": draw(st.sampled_from(DEV_PATHS))}
    how = draw(st.sampled_from(["p", "full", "stat", "stat-typed"]))
    if how == "p":
        node["type"] = "p"
    elif how == "full":
        node["type"] = draw(st.sampled_from("bcu"))
        node["major"] = draw(st.integers(1, 511))
        node["minor"] = draw(st.integers(0, 1 << 20))
    else:  # filled from the host device, identical for both implementations
        node["hostPath"] = draw(st.sampled_from(["/dev/null", "/dev/zero"]))
        if how == "stat-typed":
            node["type"] = "c"
    if draw(st.booleans()):
        node["permissions"] = draw(st.sampled_from(["r", "rw", "rwm", "m", "wm"]))
    for key in ("fileMode", "uid", "gid"):
        if draw(st.integers(0, 3)) == 0:
            node[key] = draw(st.integers(0, 70000))
    return node


@st.composite
def mount(draw: st.DrawFn) -> dict[str, Any]:
    m: dict[str, Any] = {
        "hostPath": draw(st.sampled_from(["/host/a", "/host/lib.so", "tmpfs"])),
        "containerPath": draw(st.sampled_from(MOUNT_PATHS)),
    }
    if draw(st.booleans()):
        m["options"] = draw(
            st.lists(st.sampled_from(["ro", "bind", "nosuid", "rbind"]), min_size=1, max_size=3)
        )
    if draw(st.booleans()):
        m["type"] = draw(st.sampled_from(["bind", "tmpfs"]))
    return m


@st.composite
def hook(draw: st.DrawFn) -> dict[str, Any]:
    h: dict[str, Any] = {
        "hookName": draw(st.sampled_from(HOOK_NAMES)),
        "path": draw(st.sampled_from(["/usr/bin/hook", "/bin/h2"])),
    }
    if draw(st.booleans()):
        h["args"] = draw(st.lists(word, min_size=1, max_size=3))
    if draw(st.booleans()):
        h["env"] = draw(st.lists(env_item, min_size=1, max_size=2))
    if draw(st.booleans()):
        h["timeout"] = draw(st.integers(1, 100))
    return h


@st.composite
def edits(draw: st.DrawFn, non_empty: bool) -> dict[str, Any]:
    e: dict[str, Any] = {}
    for key, strat in (
        ("env", env_item),
        ("deviceNodes", device_node()),
        ("mounts", mount()),
        ("hooks", hook()),
    ):
        items = draw(st.lists(strat, max_size=3))
        if items:
            e[key] = items
    if non_empty and not e:
        e["env"] = [draw(env_item)]
    return e


def needed_version(doc: dict[str, Any]) -> str:
    edits_all = [doc.get("containerEdits", {})] + [d["containerEdits"] for d in doc["devices"]]
    need = "0.3.0"
    if any(m.get("type") for e in edits_all for m in e.get("mounts", [])):
        need = "0.4.0"
    if any(n.get("hostPath") for e in edits_all for n in e.get("deviceNodes", [])) or any(
        d["name"][0].isdigit() for d in doc["devices"]
    ):
        need = "0.5.0"
    return need


@st.composite
def cdi_spec(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(device_name, min_size=1, max_size=3, unique=True))
    doc: dict[str, Any] = {
        "cdiVersion": "",
        "kind": f"{draw(st.sampled_from(VENDORS))}/{draw(st.sampled_from(CLASSES))}",
        "devices": [{"name": n, "containerEdits": draw(edits(True))} for n in names],
    }
    if draw(st.booleans()):
        doc["containerEdits"] = draw(edits(False))
    need = needed_version(doc)
    doc["cdiVersion"] = draw(st.sampled_from([v for v in ("0.3.0", "0.4.0", "0.5.0") if v >= need]))
    return doc


def _set(path: list[Any], value: Any) -> Any:
    def mutate(doc: dict[str, Any]) -> dict[str, Any]:
        doc = json.loads(json.dumps(doc))
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return doc

    return mutate


def _dup_device(doc: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    doc["devices"].append(doc["devices"][0])
    return doc


# Each makes any spec from cdi_spec() invalid for both implementations.
MUTATIONS = {
    "version-unknown": _set(["cdiVersion"], "0.0.9"),
    "version-newer-than-reference-and-annotations": _set(["annotations"], {"a": "b"}),
    "unknown-top-field": _set(["bogus"], 1),
    "unknown-edit-field": _set(["devices", 0, "containerEdits", "bogus"], []),
    "kind-no-class": _set(["kind"], "vendor.com"),
    "kind-bad-vendor": _set(["kind"], "1vendor/gpu"),
    "kind-dot-in-class": _set(["kind"], "vendor.com/g.pu"),
    "name-bad-start": _set(["devices", 0, "name"], "-x"),
    "name-slash": _set(["devices", 0, "name"], "a/b"),
    "name-empty": _set(["devices", 0, "name"], ""),
    "empty-device-edits": _set(["devices", 0, "containerEdits"], {}),
    "env-no-equals": _set(["devices", 0, "containerEdits", "env"], ["NOEQ"]),
    "env-empty-key": _set(["devices", 0, "containerEdits", "env"], ["=v"]),
    "hook-bad-name": _set(
        ["devices", 0, "containerEdits", "hooks"], [{"hookName": "preStart", "path": "/h"}]
    ),
    "hook-empty-path": _set(
        ["devices", 0, "containerEdits", "hooks"], [{"hookName": "prestart", "path": ""}]
    ),
    "node-bad-type": _set(
        ["devices", 0, "containerEdits", "deviceNodes"],
        [{"path": "/dev/x", "type": "x", "major": 1}],
    ),
    "node-bad-permissions": _set(
        ["devices", 0, "containerEdits", "deviceNodes"],
        [{"path": "/dev/x", "type": "p", "permissions": "rwx"}],
    ),
    "node-empty-path": _set(["devices", 0, "containerEdits", "deviceNodes"], [{"type": "p"}]),
    "node-float-major": _set(
        ["devices", 0, "containerEdits", "deviceNodes"],
        [{"path": "/dev/x", "type": "c", "major": 1.5}],
    ),
    "node-string-major": _set(
        ["devices", 0, "containerEdits", "deviceNodes"],
        [{"path": "/dev/x", "type": "c", "major": "1"}],
    ),
    "mount-empty-host": _set(
        ["devices", 0, "containerEdits", "mounts"], [{"hostPath": "", "containerPath": "/x"}]
    ),
    "mount-empty-container": _set(
        ["devices", 0, "containerEdits", "mounts"], [{"hostPath": "/x", "containerPath": ""}]
    ),
    "env-number": _set(["devices", 0, "containerEdits", "env"], [1]),
    "duplicate-device": _dup_device,
    "devices-not-a-list": _set(["devices"], {"name": "x"}),
}


@st.composite
def oci_spec(draw: st.DrawFn) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from([*ENV_KEYS, "HOME", "TERM"]), unique=True, max_size=4))
    doc: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {
            "user": {
                "uid": draw(st.sampled_from([0, 0, 1000])),
                "gid": draw(st.sampled_from([0, 0, 100])),
            },
            "args": ["/bin/sh"],
            "env": [f"{k}={draw(word)}" for k in keys],
            "cwd": "/",
        },
        "root": {"path": "rootfs"},
        "hostname": "h",
    }
    dests = draw(
        st.lists(
            st.sampled_from(["/proc", "/dev", "/a", "/a/b", "/etc/hosts", "/z/y/x"]),
            unique=True,
            max_size=4,
        )
    )
    if dests:
        doc["mounts"] = [
            {"destination": d, "type": "bind", "source": "/s" + d, "options": ["rbind"]}
            for d in dests
        ]
    paths = draw(st.lists(st.sampled_from([*DEV_PATHS, "/dev/fuse"]), unique=True, max_size=3))
    linux: dict[str, Any] = {}
    if paths:
        linux["devices"] = [
            {"path": p, "type": "c", "major": 10, "minor": i} for i, p in enumerate(paths)
        ]
        linux["resources"] = {"devices": [{"allow": False, "access": "rwm"}]}
    if linux:
        doc["linux"] = linux
    if draw(st.booleans()):
        doc["hooks"] = {"prestart": [{"path": "/bin/pre"}]}
    return doc
