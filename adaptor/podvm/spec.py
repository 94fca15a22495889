"""The CDI specs `podvm prepare` writes: each name the adaptor injects, bound to the device created.

One spec file per kind, named `peerpods-<vendor>_<class>.json`, beside whatever
`nvidia-ctk cdi generate` writes (`nvidia.yaml`, kind `nvidia.com/gpu`): our default kind is
`peerpods.io/gpu`, so the two never define the same device. Contents follow what nvidia-ctk puts in
its spec (docs/podvm.md, Names and nvidia-ctk): a MIG device is its parent `/dev/nvidia<minor>` and
its GI and CI
access nodes under `/dev/nvidia-caps` (minors read from mig-minors, keyed by the GPU's minor
number); a whole GPU is `/dev/nvidia<minor>`; the spec-level edits carry the control nodes, the
driver's libraries, firmware, binaries and sockets as read-only bind mounts, and the
nvidia-cdi-hook calls when the image has the hook. `cdiVersion` is the lowest the content needs.
A device that failed is left out, so a container naming it fails at CreateContainer instead of
running without it (or with another's).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from adaptor.cdi import (
    ContainerEdits,
    Device,
    DeviceNode,
    Hook,
    Spec,
    SpecError,
    load_spec,
    minimum_version,
    parse_qualified_name,
    parse_spec,
    spec_to_dict,
)
from adaptor.podvm.host import HOOK, Host
from adaptor.podvm.nvml import Gpu
from adaptor.podvm.status import DeviceRecord, write_atomic

log = logging.getLogger(__name__)

SPEC_PREFIX = "peerpods-"


def spec_file_name(kind: str) -> str:
    return SPEC_PREFIX + kind.replace("/", "_") + ".json"


def device_nodes(
    record: DeviceRecord,
    gpus: Mapping[int, Gpu],
    host: Host,
    minors: Mapping[str, int],
    rdma: Sequence[DeviceNode],
) -> list[DeviceNode]:
    """The nodes of one created device; fails the record (and returns []) when one is missing."""
    if record.kind == "rdma":
        index = int(record.rdma_index or 0)
        if index >= len(rdma):
            record.fail(
                f"no /dev/infiniband/uverbs device for RDMA device {index} ({len(rdma)} present)"
            )
            return []
        return [rdma[index]]
    gpu = gpus.get(record.gpu if record.gpu is not None else -1)
    if gpu is None:
        record.fail("its GPU is gone")
        return []
    parent = host.node(f"/dev/nvidia{gpu.minor}")
    if parent is None:
        record.fail(f"/dev/nvidia{gpu.minor} does not exist")
        return []
    if record.kind == "gpu":
        return [parent]
    nodes = [parent]
    for cap in (
        f"gpu{gpu.minor}/gi{record.gi}/access",
        f"gpu{gpu.minor}/gi{record.gi}/ci{record.ci}/access",
    ):
        minor = minors.get(cap)
        if minor is None:
            record.fail(f"{cap} is not in mig-minors")
            return []
        node = host.cap_node(minor)
        if node is None:
            record.fail(f"/dev/nvidia-caps/nvidia-cap{minor} ({cap}) is missing")
            return []
        nodes.append(node)
    return nodes


def gpu_common_edits(host: Host, driver_version: str) -> ContainerEdits:
    """What every container with any GPU device needs (spec-level edits)."""
    mounts = host.driver_mounts(driver_version)
    libraries = host.driver_libraries(driver_version)
    hooks: list[Hook] = []
    if host.has_hook():
        cuda = next((p for p in libraries if p.rsplit("/", 1)[-1].startswith("libcuda.so.")), "")
        if cuda:
            link = cuda.rsplit("/", 1)[0] + "/libcuda.so"
            hooks.append(_hook("create-symlinks", "--link", f"libcuda.so.1::{link}"))
        folders = [a for d in host.lib_dirs(libraries) for a in ("--folder", d)]
        if folders:
            hooks.append(_hook("update-ldcache", *folders))
    return ContainerEdits(
        env=("NVIDIA_VISIBLE_DEVICES=void",),
        device_nodes=tuple(host.control_nodes()),
        mounts=tuple(mounts),
        hooks=tuple(hooks),
    )


def _hook(name: str, *args: str) -> Hook:
    return Hook(
        hook_name="createContainer",
        path=HOOK,
        args=("nvidia-cdi-hook", name, *args),
        env=("NVIDIA_CTK_DEBUG=false",),
    )


def build_specs(
    records: Sequence[DeviceRecord],
    gpus: Mapping[int, Gpu],
    host: Host,
    driver_version: str,
) -> dict[str, Spec]:
    """kind -> spec for every ready device; a device whose nodes are missing is failed."""
    minors = host.mig_minors()
    rdma = host.rdma_nodes()
    devices: dict[str, list[Device]] = {}
    kinds_gpu: set[str] = set()
    for record in records:
        if record.state != "ready":
            continue
        nodes = device_nodes(record, gpus, host, minors, rdma)
        if not nodes:
            continue
        kind, name = _split(record.name)
        devices.setdefault(kind, []).append(Device(name, ContainerEdits(device_nodes=tuple(nodes))))
        if record.kind != "rdma":
            kinds_gpu.add(kind)
    common_gpu = gpu_common_edits(host, driver_version) if kinds_gpu else ContainerEdits()
    common_rdma = ContainerEdits(device_nodes=tuple(host.rdma_common_nodes()))
    specs: dict[str, Spec] = {}
    for kind, devs in sorted(devices.items()):
        edits = common_gpu if kind in kinds_gpu else common_rdma
        draft = Spec(version="1.1.0", kind=kind, devices=tuple(devs), edits=edits)
        specs[kind] = Spec(
            version=minimum_version(draft), kind=kind, devices=draft.devices, edits=edits
        )
    return specs


def _split(qualified: str) -> tuple[str, str]:
    name = parse_qualified_name(qualified)
    return f"{name.vendor}/{name.class_}", name.name


def write_specs(specs: Mapping[str, Spec], cdi_dir: Path) -> list[str]:
    """Write each spec (unchanged files are left alone); remove our specs of kinds no longer
    present. Returns the paths of the specs now in place."""
    written: list[str] = []
    for kind, spec in specs.items():
        text = json.dumps(spec_to_dict(spec), indent=2) + "\n"
        path = cdi_dir / spec_file_name(kind)
        parse_spec(text, str(path))  # our own strict loader must accept what we write
        write_atomic(path, text)
        written.append(str(path))
    if cdi_dir.is_dir():
        for stale in cdi_dir.glob(f"{SPEC_PREFIX}*.json"):
            if str(stale) not in written:
                stale.unlink(missing_ok=True)
    return written


def clashes(kinds: Sequence[str], spec_dirs: Sequence[Path]) -> list[str]:
    """Other spec files defining one of our kinds (their same-named devices would conflict)."""
    out: list[str] = []
    for directory in spec_dirs:
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if path.name.startswith(SPEC_PREFIX) or path.suffix not in (".json", ".yaml", ".yml"):
                continue
            try:
                spec = load_spec(str(path))
            except SpecError:
                continue
            if spec.kind in kinds:
                out.append(f"{path} also defines kind {spec.kind}")
    return out
