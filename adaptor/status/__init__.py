"""The adaptor's status API: sandboxes, their VMs and per-container device status, and metrics."""

from adaptor.status.abandoned import AbandonedBook
from adaptor.status.app import build_app
from adaptor.status.devices import ContainerDeviceState, DeviceBook, DeviceState

__all__ = ["AbandonedBook", "ContainerDeviceState", "DeviceBook", "DeviceState", "build_app"]
