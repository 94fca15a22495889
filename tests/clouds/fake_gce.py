"""A stateful Compute Engine instances API behind the shared FakeCloud (real response shapes).

Enough of GCE for the pod VM lifecycle: instances.insert / get / delete / aggregatedList and
zoneOperations.get, with operations that finish at once (`status: DONE`) and faults a test can
inject per call: a stockout or quota error as GCE reports it (an operation that is DONE with an
error, or an HTTP error body with `errors[].reason`), or throttling.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.providers.fakes.gcp import COMPUTE, PROJECT, client
from tests.providers.fakes.http import FakeCloud, FakeResponse, RecordedRequest, json_response

BASE = f"https://compute.googleapis.com/compute/v1/projects/{PROJECT}"

# A fault decides per call: (action, zone, request body) -> response to send instead, or None.
Fault = Callable[[str, str, dict[str, Any]], "FakeResponse | dict[str, Any] | None"]


def stockout(zone: str) -> dict[str, Any]:
    """The error an insert's operation ends with when the zone has no capacity."""
    return {
        "errors": [
            {
                "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                "message": f"The zone 'projects/{PROJECT}/zones/{zone}' does not have enough "
                "resources available to fulfill the request. Try a different zone, or try again "
                "later.",
            }
        ]
    }


def quota_exceeded(metric: str = "NVIDIA_H100_GPUS") -> FakeResponse:
    message = f"Quota '{metric}' exceeded.  Limit: 8.0 in region us-central1."
    return json_response(
        {
            "error": {
                "code": 403,
                "message": message,
                "errors": [
                    {"message": message, "domain": "usageLimits", "reason": "quotaExceeded"}
                ],
            }
        },
        403,
    )


def rate_limited() -> FakeResponse:
    message = "Rate Limit Exceeded"
    return json_response(
        {
            "error": {
                "code": 429,
                "message": message,
                "errors": [
                    {"message": message, "domain": "usageLimits", "reason": "rateLimitExceeded"}
                ],
            }
        },
        429,
    )


def http_error(status: int, reason: str, message: str) -> FakeResponse:
    body = {
        "error": {
            "code": status,
            "message": message,
            "errors": [{"reason": reason, "message": message}],
        }
    }
    return json_response(body, status)


