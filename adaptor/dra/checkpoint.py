"""What the kubelet plugin prepared, on disk: claims by UID, each with the pods it serves.

Preparation must be idempotent and unpreparation must work after a restart (or from another
process of the plugin), so every change is written before its answer goes back: the whole
record to a temporary file, fsync-ed, renamed over the last one. The adaptor reads the same
file at CreateVM to plan a pod's VM from the devices prepared for its UID.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from providers.core.errors import InvalidRequest
from providers.dra.allocation import AllocatedDevice

__all__ = ["Checkpoint", "CheckpointError", "PreparedClaim"]

VERSION = 1


class CheckpointError(InvalidRequest):
    """The checkpoint file exists but is not one this plugin wrote."""


@dataclass(frozen=True)
class PreparedClaim:
    """One prepared claim: who it is, the pods it is reserved for, its devices and CDI IDs."""

    uid: str
    namespace: str
    name: str
    pod_uids: tuple[str, ...]
    devices: tuple[AllocatedDevice, ...]
    cdi_ids: tuple[str, ...] = field(default=())
    pod_names: tuple[str, ...] = field(default=())  # the same pods, by name (their namespace's)

    def to_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "pod_uids": list(self.pod_uids),
            "devices": [d.to_dict() for d in self.devices],
            "cdi_ids": list(self.cdi_ids),
            "pod_names": list(self.pod_names),
        }

    @classmethod
    def from_dict(cls, data: Any) -> PreparedClaim:
        if not isinstance(data, dict):
            raise CheckpointError("a prepared claim is not an object")
        try:
            return cls(
                uid=str(data["uid"]),
                namespace=str(data["namespace"]),
                name=str(data["name"]),
                pod_uids=tuple(str(u) for u in data.get("pod_uids") or ()),
                devices=tuple(AllocatedDevice.from_dict(d) for d in data.get("devices") or ()),
                cdi_ids=tuple(str(i) for i in data.get("cdi_ids") or ()),
                pod_names=tuple(str(n) for n in data.get("pod_names") or ()),
            )
        except (KeyError, TypeError) as exc:
            raise CheckpointError(f"a prepared claim is malformed: {exc}") from None


class Checkpoint:
    """The prepared claims of one node, kept in `path` (created 0600 in a 0700 directory)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def _read(self) -> dict[str, PreparedClaim]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{self.path}: {exc}") from None
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            raise CheckpointError(f"{self.path}: not a version {VERSION} checkpoint")
        claims = [PreparedClaim.from_dict(c) for c in raw.get("claims") or []]
        return {c.uid: c for c in claims}

    def _write(self, claims: dict[str, PreparedClaim]) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        body = {"version": VERSION, "claims": [c.to_dict() for c in claims.values()]}
        fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(body, handle, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, uid: str) -> PreparedClaim | None:
        with self._lock:
            return self._read().get(uid)

    def put(self, claim: PreparedClaim) -> None:
        with self._lock:
            claims = self._read()
            claims[claim.uid] = claim
            self._write(claims)

    def remove(self, uid: str) -> PreparedClaim | None:
        with self._lock:
            claims = self._read()
            gone = claims.pop(uid, None)
            if gone is not None:
                self._write(claims)
            return gone

    def for_pod(self, pod_uid: str) -> list[PreparedClaim]:
        """The claims prepared for one pod (what its VM must carry), in UID order."""
        with self._lock:
            claims = self._read()
        return sorted((c for c in claims.values() if pod_uid in c.pod_uids), key=lambda c: c.uid)

    def for_pod_name(self, namespace: str, name: str) -> list[PreparedClaim]:
        """The claims prepared for the pod `namespace/name` (CreateVM names a pod, not its UID)."""
        with self._lock:
            claims = self._read()
        found = (c for c in claims.values() if c.namespace == namespace and name in c.pod_names)
        return sorted(found, key=lambda c: c.uid)

    def __iter__(self) -> Iterator[PreparedClaim]:
        with self._lock:
            return iter(list(self._read().values()))
