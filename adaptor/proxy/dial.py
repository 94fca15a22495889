"""How the proxy reaches the pod VM forwarder: TCP, mutual TLS by default, and with the adaptor's
own CA a server certificate that must name the sandbox being dialed (`adaptor.proxy.pki`)."""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from collections.abc import Awaitable, Callable

from adaptor.proxy.pki import WrongSandbox, check_sandbox
from adaptor.ttrpc.connection import close_writer, open_tcp
from adaptor.ttrpc.status import Code, TtrpcError
from providers.core.errors import InvalidRequest

Dial = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


def tcp_dialer(
    host: str, port: int, ssl: ssl_module.SSLContext | None, sandbox_id: str | None = None
) -> Dial:
    """A Dial for HOST:PORT; a failed attempt raises TtrpcError(UNAVAILABLE). With TLS and a
    `sandbox_id`, the server's certificate must be issued for that sandbox."""

    async def dial() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await open_tcp(host, port, ssl)
        if ssl is not None and sandbox_id is not None:
            tls = writer.get_extra_info("ssl_object")
            try:
                check_sandbox(tls.getpeercert(binary_form=True) if tls else None, sandbox_id)
            except WrongSandbox as exc:
                await close_writer(writer)
                raise TtrpcError(Code.UNAVAILABLE, f"connect {host}:{port}: {exc}") from None
        return reader, writer

    return dial


def client_tls_context(ca_file: str, cert_file: str, key_file: str) -> ssl_module.SSLContext:
    """mTLS client context: the forwarder must chain to `ca_file`, we present cert/key.

    The host name is not checked (a VM is reached by an address its certificate cannot know in
    advance); with the adaptor's own CA the dialer checks the sandbox the certificate names.
    """
    try:
        context = ssl_module.create_default_context(ssl_module.Purpose.SERVER_AUTH, cafile=ca_file)
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl_module.SSLError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        files = f"{ca_file}, {cert_file}, {key_file}"
        raise InvalidRequest(f"agent TLS files ({files}): {why}") from exc
    context.check_hostname = False
    context.verify_mode = ssl_module.CERT_REQUIRED
    context.minimum_version = ssl_module.TLSVersion.TLSv1_2
    return context
