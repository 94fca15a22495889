"""The pod VM's half: the planned MIG devices created through NVML and the CDI specs binding each
name the adaptor injects to the device created (`peerpods podvm prepare`, at boot).

`layout` (what the adaptor sends) imports nothing heavy and is used by the adaptor too; NVML
(`nvidia-ml-py`, the `peerpods[podvm]` extra) is imported only when `prepare` runs.
"""

from adaptor.podvm.layout import (
    APF_KEY,
    GpuLayout,
    Layout,
    LayoutDocument,
    LayoutError,
    MigSpec,
    read_layouts,
)

__all__ = [
    "APF_KEY",
    "GpuLayout",
    "Layout",
    "LayoutDocument",
    "LayoutError",
    "MigSpec",
    "read_layouts",
]
