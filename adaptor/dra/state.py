"""Preparing and unpreparing claims: the plugin's logic, with no gRPC in it.

NodePrepareResources carries only each claim's namespace, name and UID: the claim is read from
the API, its UID must be the one asked for (a claim deleted and made again under the same name
is another claim), and its allocation must name this driver. The allocated devices' facts come
from the published slices (model, product, memory), the per-claim CDI spec is written, and the
claim is recorded in the checkpoint before the CDI IDs go back. A claim already in the
checkpoint is answered from it (idempotent); unpreparing a claim the checkpoint does not know
succeeds. Calls block (API reads, file writes): the server runs them in threads.

    ClaimError            a claim that cannot be prepared (its answer's `error`, never a crash)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from adaptor.dra.cdi import remove_spec, write_spec
from adaptor.dra.checkpoint import Checkpoint, PreparedClaim
from providers.clouds.kube import KubeError, path_segment
from providers.core.errors import PeerpodsError
from providers.dra.allocation import AllocatedDevice, device_facts
from providers.dra.slices import DRIVER

__all__ = ["ClaimError", "ClaimRef", "DeviceState"]

log = logging.getLogger(__name__)

SLICES = "/apis/resource.k8s.io/v1/resourceslices"

Get = Callable[[str], dict[str, Any]]


class ClaimError(PeerpodsError):
    """A claim this plugin cannot prepare: not found, another UID, not allocated to it."""


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


def _claim_path(ref: ClaimRef) -> str:
    namespace, name = path_segment(ref.namespace), path_segment(ref.name)
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


def _our_results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [r for r in results if isinstance(r, dict) and r.get("driver") == DRIVER]


def _pods(claim: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """The UIDs or names of the pods the claim is reserved for."""
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return tuple(
        str(r[key])
        for r in reserved
        if isinstance(r, dict) and r.get("resource") == "pods" and r.get(key)
    )


class DeviceState:
    """The node's prepared claims: `prepare` and `unprepare` over a checkpoint and a CDI dir."""

    def __init__(self, get: Get, checkpoint: Checkpoint, cdi_dir: Path) -> None:
        self._get = get
        self.checkpoint = checkpoint
        self.cdi_dir = cdi_dir

    def prepare(self, ref: ClaimRef) -> PreparedClaim:
        """Prepare one claim (or answer what was prepared for it before)."""
        known = self.checkpoint.get(ref.uid)
        if known is not None:
            return known
        try:
            claim = self._get(_claim_path(ref))
        except KubeError as exc:
            raise ClaimError(f"reading claim {ref.namespace}/{ref.name}: {exc}") from None
        uid = str((claim.get("metadata") or {}).get("uid", ""))
        if uid != ref.uid:
            raise ClaimError(
                f"claim {ref.namespace}/{ref.name} has UID {uid or 'none'}, not {ref.uid}"
            )
        results = _our_results(claim)
        if not results:
            raise ClaimError(f"claim {ref.namespace}/{ref.name} has no devices of {DRIVER}")
        slices = self._slices()
        devices = [self._facts(ref, r, slices) for r in results]
        cdi_ids = write_spec(self.cdi_dir, ref.uid, devices)
        prepared = PreparedClaim(
            ref.uid,
            ref.namespace,
            ref.name,
            _pods(claim, "uid"),
            tuple(devices),
            tuple(cdi_ids),
            _pods(claim, "name"),
        )
        self.checkpoint.put(prepared)
        log.info("prepared claim %s/%s: %d devices", ref.namespace, ref.name, len(devices))
        return prepared

    def _slices(self) -> list[Any]:
        """The published slices of this driver (read once per claim)."""
        selector = quote(f"spec.driver={DRIVER}", safe="=")
        try:
            items = self._get(f"{SLICES}?fieldSelector={selector}").get("items") or []
        except KubeError as exc:
            raise ClaimError(f"reading the pools of {DRIVER}: {exc}") from None
        return list(items)

    def _facts(
        self, ref: ClaimRef, result: Mapping[str, Any], slices: list[Any]
    ) -> AllocatedDevice:
        pool, device = str(result.get("pool", "")), str(result.get("device", ""))
        facts = device_facts(
            slices, pool, device, str(result.get("request", "")), result.get("consumedCapacity")
        )
        if facts is None:
            raise ClaimError(
                f"claim {ref.namespace}/{ref.name}: device {pool}/{device} is in no published pool"
            )
        return facts

    def unprepare(self, ref: ClaimRef) -> None:
        """Forget one claim and remove its CDI spec; an unknown claim is already unprepared."""
        gone = self.checkpoint.remove(ref.uid)
        remove_spec(self.cdi_dir, ref.uid)
        if gone is not None:
            log.info("unprepared claim %s/%s", ref.namespace, ref.name)
