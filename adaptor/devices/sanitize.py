"""GPU access a container did not get from its plan is taken away before the pod VM sees it.

A pod VM image that still runs NVIDIA's legacy runtime hook gives a container every GPU when its
environment says `NVIDIA_VISIBLE_DEVICES=all` (or, for a legacy CUDA image, when it only sets
`CUDA_VERSION`), and a `/dev/nvidia*` device or cgroup rule in the OCI spec opens a GPU node
directly. None of that comes from the device plan, so every CreateContainer is cleaned before
its planned CDI devices are added: `NVIDIA_VISIBLE_DEVICES` is set to `void` (the value NVIDIA's
own CDI specs use, meaning "none through the hook"), `/dev/nvidia*` device entries, the cgroup
rules for them (and any for NVIDIA's major 195), and NVIDIA's device-list volume mounts are
removed. A container with planned devices then gets exactly what their CDI names bring (CDI
edits applied later, in the guest or by the adaptor, add their own nodes, rules and env).
"""

from __future__ import annotations

from typing import Any

__all__ = ["VISIBLE_DEVICES", "strip_gpu_access"]

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
_NVIDIA_MAJOR = 195  # /dev/nvidia<N>, /dev/nvidiactl, /dev/nvidia-modeset
_DEVICE_LIST_MOUNTS = "/var/run/nvidia-container-devices"
_LEGACY_CUDA = "CUDA_VERSION"


def _is_nvidia_path(path: str) -> bool:
    return path.startswith("/dev/nvidia")


def strip_gpu_access(oci: Any) -> bool:
    """Remove from an OCI spec (agent_pb2.Spec) every GPU access it carries; True if changed."""
    changed = False
    env = list(oci.Process.Env)
    keys = [e.split("=", 1)[0] for e in env]
    if VISIBLE_DEVICES in keys or _LEGACY_CUDA in keys:
        cleaned = [e for e in env if e.split("=", 1)[0] != VISIBLE_DEVICES]
        cleaned.append(f"{VISIBLE_DEVICES}=void")
        if cleaned != env:
            del oci.Process.Env[:]
            oci.Process.Env.extend(cleaned)
            changed = True
    linux = oci.Linux
    removed = {(d.Type, d.Major, d.Minor) for d in linux.Devices if _is_nvidia_path(d.Path)}
    if removed:
        kept = [d for d in linux.Devices if not _is_nvidia_path(d.Path)]
        del linux.Devices[:]
        linux.Devices.extend(kept)
        changed = True
    rules = linux.Resources.Devices
    if len(rules):
        kept_rules = [
            r
            for r in rules
            if not (r.Allow and (r.Major == _NVIDIA_MAJOR or (r.Type, r.Major, r.Minor) in removed))
        ]
        if len(kept_rules) != len(rules):
            del rules[:]
            rules.extend(kept_rules)
            changed = True
    mounts = [m for m in oci.Mounts if m.destination.startswith(_DEVICE_LIST_MOUNTS)]
    if mounts:
        kept_mounts = [m for m in oci.Mounts if not m.destination.startswith(_DEVICE_LIST_MOUNTS)]
        del oci.Mounts[:]
        oci.Mounts.extend(kept_mounts)
        changed = True
    return changed
