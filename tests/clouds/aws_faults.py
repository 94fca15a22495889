"""Fault injection for boto3 clients under moto: EC2 error responses before moto sees a call.

A hook on the client's `before-call` event answers chosen calls with EC2's error (code, message,
HTTP status as EC2 sends them); botocore raises the same ClientError a real throttled or
capacity-starved region produces, and moto never runs the call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from botocore.awsrequest import AWSResponse

STATUS = {
    "InsufficientInstanceCapacity": 500,
    "Unsupported": 400,
    "RequestLimitExceeded": 503,
    "InternalError": 500,
    "UnauthorizedOperation": 403,
    "InvalidAMIID.NotFound": 400,
}


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


def error_response(code: str, message: str = "injected") -> AWSResponse:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error>"
        "</Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
    ).encode()
    return AWSResponse("https://ec2.amazonaws.com/", STATUS.get(code, 400), {}, _Raw(body))


Rule = Callable[[str, dict[str, str]], str | None]


def by_instance_id(action: str, params: dict[str, str]) -> bool:
    """A DescribeInstances that looks instances up by id (a VM's state, while it starts or
    when it is inspected), not one that lists the owner's VMs."""
    names = (v for k, v in params.items() if k.startswith("Filter.") and k.endswith(".Name"))
    return action == "DescribeInstances" and "instance-id" in names


@dataclass
class Faults:
    """Rules decide per call (action, params) which error code to answer, or None to pass."""

    rules: list[Rule] = field(default_factory=list)
    calls: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    injected: list[tuple[str, str]] = field(default_factory=list)

    def install(self, client: Any) -> None:
        client.meta.events.register_first("before-call.ec2", self._hook)

    def _hook(
        self, model: Any, params: dict[str, Any], **_: Any
    ) -> tuple[AWSResponse, dict[str, Any]] | None:
        body = params.get("body", {})
        if isinstance(body, str | bytes):
            fields = {
                k: v[0]
                for k, v in parse_qs(body if isinstance(body, str) else body.decode()).items()
            }
        else:
            fields = {str(k): str(v) for k, v in body.items()}
        action = str(model.name)
        self.calls.append((action, fields))
        for rule in self.rules:
            code = rule(action, fields)
            if code:
                self.injected.append((action, code))
                status = STATUS.get(code, 400)
                parsed = {
                    "Error": {"Code": code, "Message": "injected"},
                    "ResponseMetadata": {"HTTPStatusCode": status},
                }
                return error_response(code), parsed
        return None

    def launches(self) -> list[tuple[str, str]]:
        """(type, zone) of every RunInstances the provider sent."""
        return [
            (p.get("InstanceType", ""), p.get("Placement.AvailabilityZone", ""))
            for a, p in self.calls
            if a == "RunInstances"
        ]
