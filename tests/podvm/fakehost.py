"""A pod VM's /dev, /proc and driver files in a temporary tree, matching a fake NVML machine.

Device nodes are real character devices (mknod, so root is needed), with the majors and minors a
real VM has: /dev/nvidia<minor> is 195:<minor>, the MIG capability nodes use the nvidia-caps
major from /proc/devices. mig-minors lists every gpu/gi/ci capability of every GPU minor, with
minors from a shuffled permutation: the only way to find one is to read the file.
"""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import pytest

from tests.podvm.fake_nvml import Machine

CAPS_MAJOR = 509
UVM_MAJOR = 510
DRIVER_LIBS = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so")


def need_mknod() -> None:
    """Skip (outside CI) where device nodes cannot be made."""
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("needs root to create device nodes (runs in CI)")


def _node(path: Path, major: int, minor: int, mode: int = 0o666) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)


def _file(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def mig_minors(gpu_minors: list[int], seed: int = 0) -> dict[str, int]:
    caps = ["config", "monitor"]
    for g in sorted(gpu_minors):
        for gi in range(15):
            caps.append(f"gpu{g}/gi{gi}/access")
            caps += [f"gpu{g}/gi{gi}/ci{ci}/access" for ci in range(8)]
    minors = list(range(1, len(caps) + 1))
    random.Random(seed).shuffle(minors)
    return dict(zip(caps, minors, strict=True))


def build(
    root: Path, machine: Machine, *, rdma: int = 0, boot_id: str = "boot-1"
) -> dict[str, int]:
    """The tree for `machine`; returns its mig-minors table."""
    need_mknod()
    gpu_minors = [g.minor for g in machine.gpus]
    for minor in gpu_minors:
        _node(root / f"dev/nvidia{minor}", 195, minor)
    _node(root / "dev/nvidiactl", 195, 255)
    _node(root / "dev/nvidia-modeset", 195, 254)
    _node(root / "dev/nvidia-uvm", UVM_MAJOR, 0)
    _node(root / "dev/nvidia-uvm-tools", UVM_MAJOR, 1)
    for i in range(rdma):
        _node(root / f"dev/infiniband/uverbs{i}", 231, 192 + i)
    if rdma:
        _node(root / "dev/infiniband/rdma_cm", 10, 58)
    table = mig_minors(gpu_minors)
    _file(
        root / "proc/driver/nvidia-caps/mig-minors",
        "".join(f"{cap} {minor}\n" for cap, minor in table.items()) + "garbage line\n",
    )
    _file(
        root / "proc/devices",
        f"Character devices:\n  1 mem\n195 nvidia\n{CAPS_MAJOR} nvidia-caps\n"
        f"{UVM_MAJOR} nvidia-uvm\n\nBlock devices:\n  8 sd\n",
    )
    set_boot(root, boot_id)
    version = machine.driver_version
    for lib in DRIVER_LIBS:
        _file(root / f"usr/lib/x86_64-linux-gnu/{lib}.{version}")
        (root / f"usr/lib/x86_64-linux-gnu/{lib}.1").symlink_to(f"{lib}.{version}")
    _file(root / "usr/lib/x86_64-linux-gnu/libc.so.6")
    _file(root / f"lib/firmware/nvidia/{version}/gsp_ga10x.bin")
    _file(root / "usr/bin/nvidia-smi")
    _file(root / "usr/bin/nvidia-cdi-hook")
    return table


def set_boot(root: Path, boot_id: str) -> None:
    _file(root / "proc/sys/kernel/random/boot_id", boot_id + "\n")
