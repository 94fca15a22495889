"""What `podvm prepare` did, per device: the status file and the console lines.

The status file is what an operator (or a support bundle) reads after boot; the console lines reach
the cloud's serial console, the one place a failed boot can still be seen from outside.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

State = Literal["ready", "failed"]


@dataclass
class DeviceRecord:
    """One planned device and what became of it."""

    name: str  # the qualified CDI name the adaptor injects
    kind: Literal["gpu", "mig", "rdma"]
    gpu: int | None = None  # NVML index of the GPU (of the parent GPU for MIG)
    profile: str = ""
    start: int | None = None  # first memory slot (MIG)
    uuid: str = ""
    gi: int | None = None
    ci: int | None = None
    mig_index: int | None = None  # the raw NVML MIG index (what nvidia-ctk would name it by)
    rdma_index: int | None = None  # which /dev/infiniband/uverbs<N>, in N order
    state: State = "failed"
    error: str = ""

    def fail(self, reason: str) -> None:
        if self.state != "failed" or not self.error:
            self.state = "failed"
            self.error = reason

    def what(self) -> str:
        if self.kind == "mig":
            return f"{self.profile} at GPU {self.gpu} slot {self.start}"
        if self.kind == "gpu":
            return f"GPU {self.gpu}"
        return "RDMA device"

    def line(self) -> str:
        """One console line."""
        if self.state == "ready":
            ids = f", GI {self.gi} CI {self.ci}" if self.kind == "mig" else ""
            return f"{self.name}: ready {self.uuid} ({self.what()}{ids})"
        return f"{self.name}: failed ({self.what()}): {self.error}"


def status_json(
    records: Sequence[DeviceRecord], source: str, specs: Sequence[str], result: str
) -> dict[str, Any]:
    return {
        "result": result,
        "layout_source": source,
        "cdi_specs": list(specs),
        "devices": [asdict(r) for r in records],
    }


def write_atomic(path: Path, text: str, mode: int = 0o644) -> bool:
    """Replace `path` with `text` unless it already holds exactly that; True when written."""
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def write_status(path: Path, document: dict[str, Any]) -> bool:
    return write_atomic(path, json.dumps(document, indent=2, sort_keys=True) + "\n")
