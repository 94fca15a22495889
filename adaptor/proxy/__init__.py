"""The agent proxy: one per sandbox, between the Kata shim and the pod VM's forwarder."""

from ._proxy import AgentProxy, Completion, CreateContainerHook
from .dial import Dial, client_tls_context, tcp_dialer

__all__ = [
    "AgentProxy",
    "Completion",
    "CreateContainerHook",
    "Dial",
    "client_tls_context",
    "tcp_dialer",
]
