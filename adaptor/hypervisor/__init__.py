"""Kata's remote hypervisor service `hypervisor.Hypervisor` and the sandbox lifecycle."""

from adaptor.hypervisor.sandboxes import (
    AgentProxyHandle,
    CandidateChooser,
    EndpointResolver,
    ManagerConfig,
    ProxyFactory,
    SandboxBusy,
    SandboxManager,
    SandboxNotFound,
    machine_type_candidates,
)

__all__ = [
    "AgentProxyHandle",
    "CandidateChooser",
    "EndpointResolver",
    "ManagerConfig",
    "ProxyFactory",
    "SandboxBusy",
    "SandboxManager",
    "SandboxNotFound",
    "machine_type_candidates",
]
