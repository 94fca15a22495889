"""The webhook server against clients that hold resources, as a tenant on the network would:
half-sent headers, half-sent bodies, many idle connections, reviews aimed at another namespace."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from providers.core.catalog import Catalog
from tests.webhook.conftest import Running, client_context, container, pod, post, review, serve
from webhook import MemoryResolver, Settings

TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "secret-gpus", "namespace": "victim"},
    "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com",
        "selectors": [{"cel": {"expression": "device.attributes['x'].secret == 'hunter2'"}}],
    }}]}}},
}  # fmt: skip


@pytest.fixture(scope="module")
def bounded(tls_dir: Path, ca: trustme.CA, catalog: Catalog) -> Iterator[Running]:
    yield from serve(
        tls_dir,
        ca,
        Settings(),
        catalog,
        MemoryResolver([TEMPLATE]),
        max_connections=4,
        header_timeout_seconds=2.0,
        body_timeout_seconds=0.5,
    )


def _tls(running: Running, ca: trustme.CA) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", running.server.port), timeout=10)
    return client_context(ca).wrap_socket(raw, server_hostname="127.0.0.1")


def _closed(sock: ssl.SSLSocket, within: float = 10.0) -> bool:
    """True when the server closes the connection (EOF or reset) within `within` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_half_sent_headers_are_dropped(bounded: Running, ca: trustme.CA) -> None:
    with _tls(bounded, ca) as sock:
        sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")  # ... and nothing more
        assert _closed(sock)
    # and a connection that never sends anything
    with _tls(bounded, ca) as sock:
        assert _closed(sock)
    # nor even starts TLS: the handshake has the same deadline
    with socket.create_connection(("127.0.0.1", bounded.server.port), timeout=10) as raw:
        raw.settimeout(10)
        with contextlib.suppress(ConnectionResetError):  # a reset is a close too
            assert raw.recv(1024) == b""


def test_half_sent_body_is_408(bounded: Running, ca: trustme.CA) -> None:
    with _tls(bounded, ca) as sock:
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"apiVersion"'
        )
        sock.settimeout(10)
        head = sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 408"), head


def test_connections_beyond_the_limit_are_closed(bounded: Running, ca: trustme.CA) -> None:
    held = [_tls(bounded, ca) for _ in range(4)]
    try:
        for sock in held:  # one request each: the server has surely counted them all
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        # their header deadline (2s) has not passed; one more connection is closed at once,
        # before its TLS handshake
        try:
            extra = _tls(bounded, ca)
        except (ssl.SSLError, ConnectionError):
            pass
        else:
            with extra:
                assert _closed(extra, within=1.0)
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while True:  # the server sees the closes asynchronously
        try:
            reply = bounded.client.get(bounded.url + "/healthz")
            if reply.status_code == 200:
                break
        except Exception:
            pass
        assert time.monotonic() < deadline, "server did not recover after the connections closed"
        time.sleep(0.1)


def _claim_pod(namespace: str) -> dict:  # type: ignore[type-arg]
    main = container("main")
    main["resources"] = {"claims": [{"name": "c"}]}
    p = pod(main, resourceClaims=[{"name": "c", "resourceClaimTemplateName": "secret-gpus"}])
    p["metadata"]["namespace"] = namespace
    return p


def test_claims_are_read_in_the_reviews_own_namespace_only(bounded: Running) -> None:
    # a review from "tenant" naming a template that exists only in "victim": not found, and
    # nothing of the victim's selector comes back
    answer = post(bounded, review(_claim_pod("tenant"), namespace="tenant"))
    assert answer["allowed"] is False and "not found" in answer["status"]["message"]
    assert "hunter2" not in str(answer)
    # an object claiming another namespace than its review: refused before any lookup
    answer = post(bounded, review(_claim_pod("victim"), namespace="tenant"))
    assert answer["allowed"] is False and answer["status"]["code"] == 400
    assert "hunter2" not in str(answer)
    # a review with no namespace never falls back to the object's
    answer = post(bounded, review(_claim_pod("victim"), namespace=""))
    assert answer["allowed"] is False and answer["status"]["code"] == 400
    assert "must name its namespace" in answer["status"]["message"]
