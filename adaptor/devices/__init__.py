"""Per-container devices: the sandbox's device plan and the CreateContainer rewrite.

Its modules, one job each: `plan` (a sandbox's GPUs, MIG devices and RDMA devices, and the CDI
names of each), `naming` (the CDI name templates), `rewrite` (a CreateContainer request with its
container's CDI edits), `sanitize` (GPU access a container did not get from its plan, taken
away), `hook` (the rewrite as the agent proxy's CreateContainer hook), `config` (the CDI settings
in use). Other packages import the names below from `adaptor.devices`.
"""

from adaptor.devices.config import CdiConfig, cdi_config
from adaptor.devices.hook import OutcomeObserver, make_hook
from adaptor.devices.naming import CdiNaming, naming_from_flags
from adaptor.devices.plan import DevicePlan, MigDevice, plan_devices
from adaptor.devices.rewrite import CDI_MODES, CdiMode, RewriteError, rewrite_create_container
from adaptor.proxy import CreateContainerHook

__all__ = [
    "CDI_MODES",
    "CdiConfig",
    "CdiMode",
    "CdiNaming",
    "CreateContainerHook",
    "DevicePlan",
    "MigDevice",
    "OutcomeObserver",
    "RewriteError",
    "cdi_config",
    "make_hook",
    "naming_from_flags",
    "plan_devices",
    "rewrite_create_container",
]
