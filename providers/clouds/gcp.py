"""GCP Compute Engine pod VMs: create with zone/type fallback, delete, list the ones we own.

Names are deterministic (`podvm-<hash of the sandbox id>`), so a retried create in the same zone
meets 409 and adopts the VM, and a create first looks the name up in every zone. Labels carry
ownership in GCP's label alphabet (lowercase, 63 characters); the exact sandbox id, pod and owner
are also kept in metadata, which is what list_owned reports. GPU VMs get
`on_host_maintenance=TERMINATE`; an N1 candidate carries its attached GPUs as a typed
`Accelerator` (selection's model id, mapped here to GCP's accelerator type). An instance id is
`<zone>/<name>`.

A Spot VM (VMSpec.capacity_type) has provisioning model SPOT and termination action DELETE: a
preempted VM is deleted with its boot disk (auto-delete), never left TERMINATED holding disks.
`inspect` reports a VM that is gone, or stopped or suspended by the cloud, and `purge` deletes
the VM record, whatever its status, and so its disks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from providers.clouds import registry
from providers.clouds.retry import RetryPolicy, Site, create_with_fallback, retry_transient, sites
from providers.clouds.sdk import CloudCalls
from providers.clouds.settings import GcpSettings
from providers.core.base import (
    TAG_OWNER,
    TAG_POD_NAME,
    TAG_POD_NAMESPACE,
    TAG_SANDBOX,
    Instance,
    Resolver,
    VMCandidate,
    VMSpec,
    identity,
    sandbox_hash,
)
from providers.core.capacity import ON_DEMAND, SPOT, TAG_CAPACITY_TYPE, CapacityType
from providers.core.errors import (
    CapacityError,
    InstanceNotFound,
    InvalidRequest,
    ProviderError,
    TransientError,
)
from providers.core.markets import VMCondition, create_in_markets
from providers.core.offers import offer_for
from providers.core.warm import (
    GONE,
    PENDING,
    RUNNING,
    STOPPED,
    STOPPING,
    TAG_WARM_POOL,
    TAG_WARM_SLOT,
    WarmSpec,
    disk_cost_per_hour,
)

log = logging.getLogger(__name__)

USER_DATA_LIMIT = registry.limit_of("gcp")
CAPACITY_MARKERS = (
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "QUOTA_EXCEEDED",
    "quotaExceeded",
    "resourcePoolExhausted",
    "UNSUPPORTED_OPERATION",
)
TRANSIENT_MARKERS = (
    "rateLimitExceeded",
    "RESOURCE_OPERATION_RATE_EXCEEDED",
    "userRateLimitExceeded",
)
GPU_FAMILIES = ("a2-", "a3-", "a4-", "g2-", "g4-")
# Statuses of an instance that no longer runs the pod: stopped, or suspended, by the cloud.
STOPPED_STATUSES = frozenset({"STOPPING", "STOPPED", "TERMINATED", "SUSPENDING", "SUSPENDED"})
# Confidential VMs that take GPUs: Intel TDX on a3-highgpu-1g (H100). SEV takes none.
CONFIDENTIAL_GPU_TYPES = {
    "TDX": frozenset({"a3-highgpu-1g"}),
    "SEV": frozenset(),
    "SEV_SNP": frozenset(),
}
N1_ACCELERATORS = {
    "t4": "nvidia-tesla-t4",
    "v100": "nvidia-tesla-v100",
    "p100": "nvidia-tesla-p100",
    "p4": "nvidia-tesla-p4",
}
_LABEL_BAD = re.compile(r"[^a-z0-9_-]")
# An instance's status as a warm VM's power state (providers.core.warm). A warm VM is stopped
# (TERMINATED), never suspended: GCP cannot suspend a VM with GPUs.
_POWER = {
    "PROVISIONING": PENDING,
    "STAGING": PENDING,
    "RUNNING": RUNNING,
    "REPAIRING": RUNNING,
    "STOPPING": STOPPING,
    "SUSPENDING": STOPPING,
    "TERMINATED": STOPPED,
    "STOPPED": STOPPED,
    "SUSPENDED": STOPPED,
}
# What a stopped VM bills: its boot disk, per GB-month in us-central1 (Compute Engine disk
# pricing, cloud.google.com/compute/disks-image-pricing, 2025): pd-standard $0.04, pd-balanced
# $0.10, pd-ssd $0.17; hyperdisk-balanced's capacity $0.08 (its IOPS and throughput beyond the
# baseline bill apart). A disk type not listed is counted as pd-ssd.
DISK_USD_PER_GB_MONTH = {
    "pd-standard": 0.04,
    "pd-balanced": 0.10,
    "pd-ssd": 0.17,
    "hyperdisk-balanced": 0.08,
}


@dataclass(frozen=True)
class GcpConfig:
    """Where and how pod VMs are created."""

    project: str
    zones: tuple[str, ...]
    image: str = ""
    machine_type: str = "e2-medium"
    allowed_instance_types: tuple[str, ...] = ()
    network: str = "global/networks/default"
    subnetwork: str = ""
    disk_size_gb: int = 20
    disk_type: str = "pd-balanced"
    use_public_ip: bool = False
    confidential_type: str = ""  # "", "SEV", "SEV_SNP" or "TDX"
    operation_timeout_seconds: float = 600.0
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    max_candidate_types: int = 8
    capacity_reservation: str = ""


def _on_demand(machine_type: str) -> bool:
    """Whether GCP sells the machine type on demand (providers.core.offers)."""
    return "on-demand" in offer_for("gcp", machine_type).provisioning


def _sold_in_market(order: Sequence[Site], spot: bool, capacity: CapacityType) -> list[Site]:
    """The sites a market pass may try. spot-or-on-demand's on-demand pass skips the shapes GCP
    does not sell on demand (its Spot ranking may hold them: A3 High 1-4g, A4, A4X, A3 Ultra):
    creating one on-demand is refused, not short of capacity. An on-demand pod never has them."""
    fallback = not spot and capacity is CapacityType.SPOT_OR_ON_DEMAND
    return [
        p for p in order if not fallback or p.candidate.reservation or _on_demand(p.instance_type)
    ]


def label_value(value: str) -> str:
    """A string in GCP's label alphabet (lowercase, [a-z0-9_-], at most 63 characters)."""
    return _LABEL_BAD.sub("-", value.lower())[:63]