@dataclass
class FakeGce:
    """Instances by (zone, name); every request is also in `cloud.requests`."""

    cloud: FakeCloud = field(default_factory=FakeCloud)
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    _ids: Any = field(default_factory=lambda: itertools.count(1000))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        zone_instances = rf"{COMPUTE}/zones/(?P<zone>[^/]+)/instances"
        self.cloud.route("POST", zone_instances, self._insert)
        self.cloud.route("GET", zone_instances + r"/(?P<name>[^/]+)", self._get)
        self.cloud.route("DELETE", zone_instances + r"/(?P<name>[^/]+)", self._delete)
        self.cloud.route("GET", rf"{COMPUTE}/aggregated/instances", self._aggregated)
        self.cloud.route(
            "POST",
            zone_instances + r"/(?P<name>[^/]+)/(?P<action>stop|start|setMetadata|setLabels)",
            self._action,
        )
        self.cloud.route(
            "GET", rf"{COMPUTE}/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)", self._op_get
        )

    def client(self) -> Any:
        from google.cloud import compute_v1

        return client(self.cloud, compute_v1.InstancesClient)

    def _fault(
        self, action: str, zone: str, body: dict[str, Any]
    ) -> FakeResponse | dict[str, Any] | None:
        for fault in self.faults:
            answer = fault(action, zone, body)
            if answer is not None:
                return answer
        return None

    def _operation(
        self, kind: str, zone: str, target: str, error: dict[str, Any] | None = None
    ) -> FakeResponse:
        op_id = next(self._ids)
        body: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(op_id),
            "name": f"operation-{op_id}",
            "zone": f"{BASE}/zones/{zone}",
            "operationType": kind,
            "targetLink": target,
            "status": "DONE",
            "progress": 100,
            "selfLink": f"{BASE}/zones/{zone}/operations/operation-{op_id}",
        }
        if error is not None:
            body["error"] = error
            body["httpErrorStatusCode"] = 503
            body["httpErrorMessage"] = "SERVICE UNAVAILABLE"
        return json_response(body)

    def _insert(self, request: RecordedRequest) -> FakeResponse:
        assert request.match is not None
        zone = request.match["zone"]
        body = request.json()
        name = body["name"]
        target = f"{BASE}/zones/{zone}/instances/{name}"
        fault = self._fault("insert", zone, body)
        if isinstance(fault, FakeResponse):
            return fault
        if fault is not None:
            return self._operation("insert", zone, target, fault)
        with self._lock:
            if (zone, name) in self.instances:
                return http_error(409, "alreadyExists", f"The resource '{target}' already exists")
            n = next(self._ids)
            instance = {
                "kind": "compute#instance",
                "id": str(n),
                "name": name,
                "zone": f"{BASE}/zones/{zone}",
                "machineType": f"{BASE}/{body['machineType']}",
                "status": "RUNNING",
                "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000-00:00", time.gmtime()),
                "labels": body.get("labels", {}),
                "labelFingerprint": "l0=",
                "metadata": {
                    "kind": "compute#metadata",
                    "fingerprint": "abc=",
                    **body.get("metadata", {}),
                },
                "networkInterfaces": [
                    {
                        **nic,
                        "name": f"nic{i}",
                        "networkIP": f"10.128.{n // 250}.{n % 250 + 2}",
                        "accessConfigs": [
                            {**ac, "natIP": f"34.1.{n // 250}.{n % 250}"}
                            for ac in nic.get("accessConfigs", [])
                        ],
                    }
                    for i, nic in enumerate(body.get("networkInterfaces", []))
                ],
                "disks": body.get("disks", []),
                "scheduling": body.get("scheduling", {}),
                "guestAccelerators": body.get("guestAccelerators", []),
                "selfLink": target,
            }
            self.instances[(zone, name)] = instance
        return self._operation("insert", zone, target)

    def _get(self, request: RecordedRequest) -> FakeResponse:
        assert request.match is not None
        key = (request.match["zone"], request.match["name"])
        with self._lock:
            found = self.instances.get(key)
        if found is None:
            return http_error(404, "notFound", f"The resource '{key[1]}' was not found")
        fault = self._fault("get", key[0], found)
        if isinstance(fault, FakeResponse):
            return fault
        return json_response(found if fault is None else fault)

    def _delete(self, request: RecordedRequest) -> FakeResponse:
        assert request.match is not None
        zone, name = request.match["zone"], request.match["name"]
        fault = self._fault("delete", zone, {"name": name})
        if isinstance(fault, FakeResponse):
            return fault
        with self._lock:
            if self.instances.pop((zone, name), None) is None:
                return http_error(404, "notFound", f"The resource '{name}' was not found")
        return self._operation("delete", zone, f"{BASE}/zones/{zone}/instances/{name}")

    def _action(self, request: RecordedRequest) -> FakeResponse:
        """stop and start (status TERMINATED, RUNNING), setMetadata and setLabels (replacing
        them whole, as GCP does, refused on a stale fingerprint)."""
        assert request.match is not None
        zone, name, action = request.match["zone"], request.match["name"], request.match["action"]
        target = f"{BASE}/zones/{zone}/instances/{name}"
        fault = self._fault(action, zone, {"name": name})
        if isinstance(fault, FakeResponse):
            return fault
        if fault is not None:
            return self._operation(action, zone, target, fault)
        with self._lock:
            instance = self.instances.get((zone, name))
            if instance is None:
                return http_error(404, "notFound", f"The resource '{target}' was not found")
            if action in ("stop", "start"):
                instance["status"] = "TERMINATED" if action == "stop" else "RUNNING"
            elif action == "setMetadata":
                body = request.json()
                if body.get("fingerprint") != instance["metadata"]["fingerprint"]:
                    return http_error(412, "conditionNotMet", "metadata fingerprint mismatch")
                fingerprint = f"m{next(self._ids)}="
                instance["metadata"] = {
                    "kind": "compute#metadata",
                    "fingerprint": fingerprint,
                    "items": body.get("items", []),
                }
            else:
                body = request.json()
                if body.get("labelFingerprint") != instance.get("labelFingerprint", "l0="):
                    return http_error(412, "conditionNotMet", "label fingerprint mismatch")
                instance["labels"] = body.get("labels", {})
                instance["labelFingerprint"] = f"l{next(self._ids)}="
        return self._operation(action, zone, target)

    def _aggregated(self, request: RecordedRequest) -> FakeResponse:
        wanted = re.fullmatch(r'labels\.([a-z0-9_-]+) = "([^"]*)"', request.query.get("filter", ""))
        items: dict[str, Any] = {}
        with self._lock:
            for (zone, _), instance in sorted(self.instances.items()):
                if wanted and instance["labels"].get(wanted[1]) != wanted[2]:
                    continue
                items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(instance)
        return json_response(
            {
                "kind": "compute#instanceAggregatedList",
                "id": f"projects/{PROJECT}/aggregated/instances",
                "items": items,
            }
        )

    def _op_get(self, request: RecordedRequest) -> FakeResponse:
        assert request.match is not None
        return self._operation("insert", request.match["zone"], "")

    def inserts(self) -> list[tuple[str, str]]:
        """(machine type, zone) of every insert the provider sent."""
        return [
            (r.json()["machineType"].rsplit("/", 1)[-1], r.match["zone"])
            for r in self.cloud.seen("POST", rf"{COMPUTE}/zones/[^/]+/instances")
            if r.match is not None
        ]
