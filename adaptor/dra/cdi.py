"""The per-claim transient CDI spec the kubelet plugin writes on the node.

The allocated GPUs exist only in the pod VM, so the node-side device carries no device node
(containerd would stat it on the host): each allocated device is one CDI device whose only edit
is an environment variable naming it, `PEERPODS_DRA_DEVICE_<claim>_<n>=<pool>/<device>`. The
container's OCI spec then carries those variables; at CreateContainer the adaptor reads them
(`devices_in_env`) and gives the container exactly those devices in the pod VM. One spec file
per claim, `<vendor>-<class>_<claimUID>.json`, removed at unprepare.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from adaptor.cdi import ContainerEdits, Device, Spec, minimum_version, parse_spec, spec_to_dict
from providers.dra.allocation import AllocatedDevice

__all__ = ["CDI_CLASS", "CDI_VENDOR", "ENV_PREFIX", "devices_in_env", "remove_spec", "write_spec"]

CDI_VENDOR = "k8s.gpu.peerpods.io"
CDI_CLASS = "claim"
ENV_PREFIX = "PEERPODS_DRA_DEVICE_"
_TOKEN = re.compile(r"[^A-Za-z0-9]")


def _env_name(claim_uid: str, index: int) -> str:
    return f"{ENV_PREFIX}{_TOKEN.sub('', claim_uid).upper()}_{index}"


def spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    return cdi_dir / f"{CDI_VENDOR}-{CDI_CLASS}_{_TOKEN.sub('-', claim_uid)}.json"


def write_spec(cdi_dir: Path, claim_uid: str, devices: Sequence[AllocatedDevice]) -> list[str]:
    """Write the claim's spec (atomically) and return its devices' qualified CDI IDs, in order."""
    entries = tuple(
        Device(
            name=f"{claim_uid}-{index}",
            edits=ContainerEdits(env=(f"{_env_name(claim_uid, index)}={d.pool}/{d.device}",)),
        )
        for index, d in enumerate(devices)
    )
    draft = Spec(version="0.5.0", kind=f"{CDI_VENDOR}/{CDI_CLASS}", devices=entries)
    spec = Spec(version=minimum_version(draft), kind=draft.kind, devices=entries)
    text = json.dumps(spec_to_dict(spec), indent=2) + "\n"
    parse_spec(text)  # what CDI readers accept, or SpecError before anything is written
    cdi_dir.mkdir(parents=True, exist_ok=True)
    target = spec_path(cdi_dir, claim_uid)
    fd, tmp = tempfile.mkstemp(prefix=".peerpods-", suffix=".tmp", dir=cdi_dir)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return [f"{CDI_VENDOR}/{CDI_CLASS}={d.name}" for d in entries]


def remove_spec(cdi_dir: Path, claim_uid: str) -> None:
    spec_path(cdi_dir, claim_uid).unlink(missing_ok=True)


def devices_in_env(env: Iterable[str]) -> list[tuple[str, str]]:
    """The (pool, device) pairs a container's environment names, in the order given."""
    found: list[tuple[str, str]] = []
    for entry in env:
        name, sep, value = entry.partition("=")
        if not sep or not name.startswith(ENV_PREFIX):
            continue
        pool, slash, device = value.partition("/")
        if slash and pool and device and (pool, device) not in found:
            found.append((pool, device))
    return found
