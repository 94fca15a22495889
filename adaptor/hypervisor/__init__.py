"""Kata's remote hypervisor service `hypervisor.Hypervisor` and the sandbox lifecycle."""

from adaptor.hypervisor.sandboxes import (
    AgentProxyHandle,
    ManagerConfig,
    Planner,
    ProxyFactory,
    SandboxBusy,
    SandboxHook,
    SandboxManager,
    SandboxNotFound,
    SandboxTable,
    StartAborted,
    StartTimeout,
)

__all__ = [
    "AgentProxyHandle",
    "ManagerConfig",
    "Planner",
    "ProxyFactory",
    "SandboxBusy",
    "SandboxHook",
    "SandboxManager",
    "SandboxNotFound",
    "SandboxTable",
    "StartAborted",
    "StartTimeout",
]
