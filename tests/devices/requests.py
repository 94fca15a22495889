"""CreateContainerRequest payloads as containerd and the Kata shim send them (test helper)."""

from __future__ import annotations

from adaptor.ttrpc.gen import agent_pb2
from providers.core.contract import CONTAINER_NAME, CONTAINER_TYPE, DEVICES, SANDBOX_ID


def _key(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def raw_field(number: int, data: bytes) -> bytes:
    """A length-delimited field, as a newer peer would send one our schema does not declare."""
    return _key(number, 2) + _len(data) + data


def _len(data: bytes) -> bytes:
    return _varint(len(data))


def user_field(uid: int, gid: int) -> bytes:
    """Process.User (field 3), unknown to the partial schema."""
    body = _key(1, 0) + _varint(uid) + _key(2, 0) + _varint(gid)
    return raw_field(3, body)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def create_container(
    name: str,
    *,
    sandbox: bool = False,
    plan_json: str = "",
    env: int = 5,
    mounts: int = 5,
    extra_annotations: dict[str, str] | None = None,
) -> agent_pb2.CreateContainerRequest:
    req = agent_pb2.CreateContainerRequest(container_id=f"c-{name}", exec_id=f"c-{name}")
    spec = req.OCI
    spec.Version = "1.1.0"
    spec.Hostname = "pod"
    spec.Process.Args.extend(["/bin/sh", "-c", "sleep inf"])
    spec.Process.Env.extend(["PATH=/usr/bin:/bin"] + [f"VAR_{i}=value-{i}" for i in range(env)])
    spec.Process.Cwd = "/"
    spec.Root.Path = "/run/kata-containers/shared/containers/rootfs"
    for i in range(mounts):
        m = spec.Mounts.add(
            destination=f"/data/vol{i}", source=f"/run/kata/shared/{i}", type="bind"
        )
        m.options.extend(["rbind", "rprivate", "rw"])
    annotations = spec.Annotations
    annotations[CONTAINER_TYPE] = "sandbox" if sandbox else "container"
    annotations[SANDBOX_ID] = "0123456789abcdef"
    if not sandbox:
        annotations[CONTAINER_NAME] = name
    if plan_json:
        annotations[DEVICES] = plan_json
    annotations.update(extra_annotations or {})
    spec.Linux.CgroupsPath = "/kubepods/pod1/" + name
    return req
