"""The HTTP layer: garbage is HTTP 400 with a message, bodies are bounded, /healthz answers, and
a rotated certificate is served without a restart."""

from __future__ import annotations

import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from providers.core.catalog import Catalog
from tests.webhook.conftest import Running, client_context, serve
from webhook import Admission, Settings, TlsFiles, WebhookServer


@pytest.fixture
def small(tls_dir: Path, ca: trustme.CA, catalog: Catalog) -> Iterator[Running]:
    yield from serve(tls_dir, ca, Settings(), catalog, max_request_bytes=4096)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}',
        b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", '
        b'"request": {"uid": "u"}}',
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": ""}}',
        b"\xff\xfe\x00",
    ],
)
def test_garbage_is_http_400(webhook: Running, body: bytes) -> None:
    reply = webhook.client.post(webhook.url + "/mutate", content=body)
    assert reply.status_code == 400
    assert reply.text.strip() and "Traceback" not in reply.text


def test_body_size_is_bounded(small: Running) -> None:
    reply = small.client.post(small.url + "/mutate", content=b"{" + b" " * 8192 + b"}")
    assert reply.status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the stream itself is counted
        for _ in range(10):
            yield b" " * 1024

    reply = small.client.post(small.url + "/mutate", content=chunks())
    assert reply.status_code == 413


def test_healthz_and_methods(webhook: Running) -> None:
    assert webhook.client.get(webhook.url + "/healthz").json() == {"status": "ok"}
    assert webhook.client.get(webhook.url + "/mutate").status_code == 405
    assert webhook.client.post(webhook.url + "/nope").status_code == 404


def _served_cert(port: int, ca: trustme.CA) -> bytes:
    context = client_context(ca)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der


def test_certificate_rotation_is_picked_up(
    tmp_path: Path, ca: trustme.CA, catalog: Catalog
) -> None:
    first = ca.issue_cert("127.0.0.1")
    first.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    first.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    for running in serve(tmp_path, ca, Settings(), catalog, reload_seconds=0.05):
        port = running.server.port
        before = _served_cert(port, ca)
        second = ca.issue_cert("127.0.0.1")
        # a half-written pair (new cert, old key) is not loaded; the old pair keeps serving
        second.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
        time.sleep(0.3)
        assert _served_cert(port, ca) == before
        second.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
        deadline = time.monotonic() + 5
        while _served_cert(port, ca) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        after = _served_cert(port, ca)
        assert after != before
        assert after == ssl.PEM_cert_to_DER_cert(second.cert_chain_pems[0].bytes().decode())
        assert running.server.tls.reloads == 1


def test_tls_files_unchanged_content_is_not_reloaded(tls_dir: Path, tmp_path: Path) -> None:
    shutil.copy(tls_dir / "tls.crt", tmp_path / "c")
    shutil.copy(tls_dir / "tls.key", tmp_path / "k")
    files = TlsFiles(tmp_path / "c", tmp_path / "k")
    (tmp_path / "c").write_bytes((tmp_path / "c").read_bytes())  # touched, same content
    assert files.refresh() is False and files.reloads == 0


def test_listening_socket_disables_nagle(webhook: Running) -> None:
    # Accepted connections inherit TCP_NODELAY: the response body is not held back until the
    # client's delayed ACK of the response head.
    config = webhook.server.config.model_copy(update={"port": 0})
    sock = WebhookServer(Admission(Settings()), config).bind()
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        sock.close()