def vm_name(sandbox_id: str) -> str:
    """The deterministic instance name of a sandbox."""
    return f"podvm-{sandbox_hash(sandbox_id, 20)}"


def warm_vm_name(slot: str) -> str:
    """The deterministic instance name of a warm pool's slot (a retried launch finds it)."""
    return f"podvm-warm-{sandbox_hash(slot, 20)}"


def accelerator_type(candidate: VMCandidate) -> tuple[str, int]:
    """GCP's accelerator type and count of a candidate's attached GPUs ("", 0 when none)."""
    if candidate.accelerator is None:
        return "", 0
    model = candidate.accelerator.model
    return N1_ACCELERATORS.get(model, model), candidate.accelerator.count


def has_gpu(machine_type: str, accelerator: str) -> bool:
    return bool(accelerator) or machine_type.startswith(GPU_FAMILIES)


class AlreadyExists(ProviderError):
    """409 on insert: a retried create whose VM already exists (adopted, never duplicated)."""


def _error_markers(exc: BaseException) -> str:
    parts = [str(exc)]
    for item in getattr(exc, "errors", None) or []:
        if isinstance(item, Mapping):
            parts += [str(item.get("reason", "")), str(item.get("code", ""))]
        else:
            parts += [str(getattr(item, "code", "")), str(getattr(item, "message", ""))]
    return " ".join(parts)


