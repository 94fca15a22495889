"""Azure pod VMs: create with zone/size fallback, delete, list the ones this adaptor owns.

A VM's name is derived from its sandbox (`podvm-<hash>`), and create is a PUT, so a retried
create finds (or completes) the same VM. The VM manages its own NIC and OS disk with
`deleteOption: Delete`, so one DELETE removes everything it made. An allocation failure can leave
a Failed VM behind: it is deleted before the next zone or size is tried. Custom data is base64
and limited to 64 KiB encoded. An instance id is the VM name (one resource group per adaptor).

A Spot VM (VMSpec.capacity_type) has priority Spot, eviction policy Delete and max price -1 (it
is evicted for capacity only, never for price), so an eviction removes the VM and what it made;
`inspect` tells the adaptor a VM is gone or deallocated, and `purge` deletes the VM, its NIC and
its OS disk (named after the VM) whatever is left of them.
"""

from __future__ import annotations

import base64
import logging
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

    def _body(self, spec: VMSpec, image: str, placement: Site, spot: bool = False) -> Any:
        """The VM resource in ARM's JSON shape (the SDK model accepts the mapping as is)."""
        from azure.mgmt.compute import models as m

        name = vm_name(spec.sandbox_id)
        body: dict[str, Any] = {
            "location": self.config.location,
            "tags": self._tags(spec, spot),
            "properties": {
                "hardwareProfile": {"vmSize": placement.instance_type},
                "storageProfile": {"imageReference": {"id": image}, "osDisk": self._os_disk(name)},
                "osProfile": self._os_profile(spec, name),
                "networkProfile": {
                    "networkApiVersion": "2020-11-01",
                    "networkInterfaceConfigurations": [self._nic(name)],
                },
            },
        }
        if placement.zone:
            body["zones"] = [placement.zone]
        if spot:
            # Evicted for capacity only (max price -1), and deleted with its disk and NIC.
            body["properties"].update(
                {"priority": "Spot", "evictionPolicy": "Delete", "billingProfile": {"maxPrice": -1}}
            )
        return m.VirtualMachine(body)

    def _os_profile(self, spec: VMSpec, name: str) -> dict[str, Any]:
        """Login by SSH key only (when one is set), and the user data as customData."""
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
        if spec.user_data:
            os_profile["customData"] = base64.b64encode(spec.user_data.encode()).decode()
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
