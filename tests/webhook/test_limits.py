"""The webhook server against clients that hold resources, as a tenant on the network would:
half-sent headers, half-sent bodies, many idle connections, reviews aimed at another namespace."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
import yaml

from providers.core.catalog import Catalog
from tests.webhook.conftest import Running, client_context, container, pod, post, review, serve
from tests.webhook.test_dra import CLASSES
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


FLOODER = "127.0.0.2"  # another loopback address: one source that holds connections


def _half_sent(running: Running, ca: trustme.CA, source: str) -> ssl.SSLSocket | None:
    """A connection from `source` with half-sent headers, or None when the server refused it."""
    try:
        raw = socket.create_connection(
            ("127.0.0.1", running.server.port), timeout=5, source_address=(source, 0)
        )
        sock = client_context(ca).wrap_socket(raw, server_hostname="127.0.0.1")
        sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
    except (OSError, ssl.SSLError):
        return None
    return sock


def _per_source_limits(
    tls_dir: Path, ca: trustme.CA, catalog: Catalog, header_timeout_seconds: float
) -> Iterator[Running]:
    """A server of 8 connections, 3 per address, 2 kept for the API server (127.0.0.3)."""
    yield from serve(
        tls_dir,
        ca,
        Settings(),
        catalog,
        max_connections=8,
        max_connections_per_source=3,
        reserved_connections=2,
        api_server_networks=(ipaddress.ip_network("127.0.0.3/32"),),
        header_timeout_seconds=header_timeout_seconds,
    )


@pytest.fixture(scope="module")
def per_source(tls_dir: Path, ca: trustme.CA, catalog: Catalog) -> Iterator[Running]:
    yield from _per_source_limits(tls_dir, ca, catalog, header_timeout_seconds=1.0)


def test_one_address_cannot_take_the_connection_cap(per_source: Running, ca: trustme.CA) -> None:
    """One address re-opens half-sent requests as fast as they are dropped (the header deadline
    is 1 s); health checks and admissions from elsewhere are all answered meanwhile."""
    stop = threading.Event()
    opened: list[ssl.SSLSocket] = []

    def flood() -> None:
        while not stop.is_set():
            sock = _half_sent(per_source, ca, FLOODER)
            if sock is not None:
                opened.append(sock)
            time.sleep(0.01)

    flooder = threading.Thread(target=flood)
    flooder.start()
    answered = 0
    try:
        time.sleep(0.5)
        with httpx.Client(verify=client_context(ca), timeout=5) as client:
            for _ in range(20):
                assert client.get(per_source.url + "/healthz").status_code == 200
                ordinary = pod(container("web", limits={"cpu": "1"}), runtime=None)
                assert post(per_source, review(ordinary))["allowed"] is True
                answered += 1
                time.sleep(0.1)
    finally:
        stop.set()
        flooder.join(10)
        for sock in opened:
            sock.close()
    assert answered == 20
    connections = per_source.server.connections
    assert connections is not None and connections.refused > 0


@pytest.fixture
def reserve(tls_dir: Path, ca: trustme.CA, catalog: Catalog) -> Iterator[Running]:
    """As `per_source`, with a header deadline no slow handshake here outlasts."""
    yield from _per_source_limits(tls_dir, ca, catalog, header_timeout_seconds=60.0)


def test_a_reserve_is_kept_for_the_api_server(reserve: Running, ca: trustme.CA) -> None:
    """Other addresses together get max_connections - reserved (6 of 8), each 3 at most; the
    API server's network (127.0.0.3 here) still connects when they have taken all of theirs."""
    connections = reserve.server.connections
    assert connections is not None
    held: list[ssl.SSLSocket] = []
    try:
        for source in ("127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7"):
            for _ in range(4):
                sock = _half_sent(reserve, ca, source)
                if sock is None:
                    break
                held.append(sock)
        # every other address together stopped at 6
        assert connections.untrusted == 6, connections.per_source
        assert max(connections.per_source.values()) <= 3, connections.per_source
        transport = httpx.HTTPTransport(verify=client_context(ca), local_address="127.0.0.3")
        with httpx.Client(transport=transport, timeout=5) as api_server:
            assert api_server.get(reserve.url + "/healthz").status_code == 200
    finally:
        for sock in held:
            sock.close()