def map_error(exc: BaseException, what: str) -> ProviderError:
    """Translate a google-api-core / transport error into the peerpods tree."""
    from google.api_core import exceptions as gexc

    markers = _error_markers(exc)
    message = f"{what}: {markers}"[:2000]
    if any(m in markers for m in CAPACITY_MARKERS):
        return CapacityError(message)
    if isinstance(exc, gexc.NotFound):
        return InstanceNotFound(message)
    if isinstance(exc, gexc.Conflict):
        return AlreadyExists(message)
    if any(m in markers for m in TRANSIENT_MARKERS) or isinstance(
        exc,
        gexc.TooManyRequests
        | gexc.ServerError
        | gexc.DeadlineExceeded
        | gexc.ServiceUnavailable
        | TimeoutError
        | ConnectionError,
    ):
        return TransientError(message)
    try:
        import requests

        if isinstance(exc, requests.ConnectionError | requests.Timeout):
            return TransientError(message)
    except ImportError:  # pragma: no cover - requests ships with google-auth
        pass
    return ProviderError(message)


def make_client() -> Any:
    """An InstancesClient using Application Default Credentials (none: one clear error)."""
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import compute_v1

    try:
        return compute_v1.InstancesClient()
    except DefaultCredentialsError as exc:
        raise ProviderError(f"gcp provider: no credentials: {exc}") from None


