"""The DRA driver `gpu.peerpods.io`: the cloud's GPUs as ResourceSlices, and their publisher.

`slices` is the pure part (catalog + limits + account quotas -> pools); `publisher` writes the
difference to the API server and keeps it current.
"""

from providers.dra.slices import (
    DRIVER,
    NODE_LABEL,
    Pool,
    PublishedDevice,
    build_pool,
    parse_gpu_limits,
)

__all__ = [
    "DRIVER",
    "NODE_LABEL",
    "Pool",
    "PublishedDevice",
    "build_pool",
    "parse_gpu_limits",
]
