"""The sandbox lifecycle behind Kata's remote hypervisor API, free of any wire format.

CreateVM records, StartVM creates the VM and its agent proxy, StopVM tears both down. Every step
is written to the state store before it is acted on or answered, so a restarted daemon knows
which VMs exist; a VM that was created is either recorded or deleted, whatever fails.

`SandboxManager` is the one object the service, the daemon and the background loops hold; it
composes three parts over the one table it is given (adaptor.hypervisor.table, which takes the
collaborators):

    start      CreateVM and StartVM (adaptor.hypervisor.start)
    teardown   StopVM, a failed start's cleanup, abandon, the reaper's and preemption's entries
               (adaptor.hypervisor.teardown)
    recovery   a restart's or take-over's recovery and its reconnect grace
               (adaptor.hypervisor.recovery)

Calls for one sandbox are serialized by a per-sandbox lock, with one exception: StopVM never
waits behind StartVM. It cancels a start in flight, records that the sandbox is stopping, and
hands the teardown to a task the manager owns.
"""

from __future__ import annotations

from pathlib import Path

from adaptor.hypervisor.collaborators import (
    AgentProxyHandle,
    ManagerConfig,
    Planner,
    ProxyFactory,
    UserDataBuilder,
)
from adaptor.hypervisor.errors import (
    SandboxBusy,
    SandboxNotFound,
    ShuttingDown,
    StartAborted,
    StartTimeout,
    check_sandbox_id,
    failure_category,
)
from adaptor.hypervisor.hooks import SandboxHook
from adaptor.hypervisor.pod_network import PodNetworkHook
from adaptor.hypervisor.recovery import RECOVER_CONCURRENCY, Recovery
from adaptor.hypervisor.start import Starts
from adaptor.hypervisor.table import AGENT_SOCKET_NAME, SandboxTable
from adaptor.hypervisor.teardown import Teardowns, answer_within
from adaptor.state import StateStore
from providers.core.base import Instance, Provider


class SandboxManager:
    """Owns every sandbox on this node: records, VMs and agent proxies (see the module)."""

    def __init__(self, table: SandboxTable) -> None:
        self.table = table
        self.teardowns = Teardowns(self.table)
        self.starts = Starts(self.table, self.teardowns)
        self.recovery = Recovery(self.table, self.teardowns)
        # the calls of the hypervisor service
        self.create_vm = self.starts.create_vm
        self.start_vm = self.starts.start_vm
        self.stop_vm = self.teardowns.stop_vm
        # the reaper's, the preemption watcher's and the status API's
        self.reap = self.teardowns.reap
        self.abandon = self.teardowns.abandon
        self.mark_preempted = self.teardowns.mark_preempted
        self.owed = self.teardowns.owed
        self.busy = self.table.busy
        # the daemon's: restart and shutdown
        self.recover = self.recovery.recover
        self.release_agent_sockets = self.table.release_agent_sockets
        self.drain = self.table.drain
        self.close = self.table.close
        self.hand_off = self.table.hand_off

    @property
    def config(self) -> ManagerConfig:
        return self.table.config

    @property
    def store(self) -> StateStore:
        return self.table.store

    @property
    def provider(self) -> Provider:
        return self.table.provider

    def serving(self, sandbox_id: str) -> bool:
        """Whether this process serves the sandbox's agent socket now."""
        return sandbox_id in self.table.proxies

    def proxy_of(self, sandbox_id: str) -> AgentProxyHandle | None:
        """The agent proxy serving a sandbox now, if any."""
        return self.table.proxies.get(sandbox_id)

    def socket_path(self, sandbox_id: str) -> Path:
        return self.table.socket_path(sandbox_id)

    def default_endpoint(self, instance: Instance) -> tuple[str, int]:
        return self.table.default_endpoint(instance)


__all__ = [
    "AGENT_SOCKET_NAME",
    "RECOVER_CONCURRENCY",
    "AgentProxyHandle",
    "ManagerConfig",
    "Planner",
    "PodNetworkHook",
    "ProxyFactory",
    "SandboxBusy",
    "SandboxHook",
    "SandboxManager",
    "SandboxNotFound",
    "SandboxTable",
    "ShuttingDown",
    "StartAborted",
    "StartTimeout",
    "UserDataBuilder",
    "answer_within",
    "check_sandbox_id",
    "failure_category",
]
