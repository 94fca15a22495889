"""A stateful Azure Resource Manager (VMs, their NICs and OS disks) behind the shared FakeCloud.

PUT creates a VM, its NIC and its OS disk at once (real ARM response shapes); an allocation
failure is reported as ARM does, through an Azure-AsyncOperation that ends Failed while the VM
stays behind in provisioningState Failed. Deleting a VM deletes the NIC and disk whose
deleteOption is Delete, as ARM does; `evict` takes a VM away as a Spot eviction would, optionally
leaving its NIC and disk behind. Faults are injected per call.

Power, as ARM reports it in the instance view (`$expand=instanceView`, on a GET and on a list):
POST deallocate answers 202 with an Azure-AsyncOperation that is InProgress once (the VM
PowerState/deallocating) and then Succeeded (PowerState/deallocated); POST start likewise
(PowerState/starting, then PowerState/running; an injected fault fails the operation, the VM
stays deallocated, as an allocation failure at start does); `power_off` is the guest's own
shutdown (PowerState/stopped, still allocated). PATCH replaces the tags map whole and sets
properties.userData; a GET or list returns userData only with `$expand=userData`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.providers.fakes.azure import SUBSCRIPTION, compute_client, network_client
from tests.providers.fakes.http import FakeCloud, FakeResponse, RecordedRequest, json_response

RG = "peerpods-rg"
# the pods' subnet a provider's configuration names (the fake checks none of it)
SUBNET = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{RG}/providers/Microsoft.Network"
    "/virtualNetworks/vnet/subnets/pods"
)
ARM = "https://management.azure.com"
GROUP = rf"/subscriptions/{SUBSCRIPTION}/resourceGroups/(?P<rg>[^/]+)/providers"
VMS = rf"{GROUP}/Microsoft\.Compute/virtualMachines"
NICS = rf"{GROUP}/Microsoft\.Network/networkInterfaces"
DISKS = rf"{GROUP}/Microsoft\.Compute/disks"
OPS = (
    rf"/subscriptions/{SUBSCRIPTION}/providers/Microsoft\.Compute/locations/(?P<loc>[^/]+)"
    r"/operations/(?P<op>[^/]+)"
)

Fault = Callable[[str, dict[str, Any]], "FakeResponse | str | None"]


def arm_error(status: int, code: str, message: str = "injected") -> FakeResponse:
    return json_response({"error": {"code": code, "message": message}}, status)


@dataclass
class FakeArm:
    cloud: FakeCloud = field(default_factory=FakeCloud)
    vms: dict[str, dict[str, Any]] = field(default_factory=dict)
    # NIC and disk names that exist (created with their VM)
    nics: set[str] = field(default_factory=set)
    disks: set[str] = field(default_factory=set)
    faults: list[Fault] = field(default_factory=list)
    _ops: dict[str, dict[str, Any]] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(4))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.cloud.route("PUT", VMS + r"/(?P<name>[^/]+)", self._put)
        self.cloud.route("GET", VMS + r"/(?P<name>[^/]+)", self._get)
        self.cloud.route("DELETE", VMS + r"/(?P<name>[^/]+)", self._delete)
        self.cloud.route("GET", VMS, self._list)
        self.cloud.route("GET", NICS + r"/(?P<name>[^/]+)", self._nic)
        self.cloud.route("DELETE", NICS + r"/(?P<name>[^/]+)", self._delete_nic)
        self.cloud.route("DELETE", DISKS + r"/(?P<name>[^/]+)", self._delete_disk)
        self.cloud.route("GET", OPS, self._op)
        self.cloud.route("PATCH", VMS + r"/(?P<name>[^/]+)", self._patch)
        self.cloud.route(
            "POST", VMS + r"/(?P<name>[^/]+)/(?P<action>deallocate|start)", self._power
        )

    def clients(self) -> tuple[Any, Any]:
        return compute_client(self.cloud), network_client(self.cloud)

    def _fault(self, action: str, body: dict[str, Any]) -> FakeResponse | str | None:
        for fault in self.faults:
            answer = fault(action, body)
            if answer is not None:
                return answer
        return None

    def _put(self, request: RecordedRequest) -> FakeResponse:
        assert request.match is not None
        name, rg = request.match["name"], request.match["rg"]
        body = request.json()
        fault = self._fault("put", body)
        if isinstance(fault, FakeResponse):
            return fault
        n = next(self._ids)
        group = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{rg}/providers"
        nic_id = f"{group}/Microsoft.Network/networkInterfaces/{name}-nic"
        props = dict(body["properties"])
        props["networkProfile"] = {**props["networkProfile"], "networkInterfaces": [{"id": nic_id}]}
        props["provisioningState"] = "Failed" if fault else "Succeeded"
        props.setdefault("timeCreated", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        vm = {
            "id": f"{group}/Microsoft.Compute/virtualMachines/{name}",
            "name": name,
            "type": "Microsoft.Compute/virtualMachines",
            "location": body["location"],
            "tags": body.get("tags", {}),
            "properties": props,
            "_ip": f"10.0.{n // 250}.{n % 250}",
        }
        if "zones" in body:
            vm["zones"] = body["zones"]
        with self._lock:
            self.vms[name] = vm
            self.nics.add(f"{name}-nic")
            self.disks.add(props["storageProfile"]["osDisk"].get("name") or f"{name}_OsDisk")
        public = {k: v for k, v in vm.items() if k != "_ip"}
        if fault:  # allocation failure: reported by the async operation, the VM stays Failed
            op = f"op-{n}"
            self._ops[op] = {
                "status": "Failed",
                "error": {"code": fault, "message": f"{fault}: injected"},
            }
            url = (
                f"{ARM}/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/locations/"
                f"{body['location']}/operations/{op}?api-version=2024-07-01"
            )
            return json_response(
                {**public, "properties": {**props, "provisioningState": "Creating"}},
                201,
                **{"Azure-AsyncOperation": url},
            )
        return json_response(public, 200)

    def _op(self, request: RecordedRequest) -> FakeResponse:
        assert request.match is not None
        with self._lock:
            op = self._ops[request.match["op"]]
            if op.get("_polls", 0) > 0:  # still running: one more poll
                op["_polls"] -= 1
                return json_response({"status": "InProgress"})
            done = op.pop("_then", None)
            if done is not None:
                done()
        return json_response({k: v for k, v in op.items() if not k.startswith("_")})

    def _async(self, location: str, then: Callable[[], None], error: str = "") -> FakeResponse:
        """A 202 whose Azure-AsyncOperation runs `then` as it ends (Failed with `error`)."""
        op = f"op-{next(self._ids)}"
        record: dict[str, Any] = {"status": "Failed" if error else "Succeeded", "_polls": 1}
        record["_then"] = then
        if error:
            record["error"] = {"code": error, "message": f"{error}: injected"}
        self._ops[op] = record
        url = (
            f"{ARM}/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/locations/"
            f"{location}/operations/{op}?api-version=2024-07-01"
        )
        return FakeResponse(202, None, {"Azure-AsyncOperation": url, "Retry-After": "0"})

    def _power(self, request: RecordedRequest) -> FakeResponse:
        """POST deallocate or start: the transition now, its end when the operation ends."""
        assert request.match is not None
        name, action = request.match["name"], request.match["action"]
        fault = self._fault(action, {"name": name})
        if isinstance(fault, FakeResponse):
            return fault
        with self._lock:
            vm = self.vms.get(name)
            if vm is None:
                return arm_error(404, "ResourceNotFound", f"VM {name} not found")
            before = vm.get("_power", "PowerState/running")
            if action == "deallocate":
                vm["_power"], after = "PowerState/deallocating", "PowerState/deallocated"
            else:
                vm["_power"], after = "PowerState/starting", "PowerState/running"
            if fault:  # the start failed (no capacity): the VM stays as it was
                after = before

        def then() -> None:
            vm["_power"] = after

        return self._async(vm["location"], then, fault or "")

    def _patch(self, request: RecordedRequest) -> FakeResponse:
        """A VM update: the tags map replaced whole when given, properties merged (userData)."""
        assert request.match is not None
        name = request.match["name"]
        body = request.json()
        fault = self._fault("patch", body)
        if isinstance(fault, FakeResponse):
            return fault
        with self._lock:
            vm = self.vms.get(name)
            if vm is None:
                return arm_error(404, "ResourceNotFound", f"VM {name} not found")
            if "tags" in body:
                vm["tags"] = dict(body["tags"])
            vm["properties"] = {**vm["properties"], **body.get("properties", {})}
        return json_response(self._public(vm, request))

    def _public(self, vm: dict[str, Any], request: RecordedRequest) -> dict[str, Any]:
        """The VM as ARM answers it: userData only when expanded, the instance view when asked."""
        public = {k: v for k, v in vm.items() if not k.startswith("_")}
        props = dict(public["properties"])
        expand = request.query.get("$expand", "")
        if expand != "userData":
            props.pop("userData", None)
        if expand == "instanceView":
            power = vm.get("_power", "PowerState/running")
            state = str(props.get("provisioningState", "Succeeded")).lower()
            props["instanceView"] = {
                "statuses": [
                    {"code": f"ProvisioningState/{state}", "displayStatus": state},
                    {"code": power, "displayStatus": "VM " + power.split("/")[-1]},
                ]
            }
        public["properties"] = props
        return public

    def _get(self, request: RecordedRequest) -> FakeResponse:
        assert request.match is not None
        vm = self.vms.get(request.match["name"])
        if vm is None:
            return arm_error(404, "ResourceNotFound", f"VM {request.match['name']} not found")
        return json_response(self._public(vm, request))

    def _delete(self, request: RecordedRequest) -> FakeResponse:
        assert request.match is not None
        fault = self._fault("delete", {"name": request.match["name"]})
        if isinstance(fault, FakeResponse):
            return fault
        with self._lock:
            gone = self.vms.pop(request.match["name"], None)
            if gone is not None:
                props = gone["properties"]
                nic = props["networkProfile"]["networkInterfaceConfigurations"][0]
                if nic["properties"].get("deleteOption") == "Delete":
                    self.nics.discard(nic["name"])
                disk = props["storageProfile"]["osDisk"]
                if disk.get("deleteOption") == "Delete":
                    self.disks.discard(disk.get("name") or f"{gone['name']}_OsDisk")
        return FakeResponse(200 if gone else 204, None)

    def _delete_nic(self, request: RecordedRequest) -> FakeResponse:
        assert request.match is not None
        with self._lock:
            name = request.match["name"]
            if name in self.nics and name.removesuffix("-nic") in self.vms:
                return arm_error(400, "NicInUse", f"NIC {name} is attached to a VM")
            gone = name in self.nics
            self.nics.discard(name)
        return FakeResponse(200 if gone else 204, None)

    def _delete_disk(self, request: RecordedRequest) -> FakeResponse:
        assert request.match is not None
        with self._lock:
            gone = request.match["name"] in self.disks
            self.disks.discard(request.match["name"])
        return FakeResponse(200 if gone else 204, None)

    def evict(self, name: str, *, leave_nic_and_disk: bool = False) -> None:
        """Take a VM away as a Spot eviction does (its NIC and disk too, unless told to leave
        them, as a failed clean-up would)."""
        with self._lock:
            vm = self.vms.pop(name)
            if not leave_nic_and_disk:
                self.nics.discard(f"{name}-nic")
                self.disks.discard(vm["properties"]["storageProfile"]["osDisk"].get("name", ""))

    def power_off(self, name: str) -> None:
        """The guest's own shutdown: powered off, still allocated (and billed)."""
        with self._lock:
            self.vms[name]["_power"] = "PowerState/stopped"

    def deallocate(self, name: str) -> None:
        """Stop a VM as an eviction with policy Deallocate would (the VM record stays)."""
        with self._lock:
            self.vms[name]["_power"] = "PowerState/deallocated"

    def _list(self, request: RecordedRequest) -> FakeResponse:
        with self._lock:
            value = [self._public(vm, request) for vm in self.vms.values()]
        return json_response({"value": value})

    def _nic(self, request: RecordedRequest) -> FakeResponse:
        assert request.match is not None
        vm = self.vms.get(request.match["name"].removesuffix("-nic"))
        if vm is None:
            return arm_error(404, "ResourceNotFound")
        return json_response(
            {
                "name": request.match["name"],
                "id": vm["properties"]["networkProfile"]["networkInterfaces"][0]["id"],
                "location": vm["location"],
                "properties": {
                    "provisioningState": "Succeeded",
                    "ipConfigurations": [
                        {
                            "name": "ipconfig",
                            "properties": {
                                "privateIPAddress": vm["_ip"],
                                "privateIPAllocationMethod": "Dynamic",
                            },
                        }
                    ],
                },
            }
        )

    def puts(self) -> list[tuple[str, str]]:
        out = []
        for r in self.cloud.seen("PUT", VMS + r"/[^/]+"):
            body = r.json()
            out.append(
                (body["properties"]["hardwareProfile"]["vmSize"], (body.get("zones") or [""])[0])
            )
        return out
