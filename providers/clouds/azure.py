"""Azure pod VMs: create with zone/size fallback, delete, list the ones this adaptor owns.

A VM's name is derived from its sandbox (`podvm-<hash>`), and create is a PUT, so a retried
create finds (or completes) the same VM. The VM manages its own NIC and OS disk with
`deleteOption: Delete`, so one DELETE removes everything it made. An allocation failure can leave
a Failed VM behind: it is deleted before the next zone or size is tried. The pod's user data is
the VM's `userData` property (base64, at most 64 KiB encoded), which the pod VM reads from IMDS
(`/metadata/instance/compute/userData`); unlike `osProfile.customData` it can be replaced on an
existing VM, which is what lets a deallocated warm VM be adopted. An instance id is the VM name
(one resource group per adaptor).

A Spot VM (VMSpec.capacity_type) has priority Spot, eviction policy Delete and max price -1 (it
is evicted for capacity only, never for price), so an eviction removes the VM and what it made;
`inspect` tells the adaptor a VM is gone or deallocated, and `purge` deletes the VM, its NIC and
its OS disk (named after the VM) whatever is left of them.

A warm pool VM (providers.core.warm) is named after its slot and tagged as the pool's; once its
guest powered off it is deallocated (the compute stops billing, its OS disk does not). An
adoption PATCHes the deallocated VM's userData and tags (the sandbox's replace the pool's in one
call) and starts it.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from providers.clouds import registry
from providers.clouds.retry import RetryPolicy, Site, create_with_fallback, retry_transient, sites
from providers.clouds.sdk import CloudCalls
from providers.clouds.settings import AzureSettings
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
from providers.core.capacity import ON_DEMAND, SPOT, TAG_CAPACITY_TYPE
from providers.core.errors import (
    CapacityError,
    InstanceNotFound,
    InvalidRequest,
    ProviderError,
    TransientError,
)
from providers.core.markets import VMCondition, create_in_markets
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

USER_DATA_LIMIT = registry.limit_of("azure")
CAPACITY_CODES = frozenset(
    {
        "SkuNotAvailable",
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
        "QuotaExceeded",
        "OperationNotAllowed",
    }
)
STOPPED_POWER_STATES = frozenset(
    {
        "PowerState/deallocated",
        "PowerState/deallocating",
        "PowerState/stopped",
        "PowerState/stopping",
    }
)
TRANSIENT_CODES = frozenset(
    {"TooManyRequests", "RetryableError", "ServiceUnavailable", "InternalServerError", "Conflict"}
)
DEALLOCATED = "PowerState/deallocated"
# A VM's instance view power state as a warm VM's (providers.core.warm). A guest's own power-off
# leaves it PowerState/stopped: powered off, yet still allocated and billed for its compute.
_POWER = {
    "PowerState/starting": PENDING,
    "PowerState/running": RUNNING,
    "PowerState/stopping": STOPPING,
    "PowerState/stopped": STOPPED,
    "PowerState/deallocating": STOPPING,
    DEALLOCATED: STOPPED,
}
# What a deallocated VM bills: its OS disk, priced by tier (the smallest tier that holds the
# disk's size), Standard SSD LRS, East US (azure.microsoft.com/pricing/details/managed-disks,
# 2025): the tiers E1 4 GiB ($0.30 a month) to E50 4 TiB ($307.20) double in size and in price,
# $0.075 per GiB of the tier a month; transactions are not counted.
STANDARD_SSD_TIERS_GIB = tuple(4 << n for n in range(11))
STANDARD_SSD_USD_PER_TIER_GIB_MONTH = 0.075
# The OS disk of an image that sets none (--azure-os-disk-gib 0): Azure's Linux images have 30 GiB.
ASSUMED_OS_DISK_GIB = 30


@dataclass(frozen=True)
class AzureConfig:
    """Where and how pod VMs are created (CAA-compatible settings)."""

    subscription_id: str
    resource_group: str
    location: str
    subnet_id: str
    image_id: str = ""
    ssh_public_key: str = ""
    admin_username: str = "peerpod"
    instance_size: str = "Standard_D2as_v5"
    allowed_instance_types: tuple[str, ...] = ()
    zones: tuple[str, ...] = ()
    # the OS disk's size, 0: the image's own; CUDA container images need room
    os_disk_gib: int = 0
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    max_candidate_types: int = 8


def vm_name(sandbox_id: str) -> str:
    return f"podvm-{sandbox_hash(sandbox_id, 20)}"


def warm_vm_name(slot: str) -> str:
    """The deterministic VM name of a warm pool's slot (a retried launch finds it)."""
    return f"podvm-warm-{sandbox_hash(slot, 20)}"


