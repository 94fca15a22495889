"""The cloud account's own quotas: limits every node of the cluster shares.

A node's `--gpu-quota` counts only its own sandboxes, but a cloud refuses a VM against quotas of
the whole account: AWS Service Quotas' vCPU limits per instance class ("Running On-Demand P
instances"), Azure's vCPU usages per VM family (`standardNCadsH100v5Family`), GCP's GPU quotas
per region (`NVIDIA_H100_GPUS`, `PREEMPTIBLE_NVIDIA_H100_GPUS`). Each cloud's reader
(providers.clouds.quotas) turns what its API reports into `AccountLimit`s with their current
usage; selection's candidates are then ranked away from a limit the VM would exceed, with the
reason, and the per-node pool stays the floor.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from providers.core.catalog import InstanceType

__all__ = ["AccountLimit", "AccountQuota", "AccountQuotaCache", "instance_class"]

log = logging.getLogger(__name__)

Match = Literal["class", "family", "model", "all"]


def instance_class(family: str) -> str:
    """AWS's instance class of a family: its leading letters (p5 -> p, g6e -> g, inf2 -> inf)."""
    found = re.match(r"[a-z]+", family.lower())
    return found.group(0) if found else ""


def _family(t: InstanceType) -> str:
    if t.family:
        return t.family.lower()
    name = t.name.lower()
    return name.split(".", 1)[0] if "." in name else name.split("-", 1)[0]


@dataclass(frozen=True)
class AccountLimit:
    """One account quota: what it counts (vCPUs or GPUs, of which types), its limit and usage.

    `match` says how `keys` pick the types it counts: the instance "class" (AWS: the P quota counts
    p3, p4d, p5, p6-b200, `instance_class`), the "family" exactly (Azure's SKU family, lower case),
    the GPU "model" (GCP: canonical model ids), or "all" types. `spot` None: every market; True
    or False: that one only.
    """

    name: str
    kind: Literal["vcpus", "gpus"]
    match: Match
    keys: tuple[str, ...]
    limit: float
    used: float
    spot: bool | None = None

    def amount(self, t: InstanceType, spot: bool, attached: tuple[str, int] | None = None) -> float:
        """What a VM of type `t` (with `attached` GPUs) takes of this limit."""
        if self.spot is not None and self.spot != spot:
            return 0.0
        model, gpus = attached if attached else (None, 0)
        if t.gpu is not None and not attached:
            model, gpus = t.gpu.model, t.gpu.count
        if self.match == "model":
            counted = model in self.keys
        elif self.match == "family":
            counted = _family(t) in self.keys
        elif self.match == "class":
            counted = instance_class(_family(t)) in self.keys
        else:
            counted = True
        if not counted:
            return 0.0
        return float(t.vcpus if self.kind == "vcpus" else gpus)

    def __str__(self) -> str:
        unit = "vCPUs" if self.kind == "vcpus" else "GPUs"
        return f"account quota {self.name} ({_n(self.used)}/{_n(self.limit)} {unit})"


def _n(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


@dataclass(frozen=True)
class AccountQuota:
    """Every account limit a cloud reported, as read at `read_at` (a time.time() value)."""

    cloud: str
    region: str
    limits: tuple[AccountLimit, ...] = ()
    read_at: float = 0.0
    notes: tuple[str, ...] = field(default=())  # what could not be read, and why

    def over(
        self,
        t: InstanceType,
        spot: bool,
        attached: tuple[str, int] | None = None,
        pending: Sequence[tuple[InstanceType, bool, tuple[str, int] | None]] = (),
    ) -> str:
        """Why a VM of type `t` would exceed an account limit ("" when it fits): the account's
        usage plus `pending` (this node's creates the cloud does not count yet) plus it."""
        for limit in self.limits:
            need = limit.amount(t, spot, attached)
            if need <= 0:
                continue
            extra = sum(limit.amount(p, s, a) for p, s, a in pending)
            if limit.used + extra + need > limit.limit:
                return f"{limit} exhausted: {t.name} needs {_n(need)} more"
        return ""

    def to_dict(self) -> dict[str, object]:
        """What the status API shows: each limit with its usage, and what could not be read."""
        return {
            "cloud": self.cloud,
            "region": self.region,
            "read_at": self.read_at,
            "limits": [
                {
                    "name": limit.name,
                    "counts": limit.kind,
                    "of": list(limit.keys) or "all",
                    "market": {None: "any", True: "spot", False: "on-demand"}[limit.spot],
                    "limit": limit.limit,
                    "used": limit.used,
                    "exhausted": limit.used >= limit.limit,
                }
                for limit in self.limits
            ],
            "notes": list(self.notes),
        }


class AccountQuotaCache:
    """The last account quota read, refreshed in a thread when older than `ttl_seconds`.

    Reading is a few blocking SDK calls, so it never runs in the event loop; a failed read keeps
    the previous answer (or none) and is logged, never fails a StartVM: the per-node pool and the
    cloud's own refusal remain.
    """

    def __init__(
        self,
        read: Callable[[], AccountQuota | None],
        ttl_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._value: AccountQuota | None = None
        self._at: float | None = None
        self._lock = asyncio.Lock()

    @property
    def value(self) -> AccountQuota | None:
        """The last quota read (what the status API shows), None before the first."""
        return self._value

    async def get(self) -> AccountQuota | None:
        async with self._lock:
            now = self._clock()
            if self._at is None or now - self._at >= self.ttl_seconds:
                try:
                    self._value = await asyncio.to_thread(self._read)
                except Exception as exc:  # an SDK or network failure: keep the last answer
                    log.warning("reading the cloud account's quotas failed: %s", exc)
                self._at = now
            return self._value
