"""`hypervisor.Hypervisor` on ttrpc: decodes Kata's requests, calls the sandbox manager, and maps
its errors to the status codes the shim sees.

    InvalidRequest (bad id, annotation)   INVALID_ARGUMENT (names the annotation)
    SandboxNotFound                       NOT_FOUND
    SandboxBusy                           FAILED_PRECONDITION
    StartAborted (StopVM came)            ABORTED
    StartTimeout (--start-timeout)        DEADLINE_EXCEEDED
    CapacityError, QuotaExhausted,        RESOURCE_EXHAUSTED
    VniExhausted (no VNI free)
    NoMatch (selection found no type)     FAILED_PRECONDITION
    TransientError                        UNAVAILABLE
    TtrpcError (forwarder unreachable)    its own code (UNAVAILABLE)
    any other error                       INTERNAL
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from adaptor.hypervisor.sandboxes import SandboxManager
from adaptor.hypervisor.version import package_version
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from adaptor.ttrpc.server import CallContext, Handler, Server
from adaptor.ttrpc.status import Code, TtrpcError
from providers.core.errors import Fault, PeerpodsError

log = logging.getLogger(__name__)

SERVICE = "hypervisor.Hypervisor"
M = TypeVar("M", bound=Message)


def _decode(message_type: type[M], payload: bytes) -> M:
    message: M = message_type()
    try:
        message.ParseFromString(payload)
    except DecodeError as exc:
        raise TtrpcError(Code.INVALID_ARGUMENT, f"cannot decode {message_type.__name__}") from exc
    return message


# The ttrpc status of each fault (providers.core.errors.Fault): the one table of this boundary.
STATUS_OF_FAULT: dict[Fault, Code] = {
    Fault.INVALID: Code.INVALID_ARGUMENT,
    Fault.NOT_FOUND: Code.NOT_FOUND,
    Fault.BUSY: Code.FAILED_PRECONDITION,
    Fault.UNSERVABLE: Code.FAILED_PRECONDITION,
    Fault.EXHAUSTED: Code.RESOURCE_EXHAUSTED,
    Fault.UNAVAILABLE: Code.UNAVAILABLE,
    Fault.ABORTED: Code.ABORTED,
    Fault.TIMEOUT: Code.DEADLINE_EXCEEDED,
    Fault.INTERNAL: Code.INTERNAL,
}


def to_status(exc: Exception) -> TtrpcError:
    """The ttrpc status for an error raised by the manager."""
    if isinstance(exc, TtrpcError):
        return exc
    if isinstance(exc, PeerpodsError):
        return TtrpcError(STATUS_OF_FAULT[exc.fault], str(exc))
    log.error("unexpected error in the hypervisor service", exc_info=exc)
    return TtrpcError(Code.INTERNAL, f"internal error: {type(exc).__name__}")


class HypervisorService:
    """The four methods Kata's remote hypervisor calls."""

    def __init__(self, manager: SandboxManager) -> None:
        self.manager = manager

    def register(self, server: Server) -> None:
        server.register(SERVICE, self.handlers())

    def handlers(self) -> dict[str, Handler]:
        return {
            "CreateVM": self._guard(self.create_vm),
            "StartVM": self._guard(self.start_vm),
            "StopVM": self._guard(self.stop_vm),
            "Version": self._guard(self.version),
        }

    @staticmethod
    def _guard(method: Callable[[CallContext, bytes], Awaitable[bytes]]) -> Handler:
        async def handler(ctx: CallContext, payload: bytes) -> bytes:
            try:
                return await method(ctx, payload)
            except TtrpcError:
                raise
            except Exception as exc:
                raise to_status(exc) from exc

        return handler

    async def create_vm(self, ctx: CallContext, payload: bytes) -> bytes:
        request = _decode(pb.CreateVMRequest, payload)
        path = await self.manager.create_vm(
            request.id, dict(request.annotations), request.networkNamespacePath
        )
        return bytes(pb.CreateVMResponse(agentSocketPath=path).SerializeToString())

    async def start_vm(self, ctx: CallContext, payload: bytes) -> bytes:
        request = _decode(pb.StartVMRequest, payload)
        await self.manager.start_vm(request.id)
        return bytes(pb.StartVMResponse().SerializeToString())

    async def stop_vm(self, ctx: CallContext, payload: bytes) -> bytes:
        """Answers within the caller's deadline (runtime-rs: 1 s); the delete goes on."""
        request = _decode(pb.StopVMRequest, payload)
        deadline = ctx.timeout_nano / 1e9 if ctx.timeout_nano > 0 else None
        await self.manager.stop_vm(request.id, deadline_seconds=deadline)
        return bytes(pb.StopVMResponse().SerializeToString())

    async def version(self, ctx: CallContext, payload: bytes) -> bytes:
        _decode(pb.VersionRequest, payload)
        return bytes(pb.VersionResponse(version=package_version()).SerializeToString())
