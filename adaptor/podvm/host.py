"""What the pod VM's own filesystem says about its devices: device nodes, MIG capability minors,
driver files and RDMA devices, all read under `root` (the VM's `/`, a temporary tree in tests).

Paths written into CDI specs are always the VM's absolute paths (`/dev/nvidia0`), never
`root`-prefixed: the spec is applied inside the VM. Device nodes are written fully specified
(type, major, minor) from a stat, so applying them needs no stat at all.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from adaptor.cdi import DeviceNode, Mount

log = logging.getLogger(__name__)

MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"
CAPS_DIR = "/dev/nvidia-caps"
CONTROL_NODES = (
    "/dev/nvidia-modeset",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-uvm",
    "/dev/nvidiactl",
)
LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib64",
)
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
BIN_DIRS = ("/usr/bin", "/usr/sbin", "/bin")
SOCKETS = ("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket")
HOOK = "/usr/bin/nvidia-cdi-hook"
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
_NVIDIA_LIB = re.compile(r"^lib(cuda|nv|.*_nvidia|GLX_nvidia|EGL_nvidia|GLESv[12].*_nvidia)")
_CAP_LINE = re.compile(r"^(config|monitor|gpu\d+/gi\d+/access|gpu\d+/gi\d+/ci\d+/access)\s+(\d+)$")


@dataclass(frozen=True)
class Host:
    """The VM's filesystem, seen from `root`."""

    root: Path = Path("/")

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def exists(self, absolute: str) -> bool:
        return self.path(absolute).exists()

    def node(self, absolute: str) -> DeviceNode | None:
        """A character/block device as a fully specified CDI node; None when absent."""
        try:
            st = os.stat(self.path(absolute))
        except OSError:
            return None
        if stat.S_ISCHR(st.st_mode):
            kind = "c"
        elif stat.S_ISBLK(st.st_mode):
            kind = "b"
        else:
            log.warning("%s is not a device node", absolute)
            return None
        return DeviceNode(
            path=absolute,
            type=kind,
            major=os.major(st.st_rdev),
            minor=os.minor(st.st_rdev),
            file_mode=stat.S_IMODE(st.st_mode),
            permissions="rwm",
            gid=st.st_gid or None,
        )

    def boot_id(self) -> str:
        try:
            return self.path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            return ""

    # --- MIG capabilities ----------------------------------------------------------------------

    def mig_minors(self) -> dict[str, int]:
        """`<cap> -> minor` from mig-minors (docs/podvm.md, Names and nvidia-ctk); {} when the file
        is missing."""
        try:
            text = self.path(MIG_MINORS).read_text()
        except OSError:
            return {}
        out: dict[str, int] = {}
        for line in text.splitlines():
            match = _CAP_LINE.match(line.strip())
            if match:
                out[match.group(1)] = int(match.group(2))
        return out

    def caps_major(self) -> int | None:
        """The nvidia-caps character major from /proc/devices."""
        try:
            text = self.path("/proc/devices").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == "nvidia-caps" and parts[0].isdigit():
                return int(parts[0])
        return None

    def cap_node(self, minor: int) -> DeviceNode | None:
        """`/dev/nvidia-caps/nvidia-cap<minor>`, created (as nvidia-modprobe would) if missing."""
        absolute = f"{CAPS_DIR}/nvidia-cap{minor}"
        node = self.node(absolute)
        if node is not None:
            return node
        major = self.caps_major()
        if major is None:
            return None
        try:
            self.path(CAPS_DIR).mkdir(mode=0o755, parents=True, exist_ok=True)
            os.mknod(self.path(absolute), stat.S_IFCHR | 0o444, os.makedev(major, minor))
        except OSError as exc:
            log.warning("cannot create %s: %s", absolute, exc.strerror or exc)
            return None
        return self.node(absolute)

    # --- driver files --------------------------------------------------------------------------

    def control_nodes(self) -> list[DeviceNode]:
        return [n for n in (self.node(p) for p in CONTROL_NODES) if n is not None]

    def driver_libraries(self, version: str) -> list[str]:
        """NVIDIA user-space libraries of this driver version (`lib*.so.<version>`)."""
        found: list[str] = []
        if not version:
            return found
        suffix = f".so.{version}"
        for directory in LIB_DIRS:
            for sub in ("", "/vdpau"):
                base = self.path(directory + sub)
                if not base.is_dir():
                    continue
                for entry in sorted(base.iterdir()):
                    absolute = f"{directory}{sub}/{entry.name}"
                    if (
                        entry.name.endswith(suffix)
                        and _NVIDIA_LIB.match(entry.name)
                        and absolute not in found
                        and not entry.is_symlink()
                    ):
                        found.append(absolute)
        return found

    def driver_mounts(self, version: str) -> list[Mount]:
        """Read-only bind mounts of the driver's libraries, firmware, binaries and sockets."""
        paths = self.driver_libraries(version)
        firmware = f"/lib/firmware/nvidia/{version}"
        if version and self.path(firmware).is_dir():
            paths += [
                f"{firmware}/{f.name}"
                for f in sorted(self.path(firmware).iterdir())
                if f.name.startswith("gsp") and f.name.endswith(".bin")
            ]
        for binary in BINARIES:
            for directory in BIN_DIRS:
                if self.path(f"{directory}/{binary}").is_file():
                    paths.append(f"{directory}/{binary}")
                    break
        paths += [s for s in SOCKETS if self.exists(s)]
        return [Mount(p, p, MOUNT_OPTIONS) for p in paths]

    def lib_dirs(self, libraries: list[str]) -> list[str]:
        return sorted({os.path.dirname(p) for p in libraries if "/vdpau/" not in p})

    def has_hook(self) -> bool:
        return self.path(HOOK).is_file()

    # --- RDMA ----------------------------------------------------------------------------------

    def rdma_nodes(self) -> list[DeviceNode]:
        """`/dev/infiniband/uverbs<N>` in N order (InfiniBand HCAs, RoCE NICs and EFA alike)."""
        base = self.path("/dev/infiniband")
        if not base.is_dir():
            return []
        numbered = sorted(
            (int(e.name[6:]), e.name)
            for e in base.iterdir()
            if e.name.startswith("uverbs") and e.name[6:].isdigit()
        )
        nodes = (self.node(f"/dev/infiniband/{name}") for _, name in numbered)
        return [n for n in nodes if n is not None]

    def rdma_common_nodes(self) -> list[DeviceNode]:
        return [n for n in (self.node("/dev/infiniband/rdma_cm"),) if n is not None]
