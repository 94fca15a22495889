"""Per-sandbox pod VM certificates, as a tenant would attack them: a forwarder presenting the
certificate another sandbox's VM was given (a tenant-chosen image could read its own) is refused
on connect, and StartVM's error says why instead of "dial timed out"."""

from __future__ import annotations

import asyncio
import ssl
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from adaptor.proxy import AgentProxy, client_tls_context, tcp_dialer
from adaptor.proxy.pki import AdaptorPKI, IssuedPair, certificate_sandboxes
from adaptor.ttrpc import TtrpcError

MINE = "a" * 64
THEIRS = "b" * 64


@asynccontextmanager
async def forwarder(directory: Path, pair: IssuedPair, client_ca: str) -> AsyncIterator[int]:
    """A TLS listener standing in for a pod VM forwarder (mutual TLS, as APF does)."""
    (directory / "s.crt").write_text(pair.cert_pem)
    (directory / "s.key").write_text(pair.key_pem)
    (directory / "client-ca.crt").write_text(client_ca)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "s.crt", directory / "s.key")
    context.load_verify_locations(directory / "client-ca.crt")
    context.verify_mode = ssl.CERT_REQUIRED

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read()
        except (ssl.SSLError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
def pki() -> Iterator[tuple[AdaptorPKI, Path]]:
    with tempfile.TemporaryDirectory(prefix="pp-") as d:
        yield AdaptorPKI.load_or_create(Path(d) / "state"), Path(d)


async def _connect(pki: AdaptorPKI, where: Path, port: int, sandbox: str) -> None:
    tls = client_tls_context(str(pki.ca_file), str(pki.client_cert_file), str(pki.client_key_file))
    proxy = AgentProxy(
        str(where / f"{sandbox[:8]}.sock"),
        tcp_dialer("127.0.0.1", port, tls, sandbox_id=sandbox),
        sandbox_id=sandbox,
    )
    try:
        await proxy.connect(1.5)
    finally:
        await proxy.stop()


def test_server_certificates_name_their_sandbox(pki: tuple[AdaptorPKI, Path]) -> None:
    ca, _ = pki
    pem = ca.issue_server(MINE).cert_pem.encode()
    der = x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)
    assert certificate_sandboxes(der) == [MINE]


async def test_own_certificate_accepted(pki: tuple[AdaptorPKI, Path]) -> None:
    ca, where = pki
    async with forwarder(where, ca.issue_server(MINE), ca.ca_pem) as port:
        await _connect(ca, where, port, MINE)


async def test_another_sandboxs_certificate_refused(pki: tuple[AdaptorPKI, Path]) -> None:
    ca, where = pki
    async with forwarder(where, ca.issue_server(THEIRS), ca.ca_pem) as port:
        with pytest.raises(TtrpcError) as caught:
            await _connect(ca, where, port, MINE)
    message = caught.value.message
    assert f"issued for {THEIRS}, not for sandbox {MINE}" in message, message
    assert "timed out" not in message.split(" (then:")[0]


async def test_certificate_from_another_ca_reported_as_such(pki: tuple[AdaptorPKI, Path]) -> None:
    ca, where = pki
    stranger = AdaptorPKI.load_or_create(where / "other")
    async with forwarder(where, stranger.issue_server(MINE), ca.ca_pem) as port:
        with pytest.raises(TtrpcError) as caught:
            await _connect(ca, where, port, MINE)
    message = caught.value.message
    assert "CERTIFICATE_VERIFY_FAILED" in message or "certificate verify failed" in message
    assert not message.split(": ", 1)[1].startswith("dial timed out")
