"""The Kubernetes client against a hostile API server and hostile kubeconfigs, on loopback: an
answer dripped a byte at a time (in the TLS handshake, the headers or the body) ends at the
call's timeout, not per read; an answer larger than the client reads, or compressed unasked, is
an error before it is in memory; a nested answer or kubeconfig is an error, not a traceback; TLS
verification is skipped only for a YAML `true` and never with a certificate authority; a
password in the server URL never appears in a message."""

from __future__ import annotations

import base64
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from providers.clouds.kube import (
    KubeApiError,
    KubeClient,
    KubeConfig,
    KubeConfigError,
    kubeconfig_config,
)
from tests.hostile_http import drip, finished, flood, hostile, reply

OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


def _client(url: str, **options: Any) -> KubeClient:
    return KubeClient(KubeConfig(server=url, source="test"), **options)


def _kubeconfig(path: Path, cluster: dict[str, Any]) -> Path:
    path.write_text(
        yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": cluster}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        })
    )  # fmt: skip
    return path


@pytest.mark.parametrize(
    "prefix",
    [
        pytest.param(OK_HEAD + b"Content-Length: 100000\r\n\r\n{", id="body"),
        pytest.param(b"HTTP/1.1 200 OK\r\nX-Drip: ", id="headers"),
    ],
)
def test_a_dripping_answer_ends_at_the_timeout(prefix: bytes) -> None:
    with hostile(drip(prefix, every=0.05)) as server:
        client = _client(server.url, timeout_seconds=1)
        failed = finished(lambda: client.get("/api/v1/nodes"))
        assert isinstance(failed, KubeApiError), failed
        assert "no answer within 1s" in str(failed)
        assert failed.status is None
        # the client hung up: the server's next byte finds no one
        conn = server.conns[0]
        finished(lambda: _until_gone(conn))