@pytest.fixture(scope="module")
def client_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def mutual(
    tls_dir: Path, ca: trustme.CA, catalog: Catalog, client_ca: trustme.CA, tmp_path_factory: Any
) -> Iterator[Running]:
    ca_file = tmp_path_factory.mktemp("client-ca") / "ca.crt"
    client_ca.cert_pem.write_to_path(str(ca_file))
    yield from serve(tls_dir, ca, Settings(), catalog, client_ca_file=ca_file)


def test_mutate_requires_the_api_servers_client_certificate(
    mutual: Running, ca: trustme.CA, client_ca: trustme.CA
) -> None:
    body = review(pod(container("web", limits={"cpu": "1"}), runtime=None))
    # no certificate: /healthz answers (kubelet's probes present none), /mutate does not
    assert mutual.client.get(mutual.url + "/healthz").status_code == 200
    reply = mutual.client.post(mutual.url + "/mutate", json=body)
    assert reply.status_code == 403 and "client certificate" in reply.text
    # the API server's certificate (from the client CA, as its AdmissionConfiguration has it)
    context = client_context(ca)
    client_ca.issue_cert("kube-apiserver").configure_cert(context)
    with httpx.Client(verify=context, timeout=10) as api_server:
        reply = api_server.post(mutual.url + "/mutate", json=body)
        assert reply.status_code == 200 and reply.json()["response"]["allowed"] is True
    # a certificate from any other CA fails the handshake
    other = client_context(ca)
    trustme.CA().issue_cert("kube-apiserver").configure_cert(other)
    with httpx.Client(verify=other, timeout=10) as stranger, pytest.raises(httpx.HTTPError):
        stranger.post(mutual.url + "/mutate", json=body)


# What another namespace's objects hold must never come back to whoever sent the review: a
# client that reaches /mutate may name any namespace.
SECRET = "hunter2"
_LEAKY = {
    "runtime-error": {"deviceClassName": "gpu.nvidia.com", "selectors": [
        {"cel": {"expression": f"device.attributes['{SECRET}'].x == '{SECRET}'"}}]},
    "syntax-error": {"deviceClassName": "gpu.nvidia.com", "selectors": [
        {"cel": {"expression": f"device.driver == '{SECRET}' &&"}}]},
    "bad-semver": {"deviceClassName": "gpu.nvidia.com", "selectors": [
        {"cel": {"expression": f"semver('{SECRET}').major() > 1"}}]},
    "bad-class": {"deviceClassName": f"{SECRET} class"},
    "bad-count": {"deviceClassName": "gpu.nvidia.com", "count": SECRET},
    "bad-mode": {"deviceClassName": "gpu.nvidia.com", "allocationMode": SECRET},
    "bad-capacity": {"deviceClassName": "gpu.nvidia.com",
                     "capacity": {"requests": {SECRET: "1", "memory": SECRET}}},
}  # fmt: skip


def _leaky_template(name: str, request: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "victim"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
    }


@pytest.fixture(scope="module")
def leaky(tls_dir: Path, ca: trustme.CA, catalog: Catalog) -> Iterator[Running]:
    objects = [*yaml.safe_load_all(CLASSES), TEMPLATE]
    objects += [_leaky_template(name, request) for name, request in _LEAKY.items()]
    objects.append({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "bad-constraint", "namespace": "victim"},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
            "constraints": [{"matchAttribute": f"gpu.nvidia.com/{SECRET}",
                             "requests": [f"{SECRET}"]}],
        }}},
    })  # fmt: skip
    yield from serve(tls_dir, ca, Settings(), catalog, MemoryResolver(objects))


@pytest.mark.parametrize("template_name", ["secret-gpus", "bad-constraint", *sorted(_LEAKY)])
def test_denials_never_quote_another_objects_content(leaky: Running, template_name: str) -> None:
    main = container("main")
    main["resources"] = {"claims": [{"name": "c"}]}
    p = pod(main, resourceClaims=[{"name": "c", "resourceClaimTemplateName": template_name}])
    p["metadata"]["namespace"] = "victim"
    answer = post(leaky, review(p, namespace="victim"))  # the review names the victim's namespace
    assert answer["allowed"] is False, answer
    assert SECRET not in json.dumps(answer), answer
    # and still says where the problem is
    assert "claim c" in answer["status"]["message"], answer
