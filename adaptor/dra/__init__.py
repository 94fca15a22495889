"""The kubelet plugin of driver gpu.peerpods.io (`peerpods serve --dra-plugin`).

`server` is the gRPC surface (registration, v1.DRAPlugin), `state` prepares and unprepares
claims, `checkpoint` keeps what was prepared on disk, `cdi` writes the per-claim CDI specs and
reads their environment back at CreateContainer; `settings` declares the plugin's flags.
"""

from adaptor.dra.cdi import CDI_VENDOR, ENV_PREFIX, devices_in_env
from adaptor.dra.checkpoint import Checkpoint, CheckpointError, PreparedClaim
from adaptor.dra.settings import DraPluginSettings
from adaptor.dra.state import ClaimError, ClaimRef, DeviceState

__all__ = [
    "CDI_VENDOR",
    "ENV_PREFIX",
    "Checkpoint",
    "CheckpointError",
    "ClaimError",
    "ClaimRef",
    "DeviceState",
    "DraPluginSettings",
    "PreparedClaim",
    "devices_in_env",
]