class GcpProvider:
    """The `gcp` provider."""

    name = "gcp"

    def __init__(
        self,
        config: GcpConfig,
        owner_id: str,
        *,
        client: Any = None,
        resolve: Resolver = identity,
        calls: CloudCalls | None = None,
    ) -> None:
        if not owner_id:
            raise InvalidRequest("gcp provider: an owner id is required")
        _require_location(config)
        if config.confidential_type not in ("", *CONFIDENTIAL_GPU_TYPES):
            raise InvalidRequest(
                f"gcp provider: unknown confidential type {config.confidential_type!r}"
            )
        self.config = config
        self.owner_id = owner_id
        self.client = client if client is not None else make_client()
        self.resolve = resolve
        self.calls = calls or CloudCalls()  # the daemon lends its own

    # --- what selection needs ----------------------------------------------------------------

    @property
    def region(self) -> str:
        """The zones' region (us-central1-a -> us-central1)."""
        zone = self.config.zones[0]
        return zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else zone

    @property
    def zones(self) -> tuple[str, ...]:
        return self.config.zones

    @property
    def allowed_types(self) -> tuple[str, ...]:
        return self.config.allowed_instance_types

    @property
    def capacity_reservation(self) -> str:
        """The reservation or block reserved-only types launch into (--capacity-reservation)."""
        return self.config.capacity_reservation

    @property
    def max_candidate_types(self) -> int:
        """How many of selection's ranked types a create may try (--max-candidate-types)."""
        return self.config.max_candidate_types

    @property
    def default_type(self) -> str:
        return self.config.machine_type

    async def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        return await self.calls.call(what, map_error, fn, **kwargs)

    async def _run_operation(self, what: str, method: str, **kwargs: Any) -> None:
        timeout = self.config.operation_timeout_seconds

        def run() -> None:
            operation = getattr(self.client, method)(**kwargs)
            operation.result(timeout=timeout)

        await self._call(what, run)

    # --- building the request --------------------------------------------------------------

    def _labels(self, spec: VMSpec, spot: bool = False) -> dict[str, str]:
        labels = {label_value(str(k))[:63]: label_value(str(v)) for k, v in spec.tags.items() if k}
        labels.update(
            {
                TAG_OWNER: label_value(self.owner_id),
                TAG_SANDBOX: label_value(spec.sandbox_id),
                TAG_POD_NAMESPACE: label_value(spec.pod_namespace),
                TAG_POD_NAME: label_value(spec.pod_name),
                TAG_CAPACITY_TYPE: SPOT if spot else ON_DEMAND,
            }
        )
        return labels

    def _body(
        self, spec: VMSpec, image: str, candidate: VMCandidate, zone: str, spot: bool = False
    ) -> Any:
        from google.cloud import compute_v1

        accelerator, count = accelerator_type(candidate)
        instance = compute_v1.Instance(
            name=vm_name(spec.sandbox_id),
            machine_type=f"zones/{zone}/machineTypes/{candidate.instance_type}",
            labels=self._labels(spec, spot),
            metadata=compute_v1.Metadata(items=self._sandbox_metadata(spec)),
            disks=[self._boot_disk(spec, image, zone, spot)],
            network_interfaces=[self._interface()],
        )
        if candidate.reservation:
            # the operator's reservation: the only way GCP sells A4, A4X and A3 Ultra on demand
            instance.reservation_affinity = compute_v1.ReservationAffinity(
                consume_reservation_type="SPECIFIC_RESERVATION",
                key="compute.googleapis.com/reservation-name",
                values=[candidate.reservation],
            )
        scheduling = self._scheduling(candidate, accelerator, spot)
        if scheduling is not None:
            instance.scheduling = scheduling
        if accelerator:
            instance.guest_accelerators = [
                compute_v1.AcceleratorConfig(
                    accelerator_type=f"zones/{zone}/acceleratorTypes/{accelerator}",
                    accelerator_count=count,
                )
            ]
        if self.config.confidential_type:
            instance.confidential_instance_config = compute_v1.ConfidentialInstanceConfig(
                confidential_instance_type=self.config.confidential_type
            )
        return instance

    def _sandbox_metadata(self, spec: VMSpec) -> list[Any]:
        """A sandbox's VM metadata items: its user data and the tags that name its sandbox (a
        launch writes them, an adoption writes them over a warm VM's)."""
        from google.cloud import compute_v1

        items = [
            ("user-data", spec.user_data),
            (TAG_OWNER, self.owner_id),
            (TAG_SANDBOX, spec.sandbox_id),
            (TAG_POD_NAMESPACE, spec.pod_namespace),
            (TAG_POD_NAME, spec.pod_name),
        ]
        return [compute_v1.Items(key=k, value=v) for k, v in items if v]

    def _interface(self) -> Any:
        """The VM's network interface: the configured network, a public IP only when asked."""
        from google.cloud import compute_v1

        interface = compute_v1.NetworkInterface(network=self.config.network)
        if self.config.subnetwork:
            interface.subnetwork = self.config.subnetwork
        if self.config.use_public_ip:
            interface.access_configs = [
                compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")
            ]
        return interface

    def _boot_disk(self, spec: VMSpec, image: str, zone: str, spot: bool) -> Any:
        """The boot disk, named and labelled as the VM, deleted with it."""
        from google.cloud import compute_v1

        return compute_v1.AttachedDisk(
            boot=True,
            auto_delete=True,
            initialize_params=compute_v1.AttachedDiskInitializeParams(
                disk_name=vm_name(spec.sandbox_id),
                source_image=image,
                disk_size_gb=self.config.disk_size_gb,
                disk_type=f"zones/{zone}/diskTypes/{self.config.disk_type}",
                labels=self._labels(spec, spot),
            ),
        )

    def _scheduling(self, candidate: VMCandidate, accelerator: str, spot: bool) -> Any:
        """How the VM meets host maintenance and preemption; None: GCP's defaults serve."""
        from google.cloud import compute_v1

        if candidate.reservation:
            return compute_v1.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=True)
        if spot:
            # Spot: deleted (with its auto-delete boot disk) when preempted, never restarted.
            return compute_v1.Scheduling(
                provisioning_model="SPOT",
                instance_termination_action="DELETE",
                on_host_maintenance="TERMINATE",
                automatic_restart=False,
            )
        if has_gpu(candidate.instance_type, accelerator) or self.config.confidential_type:
            return compute_v1.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=True)
        return None

    def _usable(self, candidates: tuple[VMCandidate, ...]) -> tuple[VMCandidate, ...]:
        """Drop GPU candidates a confidential VM cannot take (SEV: none; TDX: a3-highgpu-1g)."""
        confidential = self.config.confidential_type
        if not confidential:
            return candidates
        allowed = CONFIDENTIAL_GPU_TYPES[confidential]
        usable = []
        for candidate in candidates:
            machine_type = candidate.instance_type
            accelerator, _ = accelerator_type(candidate)
            if has_gpu(machine_type, accelerator) and (accelerator or machine_type not in allowed):
                log.info(
                    "%s: skipped, a %s confidential VM cannot take its GPUs",
                    candidate,
                    confidential,
                )
                continue
            usable.append(candidate)
        if not usable:
            raise InvalidRequest(
                f"no candidate can run as a {confidential} confidential VM with GPUs "
                f"(tried {', '.join(str(c) for c in candidates)})"
            )
        return tuple(usable)

    # --- Provider ----------------------------------------------------------------------------

    async def create(self, spec: VMSpec) -> Instance:
        what = f"sandbox {spec.sandbox_id[:12]} (pod {spec.pod_namespace}/{spec.pod_name})"
        image = spec.image or self.config.image
        if not image:
            raise InvalidRequest(f"{what}: no pod VM image (set --gcp-image or --pod-vm-image)")
        USER_DATA_LIMIT.check(spec.user_data, what)
        candidates = self._usable(spec.candidates)
        name = vm_name(spec.sandbox_id)
        for zone in self.config.zones:
            existing = await self._get(zone, name)
            if existing is not None:
                log.info("%s: adopting existing instance %s/%s", what, zone, name)
                return await self._finish(what, zone, name)

        async def attempt(placement: Site, spot: bool) -> Instance:
            zone = placement.zone
            body = self._body(spec, image, placement.candidate, zone, spot)
            market = "Spot" if spot else "on-demand"
            try:
                await self._run_operation(
                    f"{what}: insert {market} {placement}",
                    "insert",
                    project=self.config.project,
                    zone=zone,
                    instance_resource=body,
                )
            except ProviderError as exc:
                if isinstance(exc, AlreadyExists):
                    return await self._finish(what, zone, name)
                # a failed insert may leave a stopped instance behind: never keep it
                if isinstance(exc, CapacityError) and await self._get(zone, name) is not None:
                    await self.calls.discard(
                        f"{what}: {zone}/{name}",
                        lambda: self.delete(f"{zone}/{name}"),
                        self.config.policy,
                    )
                raise
            return await self._finish(what, zone, name)

        order = sites(candidates, self.config.zones)

        async def in_market(spot: bool) -> Instance:
            async def one(placement: Site) -> Instance:
                return await attempt(placement, spot)

            sold = _sold_in_market(order, spot, spec.capacity_type)
            if not sold:
                names = ", ".join(dict.fromkeys(p.instance_type for p in order))
                raise CapacityError(f"{what}: {names} cannot be created on-demand (Spot only)")
            return await create_with_fallback(
                what, sold, one, self.config.policy, self.name, self.calls.on_fallback
            )

        return await create_in_markets(what, spec.capacity_type, in_market)

    async def _get(self, zone: str, name: str) -> Any:
        try:
            return await self._call(
                f"get {zone}/{name}",
                self.client.get,
                project=self.config.project,
                zone=zone,
                instance=name,
            )
        except InstanceNotFound:
            return None

    async def _finish(self, what: str, zone: str, name: str) -> Instance:
        try:
            raw = await self._get(zone, name)
            if raw is None:
                raise ProviderError(f"{what}: {zone}/{name} vanished after insert")
            if raw.status in ("TERMINATED", "STOPPING", "SUSPENDED"):
                raise ProviderError(f"{what}: {zone}/{name} is {raw.status}")
            vm = self._instance(raw, zone)
            if not vm.addresses:
                raise ProviderError(f"{what}: {zone}/{name} has no address")
            return self.resolve(vm)
        except BaseException:
            await self.calls.discard(
                f"{what}: {zone}/{name}", lambda: self.delete(f"{zone}/{name}"), self.config.policy
            )
            raise

    def _instance(self, raw: Any, zone: str) -> Instance:
        meta = {item.key: item.value for item in raw.metadata.items if item.key != "user-data"}
        tags = dict(raw.labels)
        for key in (TAG_OWNER, TAG_SANDBOX, TAG_POD_NAMESPACE, TAG_POD_NAME):
            if key in meta:
                tags[key] = meta[key]
        addresses: list[str] = []
        for nic in raw.network_interfaces:
            public = [a.nat_i_p for a in nic.access_configs if a.nat_i_p]
            private = [nic.network_i_p] if nic.network_i_p else []
            addresses += (public + private) if self.config.use_public_ip else (private + public)
        return Instance(
            id=f"{zone}/{raw.name}",
            name=raw.name,
            addresses=tuple(addresses),
            instance_type=raw.machine_type.rsplit("/", 1)[-1],
            zone=zone,
            tags=tags,
            extra={"status": raw.status},
            capacity_type=SPOT if raw.scheduling.provisioning_model == "SPOT" else ON_DEMAND,
        )

    async def delete(self, instance_id: str) -> None:
        zone, _, name = instance_id.partition("/")
        if not zone or not name:
            raise InvalidRequest(f"not a GCP instance id (want ZONE/NAME): {instance_id!r}")

        async def once() -> None:
            try:
                await self._run_operation(
                    f"delete {instance_id}",
                    "delete",
                    project=self.config.project,
                    zone=zone,
                    instance=name,
                )
            except InstanceNotFound:
                return

        await retry_transient(f"delete {instance_id}", once, self.config.policy)

    # --- preemption ----------------------------------------------------------------------------

    async def inspect(self, instance_id: str) -> VMCondition:
        """Alive unless the instance is gone (preempted with action DELETE, or deleted) or
        stopped or suspended (preempted with action STOP, a host event, or someone)."""
        zone, _, name = instance_id.partition("/")
        raw = await self._get(zone, name)
        if raw is None:
            return VMCondition(False, f"GCP instance {instance_id} no longer exists")
        if raw.status in STOPPED_STATUSES:
            spot = raw.scheduling.provisioning_model == "SPOT"
            said = f": {raw.status_message}" if raw.status_message else ""
            by = "stopped by the cloud (Spot preemption)" if spot else "stopped by the cloud"
            return VMCondition(False, f"GCP instance {instance_id} is {raw.status}, {by}{said}")
        return VMCondition(True)

    async def purge(self, instance: Instance) -> None:
        """Delete the instance record whatever its status; its boot disk auto-deletes with it."""
        await self.delete(instance.id)

    async def list_owned(self) -> list[Instance]:
        pairs = await self._labelled("list owned instances", TAG_OWNER)
        owned = [self._instance(raw, zone) for zone, raw in pairs]
        return [vm for vm in owned if vm.tags.get(TAG_OWNER) == self.owner_id]

    async def _labelled(self, what: str, label: str) -> list[tuple[str, Any]]:
        """(zone, raw instance) of every instance in the project whose `label` is this owner."""
        from google.cloud import compute_v1

        request = compute_v1.AggregatedListInstancesRequest(
            project=self.config.project,
            filter=f'labels.{label} = "{label_value(self.owner_id)}"',
        )

        def collect() -> list[tuple[str, Any]]:
            found = []
            for scope, scoped in self.client.aggregated_list(request=request):
                zone = scope.rsplit("/", 1)[-1]
                found += [(zone, raw) for raw in scoped.instances]
            return found

        pairs: list[tuple[str, Any]] = await self._call(what, collect)
        return pairs

    # --- warm pool (providers.core.warm) -------------------------------------------------------

    def cannot_stop(self, instance_type: str) -> str:
        """GCP stops any machine type (a warm VM's local SSDs, where its type has them, are
        discarded at the stop; the images are on the boot disk)."""
        return ""

    def stopped_cost_per_hour(self, instance_type: str) -> float:
        """The boot disk a stopped (TERMINATED) VM keeps, per hour; the machine bills nothing."""
        price = DISK_USD_PER_GB_MONTH.get(self.config.disk_type, DISK_USD_PER_GB_MONTH["pd-ssd"])
        return disk_cost_per_hour(self.config.disk_size_gb, price)

    async def launch_warm(self, spec: WarmSpec) -> Instance:
        from google.cloud import compute_v1

        image = spec.image or self.config.image
        if not image:
            raise InvalidRequest(f"warm slot {spec.slot}: no pod VM image")
        zone = spec.zone or self.config.zones[0]
        name = warm_vm_name(spec.slot)
        existing = await self._get(zone, name)
        if existing is None:
            candidate = VMCandidate(spec.instance_type)
            # the pod VM's body, then every sandbox mark replaced by the pool's
            shell = VMSpec(sandbox_id=spec.slot, pod_namespace="", pod_name="")
            body = self._body(shell, image, candidate, zone)
            labels = {
                TAG_OWNER: label_value(self.owner_id),
                TAG_WARM_POOL: label_value(self.owner_id),
                TAG_WARM_SLOT: label_value(spec.slot),
                TAG_CAPACITY_TYPE: ON_DEMAND,
            }
            body.name = name
            body.labels = labels
            body.disks[0].initialize_params.disk_name = name
            body.disks[0].initialize_params.labels = labels
            items = [("user-data", spec.user_data), (TAG_OWNER, self.owner_id)]
            items += [(TAG_WARM_POOL, self.owner_id), (TAG_WARM_SLOT, spec.slot)]
            body.metadata = compute_v1.Metadata(
                items=[compute_v1.Items(key=k, value=v) for k, v in items if v]
            )
            with contextlib.suppress(AlreadyExists):
                await self._run_operation(
                    f"warm slot {spec.slot}: insert {spec.instance_type} in {zone}",
                    "insert",
                    project=self.config.project,
                    zone=zone,
                    instance_resource=body,
                )
            existing = await self._get(zone, name)
            if existing is None:
                raise ProviderError(f"warm slot {spec.slot}: {zone}/{name} vanished after insert")
        return self._warm_instance(existing, zone)

    def _warm_instance(self, raw: Any, zone: str) -> Instance:
        instance = self._instance(raw, zone)
        meta = {item.key: item.value for item in raw.metadata.items}
        tags = dict(instance.tags)
        for key in (TAG_WARM_POOL, TAG_WARM_SLOT):
            if key in meta:
                tags[key] = meta[key]
            else:
                tags.pop(key, None)
        power = _POWER.get(str(raw.status), GONE)
        extra = {**instance.extra, "power": power, "created": str(raw.creation_timestamp or "")}
        return dataclasses.replace(instance, tags=tags, extra=extra)

    async def warm_vms(self) -> list[Instance]:
        pairs = await self._labelled("list warm instances", TAG_WARM_POOL)
        vms = [self._warm_instance(raw, zone) for zone, raw in pairs]
        return [vm for vm in vms if vm.tags.get(TAG_WARM_POOL) == self.owner_id]

    async def power_state(self, instance_id: str) -> str:
        zone, _, name = instance_id.partition("/")
        raw = await self._get(zone, name)
        return GONE if raw is None else _POWER.get(str(raw.status), GONE)

    async def stop_warm(self, instance_id: str) -> None:
        from google.cloud import compute_v1

        zone, _, name = instance_id.partition("/")
        request = compute_v1.StopInstanceRequest(
            project=self.config.project, zone=zone, instance=name, discard_local_ssd=True
        )
        await self._run_operation(f"stop warm VM {instance_id}", "stop", request=request)
        power = await self.power_state(instance_id)
        if power != STOPPED:
            raise ProviderError(f"stop warm VM {instance_id}: still {power}")

    async def adopt_warm(
        self, instance_id: str, spec: VMSpec, tags: Mapping[str, str] | None = None
    ) -> Instance:
        from google.cloud import compute_v1

        what = f"sandbox {spec.sandbox_id[:12]}: adopt warm VM {instance_id}"
        USER_DATA_LIMIT.check(spec.user_data, what)
        zone, _, name = instance_id.partition("/")
        raw = await self._get(zone, name)
        if raw is None or _POWER.get(str(raw.status)) != STOPPED:
            raise ProviderError(f"{what}: it is {raw.status if raw else 'gone'}, not stopped")
        metadata = compute_v1.Metadata(
            fingerprint=raw.metadata.fingerprint, items=self._sandbox_metadata(spec)
        )
        # the labels are replaced whole: the sandbox's on, the pool's off, in one call, before
        # the start (from then on every sweep sees the sandbox's VM)
        labels = compute_v1.InstancesSetLabelsRequest(
            labels={**self._labels(spec), **{k: label_value(v) for k, v in (tags or {}).items()}},
            label_fingerprint=raw.label_fingerprint,
        )
        where = {"project": self.config.project, "zone": zone, "instance": name}
        await asyncio.gather(
            self._run_operation(
                f"{what}: metadata", "set_metadata", metadata_resource=metadata, **where
            ),
            self._run_operation(
                f"{what}: labels",
                "set_labels",
                instances_set_labels_request_resource=labels,
                **where,
            ),
        )
        await self._run_operation(f"{what}: start", "start", **where)
        return await self._finish(what, zone, name)