def test_a_dripping_tls_handshake_ends_at_the_timeout(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_data = base64.b64encode(ca.cert_pem.bytes()).decode()
    # a TLS record header announcing 16 KiB, then its bytes one at a time
    with hostile(drip(b"\x16\x03\x03\x40\x00", every=0.05), read_head=False) as server:
        url = f"https://127.0.0.1:{server.port}"
        path = _kubeconfig(
            tmp_path / "config", {"server": url, "certificate-authority-data": ca_data}
        )
        client = KubeClient(kubeconfig_config({"KUBECONFIG": str(path)}), timeout_seconds=1)
        failed = finished(lambda: client.get("/api/v1/nodes"))
    assert isinstance(failed, KubeApiError) and "no answer within 1s" in str(failed), failed


def _until_gone(conn: Any) -> None:
    while not conn.closed_by_peer:
        time.sleep(0.05)


@pytest.mark.parametrize("announce", [True, False], ids=["length-announced", "until-close"])
def test_an_answer_larger_than_the_bound_is_refused_unread(announce: bool) -> None:
    total = 300 << 20
    with hostile(flood(total, announce)) as server:
        client = _client(server.url, timeout_seconds=30)  # the default bound: 64 MiB
        failed = finished(lambda: client.get("/api/v1/nodes"))
        assert isinstance(failed, KubeApiError), failed
        assert "larger than the client reads" in str(failed)
        assert str(64 << 20) in str(failed)
        finished(lambda: _until_gone(server.conns[0]))
        assert server.sent() < 100 << 20  # the client stopped reading near its bound
    # a smaller bound is the client's to choose
    with hostile(flood(2 << 20, announce)) as server:
        failed = finished(lambda: _client(server.url, max_answer_bytes=1 << 20).get("/x"))
        assert isinstance(failed, KubeApiError) and "at most 1048576 bytes" in str(failed)


def test_a_compressed_answer_is_refused() -> None:
    gzip_bomb_head = {"Content-Encoding": "gzip"}
    with (
        hostile(reply("200 OK", b"\x1f\x8b" + b"\0" * 64, gzip_bomb_head)) as server,
        pytest.raises(KubeApiError, match="compressed \\(gzip\\), which was not asked"),
    ):
        _client(server.url).get("/x")


def test_a_deeply_nested_answer_is_not_json_not_a_crash() -> None:
    nested = b"[" * 200_000 + b"]" * 200_000
    with (
        hostile(reply("200 OK", nested)) as server,
        pytest.raises(KubeApiError, match="the answer is not JSON"),
    ):
        _client(server.url).get("/x")


def test_a_kubeconfig_nested_50000_deep_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("clusters: " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(KubeConfigError, match="nested too deeply"):
        kubeconfig_config({"KUBECONFIG": str(path)})
    path.write_bytes(b"a: " + b"x" * (5 << 20))
    with pytest.raises(KubeConfigError, match="larger than"):
        kubeconfig_config({"KUBECONFIG": str(path)})


def test_a_malformed_kubeconfig_is_never_quoted(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("users:\n- name: u\n  user: {token: s3cret-token: [\n")
    with pytest.raises(KubeConfigError) as refused:
        kubeconfig_config({"KUBECONFIG": str(path)})
    assert "s3cret" not in str(refused.value) and "line" in str(refused.value)


@pytest.mark.parametrize("value", ["false", "true", "False", 0, 1, "no"])
def test_insecure_skip_tls_verify_must_be_a_yaml_boolean(tmp_path: Path, value: object) -> None:
    path = _kubeconfig(
        tmp_path / "config", {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": value}
    )
    with pytest.raises(KubeConfigError, match="must be true or false \\(a YAML boolean"):
        kubeconfig_config({"KUBECONFIG": str(path)})


def test_insecure_false_verifies_and_true_with_an_authority_is_refused(tmp_path: Path) -> None:
    ca_data = base64.b64encode(trustme.CA().cert_pem.bytes()).decode()
    cluster = {"server": "https://127.0.0.1:1", "certificate-authority-data": ca_data}
    verified = kubeconfig_config(
        {
            "KUBECONFIG": str(
                _kubeconfig(tmp_path / "a", {**cluster, "insecure-skip-tls-verify": False})
            )
        }
    )
    assert verified.insecure is False and verified.ssl_context is not None
    assert verified.ssl_context.check_hostname is True
    for authority in ({"certificate-authority-data": ca_data}, {"certificate-authority": "ca.pem"}):
        both = {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True, **authority}
        path = _kubeconfig(tmp_path / "b", both)
        with pytest.raises(
            KubeConfigError,
            match="specifying a root certificates file with the insecure flag is not allowed",
        ):
            kubeconfig_config({"KUBECONFIG": str(path)})


@pytest.mark.parametrize(
    "server",
    ["https://admin:s3cret@127.0.0.1:6443", "ftp://admin:s3cret@127.0.0.1", "https://:s3cret@h"],
)
def test_a_password_in_the_server_url_is_never_shown(tmp_path: Path, server: str) -> None:
    path = _kubeconfig(tmp_path / "config", {"server": server})
    with pytest.raises(KubeConfigError) as refused:
        kubeconfig_config({"KUBECONFIG": str(path)})
    assert "s3cret" not in str(refused.value) and "***@" in str(refused.value)


def test_a_password_in_a_given_server_url_stays_out_of_call_errors() -> None:
    with socket.socket() as bound:  # bound, never listening: the call is refused
        bound.bind(("127.0.0.1", 0))
        client = _client(f"http://admin:s3cret@127.0.0.1:{bound.getsockname()[1]}")
        with pytest.raises(KubeApiError) as failed:
            client.get("/x")
    assert "s3cret" not in str(failed.value) and "***@127.0.0.1" in str(failed.value)


def test_the_client_serves_on_after_a_call_cut_off() -> None:
    calls = []

    def answer(conn: Any, head: Any) -> None:
        calls.append(head.path)
        if head.path == "/drip":
            drip(OK_HEAD + b"Content-Length: 1000\r\n\r\n{")(conn, head)
        else:
            reply("200 OK", b'{"kind": "Node"}')(conn, head)

    with hostile(answer) as server:
        client = _client(server.url, timeout_seconds=1)
        assert client.get("/a") == {"kind": "Node"}
        failed = finished(lambda: client.get("/drip"))
        assert isinstance(failed, KubeApiError) and "no answer within 1s" in str(failed)
        for _ in range(3):  # a fresh connection; no expired deadline touches it
            assert client.get("/b", timeout_seconds=5) == {"kind": "Node"}
    assert calls == ["/a", "/drip", "/b", "/b", "/b"]
