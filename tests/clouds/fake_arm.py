"""A stateful Azure Resource Manager (VMs and their NICs) behind the shared FakeCloud.

PUT creates a VM and its NIC at once (real ARM response shapes); an allocation failure is
reported as ARM does, through an Azure-AsyncOperation that ends Failed while the VM stays behind
in provisioningState Failed. Faults are injected per call.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.providers.fakes.azure import SUBSCRIPTION, compute_client, network_client
from tests.providers.fakes.http import FakeCloud, FakeResponse, RecordedRequest, json_response

RG = "peerpods-rg"
ARM = "https://management.azure.com"
GROUP = rf"/subscriptions/{SUBSCRIPTION}/resourceGroups/(?P<rg>[^/]+)/providers"
VMS = rf"{GROUP}/Microsoft\.Compute/virtualMachines"
NICS = rf"{GROUP}/Microsoft\.Network/networkInterfaces"
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
        self.cloud.route("GET", OPS, self._op)

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
        return json_response(self._ops[request.match["op"]])

    def _get(self, request: RecordedRequest) -> FakeResponse:
        assert request.match is not None
        vm = self.vms.get(request.match["name"])
        if vm is None:
            return arm_error(404, "ResourceNotFound", f"VM {request.match['name']} not found")
        return json_response({k: v for k, v in vm.items() if k != "_ip"})

    def _delete(self, request: RecordedRequest) -> FakeResponse:
        assert request.match is not None
        fault = self._fault("delete", {"name": request.match["name"]})
        if isinstance(fault, FakeResponse):
            return fault
        with self._lock:
            gone = self.vms.pop(request.match["name"], None)
        return FakeResponse(200 if gone else 204, None)

    def _list(self, request: RecordedRequest) -> FakeResponse:
        with self._lock:
            value = [{k: v for k, v in vm.items() if k != "_ip"} for vm in self.vms.values()]
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
