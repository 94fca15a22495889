"""The adaptor's status API: sandboxes, their VMs and per-container device status, and metrics.

Its modules, one job each: `app` (the Starlette application and the JSON views of a sandbox),
`server` (uvicorn inside the daemon's event loop), `devices` (the device book CreateContainer
updates), `abandoned` (sandboxes given up after a restart), `hosts` (the Host header check).
Other packages import the names below from `adaptor.status`.
"""

from adaptor.status.abandoned import AbandonedBook
from adaptor.status.app import (
    SandboxSource,
    build_app,
    quarantined_json,
    refresh_sandbox_gauge,
    sandbox_json,
)
from adaptor.status.devices import ContainerDeviceState, DeviceBook, DeviceState
from adaptor.status.hosts import HostCheck, host_allowed
from adaptor.status.server import StatusServer, parse_address

__all__ = [
    "AbandonedBook",
    "ContainerDeviceState",
    "DeviceBook",
    "DeviceState",
    "HostCheck",
    "SandboxSource",
    "StatusServer",
    "build_app",
    "host_allowed",
    "parse_address",
    "quarantined_json",
    "refresh_sandbox_gauge",
    "sandbox_json",
]