def disk_usd_per_gb_month(gib: int) -> float:
    """A Standard SSD disk's monthly price per GiB of its size, from its tier's price (a disk
    larger than the table is priced at the largest tier's rate)."""
    tier = next((size for size in STANDARD_SSD_TIERS_GIB if gib <= size), gib)
    return STANDARD_SSD_USD_PER_TIER_GIB_MONTH * tier / gib


def power_of_view(vm: Any) -> str:
    """The ARM PowerState/... code of a VM read with its instance view ("" when none)."""
    view = vm.instance_view
    for status in (view.statuses or []) if view is not None else []:
        code = str(status.code or "")
        if code.startswith("PowerState/"):
            return code
    return ""


def encode_user_data(text: str) -> str:
    """The userData property's value: the user data, base64."""
    return base64.b64encode(text.encode()).decode()


def nic_name(vm: str) -> str:
    return f"{vm}-nic"


def os_disk_name(vm: str) -> str:
    return f"{vm}-osdisk"


def map_error(exc: BaseException, what: str) -> ProviderError:
    """Translate an azure-core error into the peerpods tree (most specific first)."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(exc, ResourceNotFoundError):
        return InstanceNotFound(f"{what}: {exc.message}")
    if isinstance(exc, ClientAuthenticationError):
        return ProviderError(f"{what}: authentication failed (Azure default credential chain)")
    if isinstance(exc, HttpResponseError):
        code = str(getattr(exc.error, "code", "") or "")
        message = str(getattr(exc.error, "message", "") or exc.message)
        text = f"{what}: {code}: {message}".replace(": : ", ": ")
        status = int(exc.status_code or 0)
        if code in CAPACITY_CODES and (code != "OperationNotAllowed" or "quota" in message.lower()):
            return CapacityError(text)
        if code in TRANSIENT_CODES or status == 429 or status >= 500:
            return TransientError(text)
        return ProviderError(text)
    if isinstance(exc, ServiceRequestError | ServiceResponseError):
        return TransientError(f"{what}: {exc}")
    return ProviderError(f"{what}: {type(exc).__name__}: {exc}")


class AzureProvider:
    """The `azure` provider."""

    name = "azure"

    def __init__(
        self,
        config: AzureConfig,
        owner_id: str,
        *,
        compute: Any = None,
        network: Any = None,
        resolve: Resolver = identity,
        calls: CloudCalls | None = None,
    ) -> None:
        if not owner_id:
            raise InvalidRequest("azure provider: an owner id is required")
        for flag, value in (
            ("--azure-subscription-id", config.subscription_id),
            ("--azure-resource-group", config.resource_group),
            ("--azure-region", config.location),
            ("--azure-subnet-id", config.subnet_id),
        ):
            if not value:
                raise InvalidRequest(f"azure provider: {flag} is required")
        self.config = config
        self.owner_id = owner_id
        if compute is None or network is None:
            compute, network = make_clients(config)
        self.compute = compute
        self.network = network
        self.resolve = resolve
        self.calls = calls or CloudCalls()  # the daemon lends its own

    # --- what selection needs ----------------------------------------------------------------

    @property
    def region(self) -> str:
        return self.config.location

    @property
    def zones(self) -> tuple[str, ...]:
        return self.config.zones

    @property
    def allowed_types(self) -> tuple[str, ...]:
        return self.config.allowed_instance_types

    @property
    def max_candidate_types(self) -> int:
        """How many of selection's ranked types a create may try (--max-candidate-types)."""
        return self.config.max_candidate_types

    @property
    def default_type(self) -> str:
        return self.config.instance_size

    async def _call(self, what: str, fn: Any, *args: Any) -> Any:
        return await self.calls.call(what, map_error, fn, *args)

    def _tags(self, spec: VMSpec, spot: bool = False) -> dict[str, str]:
        tags = {str(k)[:512]: str(v)[:256] for k, v in spec.tags.items()}
        tags.update(
            {
                TAG_OWNER: self.owner_id,
                TAG_SANDBOX: spec.sandbox_id,
                TAG_POD_NAMESPACE: spec.pod_namespace,
                TAG_POD_NAME: spec.pod_name[:256],
                TAG_CAPACITY_TYPE: SPOT if spot else ON_DEMAND,
            }
        )
        return tags

    def _body(
        self,
        spec: VMSpec,
        image: str,
        placement: Site,
        spot: bool = False,
        *,
        name: str = "",
        tags: Mapping[str, str] | None = None,
    ) -> Any:
        """The VM resource in ARM's JSON shape (the SDK model accepts the mapping as is)."""
        from azure.mgmt.compute import models as m

        name = name or vm_name(spec.sandbox_id)
        body: dict[str, Any] = {
            "location": self.config.location,
            "tags": dict(tags) if tags is not None else self._tags(spec, spot),
            "properties": {
                "hardwareProfile": {"vmSize": placement.instance_type},
                "storageProfile": {"imageReference": {"id": image}, "osDisk": self._os_disk(name)},
                "osProfile": self._os_profile(name),
                "networkProfile": {
                    "networkApiVersion": "2020-11-01",
                    "networkInterfaceConfigurations": [self._nic(name)],
                },
            },
        }
        if spec.user_data:
            body["properties"]["userData"] = encode_user_data(spec.user_data)
        if placement.zone:
            body["zones"] = [placement.zone]
        if spot:
            # Evicted for capacity only (max price -1), and deleted with its disk and NIC.
            body["properties"].update(
                {"priority": "Spot", "evictionPolicy": "Delete", "billingProfile": {"maxPrice": -1}}
            )
        return m.VirtualMachine(body)

    def _os_profile(self, name: str) -> dict[str, Any]:
        """Login by SSH key only (when one is set); the user data is the VM's userData."""
        linux: dict[str, Any] = {"disablePasswordAuthentication": True}
        if self.config.ssh_public_key:
            linux["ssh"] = {
                "publicKeys": [
                    {
                        "path": f"/home/{self.config.admin_username}/.ssh/authorized_keys",
                        "keyData": self.config.ssh_public_key,
                    }
                ]
            }
        os_profile: dict[str, Any] = {
            "computerName": name,
            "adminUsername": self.config.admin_username,
            "linuxConfiguration": linux,
        }
        return os_profile

    def _os_disk(self, name: str) -> dict[str, Any]:
        """The OS disk made from the image, deleted with the VM, sized when asked."""
        disk: dict[str, Any] = {
            "name": os_disk_name(name),
            "createOption": "FromImage",
            "deleteOption": "Delete",
            "managedDisk": {"storageAccountType": "StandardSSD_LRS"},
        }
        if self.config.os_disk_gib:
            disk["diskSizeGB"] = self.config.os_disk_gib
        return disk

    def _nic(self, name: str) -> dict[str, Any]:
        """The VM's one network interface in the configured subnet, deleted with the VM."""
        return {
            "name": nic_name(name),
            "properties": {
                "primary": True,
                "deleteOption": "Delete",
                "ipConfigurations": [
                    {"name": "ipconfig", "properties": {"subnet": {"id": self.config.subnet_id}}}
                ],
            },
        }

    async def create(self, spec: VMSpec) -> Instance:
        what = f"sandbox {spec.sandbox_id[:12]} (pod {spec.pod_namespace}/{spec.pod_name})"
        image = spec.image or self.config.image_id
        if not image:
            raise InvalidRequest(
                f"{what}: no pod VM image (set --azure-image-id or --pod-vm-image)"
            )
        USER_DATA_LIMIT.check(spec.user_data, what)
        name = vm_name(spec.sandbox_id)
        rg = self.config.resource_group
        existing = await self._get(name)
        if existing is not None and existing.provisioning_state == "Succeeded":
            log.info("%s: adopting existing VM %s", what, name)
            return await self._finish(what, existing)
        if existing is not None:  # a Failed leftover of an earlier try: start clean
            await self.delete(name)

        async def attempt(placement: Site, spot: bool) -> Instance:
            body = self._body(spec, image, placement, spot)

            def put() -> Any:
                return self.compute.virtual_machines.begin_create_or_update(rg, name, body).result()

            market = "Spot" if spot else "on-demand"
            try:
                vm = await self._call(f"{what}: create {market} {placement}", put)
            except CapacityError:
                # an allocation failure can leave a Failed VM: never keep it, never reuse it
                if await self._get(name) is not None:
                    await self.calls.discard(
                        f"{what}: {name}", lambda: self.delete(name), self.config.policy
                    )
                raise
            except BaseException:
                await self.calls.discard(
                    f"{what}: {name}", lambda: self.delete(name), self.config.policy
                )
                raise
            return await self._finish(what, vm)

        order = sites(spec.candidates, self.config.zones)

        async def in_market(spot: bool) -> Instance:
            async def one(placement: Site) -> Instance:
                return await attempt(placement, spot)

            return await create_with_fallback(
                what, order, one, self.config.policy, self.name, self.calls.on_fallback
            )

        return await create_in_markets(what, spec.capacity_type, in_market)

    async def _get(self, name: str) -> Any:
        try:
            return await self._call(
                f"get {name}", self.compute.virtual_machines.get, self.config.resource_group, name
            )
        except InstanceNotFound:
            return None

    async def _finish(self, what: str, vm: Any) -> Instance:
        try:
            if vm.provisioning_state not in (None, "Succeeded"):
                raise ProviderError(f"{what}: {vm.name} is {vm.provisioning_state}")
            addresses = await self._addresses(vm)
            if not addresses:
                raise ProviderError(f"{what}: {vm.name} has no address")
            return self.resolve(self._instance(vm, addresses))
        except BaseException:
            await self.calls.discard(
                f"{what}: {vm.name}", lambda: self.delete(vm.name), self.config.policy
            )
            raise

    async def _addresses(self, vm: Any) -> tuple[str, ...]:
        found: list[str] = []
        for ref in (vm.network_profile.network_interfaces or []) if vm.network_profile else []:
            parts = ref.id.split("/")
            nic = await self._call(
                f"get NIC {parts[-1]}", self.network.network_interfaces.get, parts[4], parts[-1]
            )
            found += [
                c.private_ip_address for c in nic.ip_configurations or [] if c.private_ip_address
            ]
        return tuple(found)

    def _instance(self, vm: Any, addresses: tuple[str, ...] = ()) -> Instance:
        spot = str(vm.priority or "") == "Spot" or (vm.tags or {}).get(TAG_CAPACITY_TYPE) == SPOT
        return Instance(
            id=vm.name,
            name=vm.name,
            addresses=addresses,
            instance_type=vm.hardware_profile.vm_size if vm.hardware_profile else "",
            zone=(vm.zones or [""])[0],
            tags=dict(vm.tags or {}),
            extra={"provisioning_state": str(vm.provisioning_state or "")},
            capacity_type=SPOT if spot else ON_DEMAND,
        )

    async def delete(self, instance_id: str) -> None:
        rg = self.config.resource_group

        async def once() -> None:
            def run() -> None:
                self.compute.virtual_machines.begin_delete(rg, instance_id).result()

            try:
                await self._call(f"delete {instance_id}", run)
            except InstanceNotFound:
                return

        await retry_transient(f"delete {instance_id}", once, self.config.policy)

    # --- preemption ----------------------------------------------------------------------------

    async def inspect(self, instance_id: str) -> VMCondition:
        """Alive unless the VM is gone (evicted with policy Delete, or deleted), being deleted,
        or deallocated or stopped (evicted with policy Deallocate, or stopped by someone)."""
        rg = self.config.resource_group
        try:

            def get() -> Any:
                return self.compute.virtual_machines.get(rg, instance_id, expand="instanceView")

            vm = await self._call(f"inspect {instance_id}", get)
        except InstanceNotFound:
            return VMCondition(
                False, f"Azure VM {instance_id} no longer exists (evicted or deleted)"
            )
        if vm.provisioning_state == "Deleting":
            return VMCondition(False, f"Azure VM {instance_id} is being deleted")
        view = vm.instance_view
        for status in (view.statuses or []) if view is not None else []:
            code = str(status.code or "")
            if code in STOPPED_POWER_STATES:
                said = status.display_status or code
                return VMCondition(False, f"Azure VM {instance_id} is {said} ({code})")
        return VMCondition(True)

    async def purge(self, instance: Instance) -> None:
        """Delete the VM, then its NIC and OS disk if an eviction or a failure left them."""
        await self.delete(instance.id)
        rg = self.config.resource_group
        leftovers = (
            (
                f"NIC {nic_name(instance.id)}",
                self.network.network_interfaces.begin_delete,
                nic_name(instance.id),
            ),
            (
                f"disk {os_disk_name(instance.id)}",
                self.compute.disks.begin_delete,
                os_disk_name(instance.id),
            ),
        )
        for what, begin_delete, name in leftovers:

            async def once(
                what: str = what, begin_delete: Any = begin_delete, name: str = name
            ) -> None:
                def run() -> None:
                    begin_delete(rg, name).result()

                try:
                    await self._call(f"delete {what}", run)
                except InstanceNotFound:
                    return

            await retry_transient(f"delete {what}", once, self.config.policy)

    async def list_owned(self) -> list[Instance]:
        rg = self.config.resource_group

        def collect() -> list[Any]:
            return list(self.compute.virtual_machines.list(rg))

        vms = await self._call("list VMs", collect)
        return [self._instance(vm) for vm in vms if (vm.tags or {}).get(TAG_OWNER) == self.owner_id]

    # --- warm pool (providers.core.warm) -------------------------------------------------------

    def cannot_stop(self, instance_type: str) -> str:
        """Azure deallocates any size whose OS disk is managed, as a pod VM's is (the temporary
        resource disk, where a size has one, is wiped: the images are on the OS disk)."""
        return ""

    def stopped_cost_per_hour(self, instance_type: str) -> float:
        """The Standard SSD OS disk a deallocated VM keeps, per hour; the compute bills nothing."""
        gib = self.config.os_disk_gib or ASSUMED_OS_DISK_GIB
        return disk_cost_per_hour(gib, disk_usd_per_gb_month(gib))

    async def launch_warm(self, spec: WarmSpec) -> Instance:
        image = spec.image or self.config.image_id
        if not image:
            raise InvalidRequest(f"warm slot {spec.slot}: no pod VM image")
        what = f"warm slot {spec.slot}"
        USER_DATA_LIMIT.check(spec.user_data, what)
        name = warm_vm_name(spec.slot)
        existing = await self._viewed(name)
        if existing is not None and existing.provisioning_state != "Failed":
            # launched before (a restart, a retried launch): the pool watches it from here
            return self._warm_instance(existing, _POWER.get(power_of_view(existing), PENDING))
        if existing is not None:  # a Failed leftover of an earlier try: start clean
            await self.delete(name)
        zone = spec.zone or (self.config.zones[0] if self.config.zones else "")
        placement = Site(VMCandidate(spec.instance_type), zone)
        tags = {
            TAG_OWNER: self.owner_id,
            TAG_WARM_POOL: self.owner_id,
            TAG_WARM_SLOT: spec.slot[:256],
            TAG_CAPACITY_TYPE: ON_DEMAND,
        }
        # the pod VM's body, named after the slot, with the pool's tags and user data
        shell = VMSpec(
            sandbox_id=spec.slot, pod_namespace="", pod_name="", user_data=spec.user_data
        )
        body = self._body(shell, image, placement, name=name, tags=tags)
        rg = self.config.resource_group

        def put() -> Any:
            return self.compute.virtual_machines.begin_create_or_update(rg, name, body).result()

        try:
            vm = await self._call(f"{what}: create {placement}", put)
        except BaseException:
            await self.calls.discard(
                f"{what}: {name}", lambda: self.delete(name), self.config.policy
            )
            raise
        return self._warm_instance(vm, PENDING)

    def _warm_instance(self, vm: Any, power: str) -> Instance:
        instance = self._instance(vm)
        created = getattr(vm, "time_created", None)
        extra = {
            **instance.extra,
            "power": power,
            "created": created.isoformat() if created else "",
        }
        return dataclasses.replace(instance, extra=extra)

    async def warm_vms(self) -> list[Instance]:
        """The pool's VMs; one powered off but not yet deallocated is reported STOPPING, so the
        pool watches it again and deallocates it (it still bills its compute)."""
        rg = self.config.resource_group

        def collect() -> list[Any]:
            return list(self.compute.virtual_machines.list(rg, expand="instanceView"))

        vms = await self._call("list warm VMs", collect)
        found = []
        for vm in vms:
            if (vm.tags or {}).get(TAG_WARM_POOL) != self.owner_id:
                continue
            code = power_of_view(vm)
            power = STOPPING if code == "PowerState/stopped" else _POWER.get(code, PENDING)
            found.append(
                self._warm_instance(vm, GONE if vm.provisioning_state == "Deleting" else power)
            )
        return found

    async def _viewed(self, name: str) -> Any:
        """The VM with its instance view (None when it does not exist)."""
        rg = self.config.resource_group

        def get() -> Any:
            return self.compute.virtual_machines.get(rg, name, expand="instanceView")

        try:
            return await self._call(f"get {name}", get)
        except InstanceNotFound:
            return None

    async def _power_code(self, name: str) -> str:
        """The VM's ARM PowerState/... code, "gone" when it does not exist."""
        vm = await self._viewed(name)
        return power_of_view(vm) if vm is not None else "gone"

    async def power_state(self, instance_id: str) -> str:
        """STOPPED once the guest powered off (PowerState/stopped) or the VM is deallocated."""
        vm = await self._viewed(instance_id)
        if vm is None or vm.provisioning_state == "Deleting":
            return GONE
        return _POWER.get(power_of_view(vm), PENDING)

    async def stop_warm(self, instance_id: str) -> None:
        """Deallocate (a powered-off VM still holds, and bills, its compute until then)."""
        what = f"deallocate warm VM {instance_id}"
        rg = self.config.resource_group

        def deallocate() -> None:
            self.compute.virtual_machines.begin_deallocate(rg, instance_id).result()

        await self._call(what, deallocate)
        code = await self._power_code(instance_id)
        if code != DEALLOCATED:
            raise ProviderError(f"{what}: still {code or 'without a power state'}")

    async def adopt_warm(
        self, instance_id: str, spec: VMSpec, tags: Mapping[str, str] | None = None
    ) -> Instance:
        from azure.mgmt.compute import models as m

        what = f"sandbox {spec.sandbox_id[:12]}: adopt warm VM {instance_id}"
        USER_DATA_LIMIT.check(spec.user_data, what)
        code = await self._power_code(instance_id)
        if code != DEALLOCATED:
            raise ProviderError(f"{what}: it is {code or 'without a power state'}, not deallocated")
        # A PATCH replaces the whole tags map: the sandbox's go on and the pool's come off in
        # one call, before the start (from then on every sweep sees the sandbox's VM), together
        # with the pod's user data, which the guest reads from IMDS at its next boot.
        update = m.VirtualMachineUpdate(
            {
                "tags": {**self._tags(spec), **{str(k): str(v) for k, v in (tags or {}).items()}},
                "properties": {"userData": encode_user_data(spec.user_data)},
            }
        )
        rg = self.config.resource_group

        def patch() -> Any:
            return self.compute.virtual_machines.begin_update(rg, instance_id, update).result()

        def start() -> None:
            self.compute.virtual_machines.begin_start(rg, instance_id).result()

        await self._call(f"{what}: user data and tags", patch)
        await self._call(f"{what}: start", start)
        started = await self._get(instance_id)
        if started is None:
            raise ProviderError(f"{what}: the VM is gone")
        return await self._finish(what, started)


