"""The plugin's gRPC surface: registration on the kubelet's registry socket, v1.DRAPlugin on
the plugin's own socket. Each call's claims are prepared in threads (API reads, file writes);
one claim's failure is its own answer's `error`, never the whole call's.

The DRA service is registered under its proto package name
(`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`) and under the version name the registration
advertises (`v1.DRAPlugin`), so either spelling a kubelet dials reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

from adaptor.dra.state import ClaimError, ClaimRef, DeviceState
from adaptor.ttrpc.gen import dra_pb2, pluginregistration_pb2
from providers.core.errors import PeerpodsError
from providers.dra.slices import DRIVER

__all__ = ["DRA_SERVICES", "SUPPORTED_VERSIONS", "PluginServer"]

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v1.DRAPlugin",)
DRA_SERVICES = ("k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", "v1.DRAPlugin")
REGISTRATION_SERVICE = "pluginregistration.Registration"


def _unary(
    handler: Callable[[Any, Any], Any], request: Any, response: Any
) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        handler,
        request_deserializer=request.FromString,
        response_serializer=response.SerializeToString,
    )


def _request_names(request: str) -> list[str]:
    """The request a device was allocated for, and for a `firstAvailable` subrequest
    (`<main>/<sub>`) its main request too, which is what a container's claim names."""
    if not request:
        return []
    main = request.split("/", 1)[0]
    return [request] if main == request else [request, main]


class _QuietHealth(grpc.GenericRpcHandler):  # type: ignore[misc]
    """The kubelet's optional device-health stream (`NodeWatchResources`): held open with
    nothing to report (a pod VM's GPUs are not watched from the node), rather than answered
    Unimplemented, which the kubelet logs and retries every 5 s."""

    def service(self, details: Any) -> grpc.RpcMethodHandler | None:
        if str(details.method).endswith("/NodeWatchResources"):
            return grpc.unary_stream_rpc_method_handler(_no_health_reports)
        return None


async def _no_health_reports(request: bytes, context: Any) -> AsyncIterator[bytes]:
    await asyncio.Event().wait()  # until the kubelet hangs up or the server stops
    yield b""  # never reached: makes this the stream handler it must be


class PluginServer:
    """Both sockets of the plugin, started and stopped together."""

    def __init__(self, state: DeviceState, registry_dir: Path, plugin_dir: Path) -> None:
        self.state = state
        self.registration_socket = registry_dir / f"{DRIVER}-reg.sock"
        self.plugin_socket = plugin_dir / "dra.sock"
        self.registered: asyncio.Event = asyncio.Event()
        self.registration_error = ""
        self._servers: list[grpc.aio.Server] = []

    async def get_info(self, request: Any, context: Any) -> Any:
        return pluginregistration_pb2.PluginInfo(
            type="DRAPlugin",
            name=DRIVER,
            endpoint=str(self.plugin_socket),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    async def notify(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:
            log.info("the kubelet registered plugin %s", DRIVER)
            self.registered.set()
        else:
            self.registration_error = request.error
            log.error("the kubelet refused plugin %s: %s", DRIVER, request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()

    async def prepare(self, request: Any, context: Any) -> Any:
        answer = dra_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.name, claim.uid)
            entry = answer.claims[claim.uid]
            try:
                prepared = await asyncio.to_thread(self.state.prepare, ref)
            except (ClaimError, PeerpodsError, OSError) as exc:
                log.warning("preparing claim %s/%s failed: %s", ref.namespace, ref.name, exc)
                entry.error = str(exc)
                continue
            for device, cdi_id in zip(prepared.devices, prepared.cdi_ids, strict=True):
                entry.devices.append(
                    dra_pb2.Device(
                        request_names=_request_names(device.request),
                        pool_name=device.pool,
                        device_name=device.device,
                        cdi_device_ids=[cdi_id],
                    )
                )
        return answer

    async def unprepare(self, request: Any, context: Any) -> Any:
        answer = dra_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.name, claim.uid)
            entry = answer.claims[claim.uid]
            try:
                await asyncio.to_thread(self.state.unprepare, ref)
            except (PeerpodsError, OSError) as exc:
                entry.error = str(exc)
        return answer

    def _handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        dra = {
            "NodePrepareResources": _unary(
                self.prepare,
                dra_pb2.NodePrepareResourcesRequest,
                dra_pb2.NodePrepareResourcesResponse,
            ),
            "NodeUnprepareResources": _unary(
                self.unprepare,
                dra_pb2.NodeUnprepareResourcesRequest,
                dra_pb2.NodeUnprepareResourcesResponse,
            ),
        }
        services = tuple(grpc.method_handlers_generic_handler(name, dra) for name in DRA_SERVICES)
        return (*services, _QuietHealth())

    async def start(self) -> None:
        """Serve the DRA service first, then registration (the kubelet dials the endpoint it is
        given as soon as it reads GetInfo)."""
        plugin = grpc.aio.server()
        plugin.add_generic_rpc_handlers(self._handlers())
        await self._listen(plugin, self.plugin_socket)
        registration = grpc.aio.server()
        registration.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    REGISTRATION_SERVICE,
                    {
                        "GetInfo": _unary(
                            self.get_info,
                            pluginregistration_pb2.InfoRequest,
                            pluginregistration_pb2.PluginInfo,
                        ),
                        "NotifyRegistrationStatus": _unary(
                            self.notify,
                            pluginregistration_pb2.RegistrationStatus,
                            pluginregistration_pb2.RegistrationStatusResponse,
                        ),
                    },
                ),
            )
        )
        await self._listen(registration, self.registration_socket)

    async def _listen(self, server: grpc.aio.Server, path: Path) -> None:
        await asyncio.to_thread(_fresh_socket_path, path)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        self._servers.append(server)

    async def stop(self, grace_seconds: float = 5.0) -> None:
        """Stop both servers and remove the registration socket (the kubelet deregisters)."""
        for server in reversed(self._servers):
            await server.stop(grace_seconds)
        self._servers.clear()
        for path in (self.registration_socket, self.plugin_socket):
            await asyncio.to_thread(path.unlink, missing_ok=True)


def _fresh_socket_path(path: Path) -> None:
    """The socket's directory exists and no socket of a previous process is in the way."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
