"""How the proxy reaches the pod VM forwarder: TCP, mutual TLS by default."""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from collections.abc import Awaitable, Callable

from adaptor.ttrpc.connection import open_tcp
from providers.errors import InvalidRequest

Dial = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


def tcp_dialer(host: str, port: int, ssl: ssl_module.SSLContext | None) -> Dial:
    """A Dial for HOST:PORT; a failed attempt raises TtrpcError(UNAVAILABLE)."""

    async def dial() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await open_tcp(host, port, ssl)

    return dial


def client_tls_context(ca_file: str, cert_file: str, key_file: str) -> ssl_module.SSLContext:
    """mTLS client context: the forwarder must chain to `ca_file`, we present cert/key.

    The host name is not checked: each pod VM's certificate is issued by this CA for that VM and
    the VM is reached by address, so the CA is the trust anchor.
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
