"""The adaptor's status API: sandboxes, their VMs and per-container device status, and metrics."""

from adaptor.status.app import build_app
from adaptor.status.devices import ContainerDevices, DeviceBook, DeviceState

__all__ = ["ContainerDevices", "DeviceBook", "DeviceState", "build_app"]
