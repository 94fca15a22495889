"""The adaptor CA (persisted, reused after restart, real mTLS handshakes) and pod VM user data."""

from __future__ import annotations

import asyncio
import json
import ssl
import stat
from pathlib import Path

import pytest
import yaml

from adaptor.planning.userdata import (
    APF_PATH,
    DEVICES_PATH,
    GpuSetup,
    PodVMConfig,
    build,
    check_size,
    counted_size,
    render,
)
from adaptor.proxy.dial import client_tls_context
from adaptor.proxy.pki import AdaptorPKI, IssuedPair
from providers.core.errors import InvalidRequest
from providers.core.mig import pack


def server_context(tmp: Path, pair: IssuedPair, client_ca: str) -> ssl.SSLContext:
    (tmp / "s.crt").write_text(pair.cert_pem)
    (tmp / "s.key").write_text(pair.key_pem)
    (tmp / "ca.crt").write_text(client_ca)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp / "s.crt", tmp / "s.key")
    context.load_verify_locations(tmp / "ca.crt")
    context.verify_mode = ssl.CERT_REQUIRED
    return context


async def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> bytes:
    """A forwarder stand-in on loopback echoing one line over mutual TLS."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(await reader.readline())
            await writer.drain()
        except (ssl.SSLError, ConnectionError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server)
    port = srv.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client), 5
        )
        writer.write(b"ping\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        return line
    finally:
        srv.close()
        await srv.wait_closed()


async def test_ca_is_persisted_and_reused_after_restart(tmp_path: Path) -> None:
    first = AdaptorPKI.load_or_create(tmp_path)
    pair = first.issue_server("a" * 64)
    key_mode = stat.S_IMODE((tmp_path / "pki" / "ca.key").stat().st_mode)
    assert key_mode == 0o600
    assert stat.S_IMODE(first.client_key_file.stat().st_mode) == 0o600
    client_cert = first.client_cert_file.read_bytes()

    restarted = AdaptorPKI.load_or_create(tmp_path)
    assert restarted.ca_pem == first.ca_pem
    assert restarted.client_cert_file.read_bytes() == client_cert
    # a VM created before the restart still accepts the restarted adaptor, and vice versa
    server = server_context(tmp_path, pair, restarted.ca_pem)
    client = client_tls_context(
        str(restarted.ca_file), str(restarted.client_cert_file), str(restarted.client_key_file)
    )
    assert await handshake(server, client) == b"ping\n"


async def test_foreign_client_and_foreign_server_are_refused(tmp_path: Path) -> None:
    ours = AdaptorPKI.load_or_create(tmp_path / "ours")
    theirs = AdaptorPKI.load_or_create(tmp_path / "theirs")
    assert ours.ca_pem != theirs.ca_pem
    server = server_context(tmp_path, ours.issue_server("b" * 64), ours.ca_pem)
    foreign_client = client_tls_context(
        str(ours.ca_file), str(theirs.client_cert_file), str(theirs.client_key_file)
    )
    try:
        line = await handshake(server, foreign_client)
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError):
        line = b""  # TLS 1.3 may report the refusal as a closed stream instead
    assert line == b""
    foreign_server = server_context(tmp_path, theirs.issue_server("c" * 64), ours.ca_pem)
    client = client_tls_context(
        str(ours.ca_file), str(ours.client_cert_file), str(ours.client_key_file)
    )
    with pytest.raises(ssl.SSLCertVerificationError):
        await handshake(foreign_server, client)


def test_mismatched_or_garbage_ca_files_are_clear_errors(tmp_path: Path) -> None:
    AdaptorPKI.load_or_create(tmp_path / "a")
    AdaptorPKI.load_or_create(tmp_path / "b")
    (tmp_path / "a" / "pki" / "ca.key").write_bytes(
        (tmp_path / "b" / "pki" / "ca.key").read_bytes()
    )
    with pytest.raises(InvalidRequest, match="does not match"):
        AdaptorPKI.load_or_create(tmp_path / "a")
    (tmp_path / "b" / "pki" / "ca.crt").write_text("not a certificate")
    with pytest.raises(InvalidRequest, match="unreadable CA"):
        AdaptorPKI.load_or_create(tmp_path / "b")


def test_user_data_carries_apf_json_and_mig_layout(tmp_path: Path) -> None:
    pki = AdaptorPKI.load_or_create(tmp_path)
    pair = pki.issue_server("d" * 64)
    layout = pack("a100-80gb", {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1})
    assert layout is not None
    config = PodVMConfig(
        pod_namespace="ml",
        pod_name="train",
        tls_server_cert=pair.cert_pem,
        tls_server_key=pair.key_pem,
        tls_client_ca=pki.ca_pem,
        gpu=GpuSetup.from_layout(layout),
    )
    text = build("aws", config)
    assert text.startswith("#cloud-config\n")
    files = {f["path"]: f for f in yaml.safe_load(text)["write_files"]}
    apf = json.loads(files[APF_PATH]["content"])
    # path and content alone: CAA's process-user-data refuses any other key (caa_userdata)
    assert set(files[APF_PATH]) == {"path", "content"}
    assert apf["pod-namespace"] == "ml" and apf["pod-name"] == "train"
    assert apf["tls-server-cert"] == pair.cert_pem and apf["tls-server-key"] == pair.key_pem
    assert apf["tls-client-ca"] == pki.ca_pem
    devices = json.loads(files[DEVICES_PATH]["content"])
    assert devices["gpu_model"] == "a100-80gb"
    assert sorted(s["profile"] for gpu in devices["mig"] for s in gpu) == [
        "1g.10gb",
        "2g.20gb",
        "3g.40gb",
    ]
    assert devices["cdi"] == {
        "generate": True,
        "kind": "nvidia.com/gpu",
        "spec": "/var/run/cdi/nvidia.yaml",
    }
    # a CPU-only VM without TLS carries only the forwarder's pod identity
    plain = yaml.safe_load(render(PodVMConfig(pod_namespace="ns", pod_name="p")))
    [only] = plain["write_files"]
    assert json.loads(only["content"]) == {
        "pod-name": "p",
        "pod-namespace": "ns",
        "pod-network": None,
    }


def test_each_clouds_size_limit() -> None:
    def sized(n: int) -> str:
        return "x" * n

    check_size("aws", sized(16 * 1024))
    with pytest.raises(InvalidRequest, match="EC2 user data limit of 16384"):
        check_size("aws", sized(16 * 1024 + 1))
    # Azure counts base64: 48 KiB raw is exactly 64 KiB encoded
    assert counted_size("azure", sized(48 * 1024)) == 64 * 1024
    check_size("azure", sized(48 * 1024))
    with pytest.raises(InvalidRequest, match="Azure user data"):
        check_size("azure", sized(48 * 1024 + 1))
    check_size("gcp", sized(256 * 1024))
    with pytest.raises(InvalidRequest, match="GCP metadata"):
        check_size("gcp", sized(256 * 1024 + 1))
    with pytest.raises(InvalidRequest, match="unknown cloud"):
        check_size("ibm", "")
