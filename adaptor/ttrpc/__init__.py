"""ttrpc (containerd's RPC over unix and TCP sockets) on asyncio: codec, server, client.

Kata's shim speaks it to the adaptor (hypervisor.Hypervisor) and to the agent (grpc.AgentService,
grpc.Health), which the agent proxy relays. Generated messages live in `adaptor.ttrpc.gen`.
"""

from .client import Client
from .server import CallContext, Handler, Server
from .status import Code, TtrpcError

__all__ = ["CallContext", "Client", "Code", "Handler", "Server", "TtrpcError"]
