"""The DeviceClasses of driver gpu.peerpods.io, as config/deploy/dra/deviceclasses.yaml ships
them (a test holds the two equal): `peerpods plan --dra-driver` uses these when the manifest
brings none. Every selector tests each attribute it reads with has() first: one CEL error fails
the whole claim, and another driver's device has none of these attributes."""

from __future__ import annotations

from typing import Any

from providers.dra.slices import API_VERSION, DRIVER

__all__ = ["CLAIMS_CLASS", "EXTENDED_CLASS", "FRACTION_CLASS", "device_classes"]

CLAIMS_CLASS = DRIVER
EXTENDED_CLASS = f"nvidia-gpu.{DRIVER}"
FRACTION_CLASS = f"fraction.{DRIVER}"

_A = f"device.attributes['{DRIVER}']"
WHOLE = (
    f"device.driver == '{DRIVER}' && has({_A}.type) && {_A}.type == 'gpu' && "
    f"has({_A}.shared) && !{_A}.shared"
)
SHARED = f"device.driver == '{DRIVER}' && has({_A}.shared) && {_A}.shared"


def _class(name: str, expression: str, extended: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if extended:
        spec["extendedResourceName"] = extended
    spec["selectors"] = [{"cel": {"expression": expression}}]
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def device_classes() -> dict[str, dict[str, Any]]:
    """Whole GPUs for claims; whole GPUs for `nvidia.com/gpu`; shares of a GPU."""
    return {
        CLAIMS_CLASS: _class(CLAIMS_CLASS, WHOLE),
        EXTENDED_CLASS: _class(EXTENDED_CLASS, WHOLE, "nvidia.com/gpu"),
        FRACTION_CLASS: _class(FRACTION_CLASS, SHARED),
    }
