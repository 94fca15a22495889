"""What the sandbox lifecycle needs of the rest of the daemon, as types: its settings, the agent
proxy of a sandbox, and the planner and the user data StartVM asks (the hooks that add steps are
adaptor.hypervisor.hooks). The daemon (adaptor.node) supplies the real ones; tests supply fakes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from adaptor.planning.placement import Plan
from adaptor.settings import SandboxSettings
from adaptor.state import SandboxRecord
from providers.core.contract import VMIntent


class ManagerConfig(SandboxSettings):
    """The daemon settings the lifecycle needs: the sandbox section (pods dir, forwarder port,
    StartVM's and StopVM's limits) and the lifecycle's own tuning below."""

    # Backoff between retries of a VM delete that failed (doubling up to the cap); the same
    # backoff retries the state writes a full disk refused.
    delete_retry_seconds: float = 1.0
    delete_retry_max_seconds: float = 30.0


class AgentProxyHandle(Protocol):
    """What the manager needs of a sandbox's agent proxy."""

    async def start(self) -> None:
        """Listen on the agent socket."""
        ...

    async def connect(self, timeout_seconds: float) -> None:
        """Dial the pod VM forwarder, retrying until the timeout."""
        ...

    async def stop(self) -> None:
        """Close the agent socket and the upstream connection."""
        ...

    @property
    def shims(self) -> int:
        """Shim connections open now."""
        ...

    async def wait_for_shim(self) -> None:
        """Until a shim has connected to the agent socket since `start`."""
        ...


# (sandbox record, agent socket path, forwarder host, forwarder port) -> an unstarted proxy
ProxyFactory = Callable[[SandboxRecord, str, str, int], AgentProxyHandle]


class Planner(Protocol):
    """What StartVM needs of placement (adaptor.planning.placement.Placement is the one)."""

    async def plan(self, intent: VMIntent, sandbox_id: str) -> Plan:
        """The typed plan: candidates best first, reserved against the quota pool."""
        ...

    def release(self, sandbox_id: str) -> None:
        """Forget the sandbox's reservation (its start failed, or it stopped)."""
        ...


# The pod VM's user data for a sandbox and its plan (adaptor.planning.userdata.PodVmUserData's
# `build`); a daemon without one (static, local providers) gives the VM none.
UserDataBuilder = Callable[[SandboxRecord, Plan], str]
