"""Per-container devices: the sandbox's device plan and the CreateContainer rewrite."""

from adaptor.devices.config import CdiConfig, cdi_config
from adaptor.devices.hook import make_hook
from adaptor.devices.naming import CdiNaming
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
    "RewriteError",
    "cdi_config",
    "make_hook",
    "plan_devices",
    "rewrite_create_container",
]