def make_clients(config: AzureConfig) -> tuple[Any, Any]:
    """Compute and network clients using the Azure default credential chain."""
    from azure.identity import DefaultAzureCredential
    from azure.mgmt.compute import ComputeManagementClient
    from azure.mgmt.network import NetworkManagementClient

    credential = DefaultAzureCredential()
    return (
        ComputeManagementClient(credential, config.subscription_id),
        NetworkManagementClient(credential, config.subscription_id),
    )


def config_from_settings(settings: AzureSettings) -> AzureConfig:
    return AzureConfig(
        subscription_id=settings.azure_subscription_id,
        resource_group=settings.azure_resource_group,
        location=settings.azure_region,
        subnet_id=settings.azure_subnet_id,
        image_id=settings.azure_image_id or settings.pod_vm_image,
        ssh_public_key=settings.azure_ssh_key,
        instance_size=settings.instance_type or "Standard_D2as_v5",
        allowed_instance_types=settings.allowed_instance_types,
        zones=settings.azure_zones,
        os_disk_gib=settings.azure_os_disk_gib,
        policy=RetryPolicy(max_attempts=settings.max_launches_per_pass),
        max_candidate_types=settings.max_candidate_types,
    )


def from_settings(
    settings: AzureSettings,
    owner_id: str,
    resolve: Resolver = identity,
    calls: CloudCalls | None = None,
) -> AzureProvider:
    """The provider `peerpods serve --provider azure` runs."""
    from providers.clouds.metadata import complete_azure

    if settings.azure_image_id or settings.pod_vm_image:
        # what the node's metadata knows, where unset (a missing image is refused first)
        settings = complete_azure(settings)
    config = config_from_settings(settings)
    if not config.image_id:
        # Refused at start: otherwise the daemon would run and fail every pod's StartVM.
        raise InvalidRequest(
            "azure provider: no pod VM image (set --azure-image-id or --pod-vm-image, "
            "env PEERPODS_POD_VM_IMAGE)"
        )
    return AzureProvider(config, owner_id, resolve=resolve, calls=calls)
