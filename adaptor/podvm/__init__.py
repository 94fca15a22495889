"""The pod VM's half: the planned MIG devices created through NVML and the CDI specs binding each
name the adaptor injects to the device created (`peerpods podvm prepare`, at boot).

`layout` (what the adaptor sends) imports nothing heavy and is used by the adaptor too: its
names are the ones below. The other modules are the VM-side command's steps, imported by it
alone: `prepare` (the whole boot step), `mig` (MIG devices made to the layout), `spec` (the CDI
specs written for them), `nvml` (the NVML calls; `nvidia-ml-py`, the `peerpods[podvm]` extra, is
imported only when `prepare` runs), `host` (what the VM's own filesystem says about its
devices), `status` (what `prepare` did per device: the status file and the console lines).
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