def config_from_settings(settings: GcpSettings) -> GcpConfig:
    return GcpConfig(
        project=settings.gcp_project,
        zones=settings.gcp_zones,
        image=settings.gcp_image or settings.pod_vm_image,
        machine_type=settings.instance_type or "e2-medium",
        allowed_instance_types=settings.allowed_instance_types,
        network=settings.gcp_network,
        subnetwork=settings.gcp_subnetwork,
        disk_type=settings.gcp_disk_type,
        disk_size_gb=settings.gcp_disk_gib,
        confidential_type=settings.gcp_confidential_type,
        use_public_ip=settings.gcp_use_public_ip,
        policy=RetryPolicy(max_attempts=settings.max_launches_per_pass),
        max_candidate_types=settings.max_candidate_types,
        capacity_reservation=settings.capacity_reservation,
    )


def _require_location(config: GcpConfig) -> None:
    if not config.project or not config.zones:
        raise InvalidRequest("gcp provider: --gcp-project and --gcp-zones are required")


def from_settings(
    settings: GcpSettings,
    owner_id: str,
    resolve: Resolver = identity,
    calls: CloudCalls | None = None,
) -> GcpProvider:
    """The provider `peerpods serve --provider gcp` runs."""
    from providers.clouds.metadata import complete_gcp

    if settings.gcp_image or settings.pod_vm_image:
        # what the node's metadata knows, where unset (a missing image is refused first)
        settings = complete_gcp(settings)
    config = config_from_settings(settings)
    if config.project and config.zones and not config.image:  # a missing project or zones first
        # Refused at start: otherwise the daemon would run and fail every pod's StartVM.
        raise InvalidRequest(
            "gcp provider: no pod VM image (set --gcp-image or --pod-vm-image, "
            "env PEERPODS_POD_VM_IMAGE)"
        )
    return GcpProvider(config, owner_id, resolve=resolve, calls=calls)
