"""The Kubernetes API client finds its cluster as kubectl does and proves who it is: in a pod,
the service account (a rotated token is sent from the next call on, the cluster CA is the only
one trusted); else the kubeconfig's current context, with a token, a token file, a client
certificate (data or files), the CA as data or a file relative to the kubeconfig, a TLS server
name, or verification skipped. A configuration it cannot use is an error that says why. Checked
against an API server over TLS on loopback that echoes who called it."""

from __future__ import annotations

import base64
import json
import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from urllib3.exceptions import InsecureRequestWarning

from providers.clouds.kube import (
    KubeApiError,
    KubeClient,
    KubeConfigError,
    in_cluster_config,
    kubeconfig_config,
    load_config,
)
from tests.fake_apiserver import JsonHandler, LoopbackServer


@dataclass
class Seen:
    method: str
    path: str
    authorization: str
    client: str  # the client certificate's common name, "" without one
    body: Any


class TlsApiServer(LoopbackServer):
    """Answers every call with 200 and the node it names, or 404 for /missing; records callers.
    A client certificate is asked for, not required (the calls without one are seen too)."""

    def __init__(self, ca: trustme.CA, *names: str) -> None:
        self.seen: list[Seen] = []
        server = self

        class Handler(JsonHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length)) if length else None
                peer = self.connection.getpeercert() or {}
                subject = dict(pair[0] for pair in peer.get("subject", ()))
                server.seen.append(
                    Seen(
                        self.command, self.path, self.headers.get("Authorization", ""),
                        subject.get("commonName", ""), body,
                    )
                )  # fmt: skip
                if self.path == "/missing":
                    self._send(404, {"kind": "Status", "reason": "NotFound", "message": "gone"})
                else:
                    self._send(200, {"kind": "Node", "metadata": {"name": self.path}})

            do_GET = do_PATCH = _answer

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(*(names or ("127.0.0.1",))).configure_cert(context)
        ca.configure_trust(context)
        context.verify_mode = ssl.CERT_OPTIONAL
        super().__init__(Handler, context)
        self.start()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def api(ca: trustme.CA) -> Iterator[TlsApiServer]:
    server = TlsApiServer(ca)
    yield server
    server.close()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any], **extra: Any) -> Path:
    path.write_text(
        yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": cluster}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            **extra,
        })
    )  # fmt: skip
    return path


def _service_account(directory: Path, ca: trustme.CA, token: str) -> Path:
    directory.mkdir(exist_ok=True)
    (directory / "ca.crt").write_bytes(ca.cert_pem.bytes())
    _rotate(directory, token)
    return directory


def _rotate(directory: Path, token: str) -> None:
    """As the kubelet does: the new token written aside, then renamed over the old one."""
    fresh = directory / ".token.new"
    fresh.write_text(token)
    os.replace(fresh, directory / "token")


def test_in_cluster_sends_the_rotated_token_from_the_next_call(
    tmp_path: Path, ca: trustme.CA, api: TlsApiServer
) -> None:
    account = _service_account(tmp_path / "sa", ca, "first\n")
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port)}
    config = in_cluster_config(env, account)
    assert (config.server, config.source) == (api.url, "in-cluster")
    client = KubeClient(config)
    assert client.get("/api/v1/nodes/a")["metadata"]["name"] == "/api/v1/nodes/a"
    client.get("/api/v1/nodes/a")
    _rotate(account, "second")
    client.get("/api/v1/nodes/a")
    assert [s.authorization for s in api.seen] == ["Bearer first", "Bearer first", "Bearer second"]
    # load_config prefers the pod's service account over any kubeconfig
    assert load_config({**env, "KUBECONFIG": "/nonexistent"}, account).source == "in-cluster"


def test_in_cluster_trusts_the_cluster_ca_only(tmp_path: Path, api: TlsApiServer) -> None:
    account = _service_account(tmp_path / "sa", trustme.CA(), "t")
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port)}
    with pytest.raises(KubeApiError, match="CERTIFICATE_VERIFY_FAILED") as failed:
        KubeClient(in_cluster_config(env, account)).get("/api/v1/nodes/a")
    assert failed.value.status is None
    assert api.seen == []


def test_in_cluster_needs_its_environment_and_files(tmp_path: Path, ca: trustme.CA) -> None:
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster_config({}, tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeConfigError, match=r"no service-account file .*token"):
        in_cluster_config(env, tmp_path)
    _service_account(tmp_path, ca, "t")
    ipv6 = in_cluster_config({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, tmp_path)
    assert ipv6.server == "https://[fd00::1]:443"


def test_kubeconfig_token_and_ca_data(tmp_path: Path, ca: trustme.CA, api: TlsApiServer) -> None:
    path = _kubeconfig(
        tmp_path / "config",
        {"server": api.url, "certificate-authority-data": _b64(ca.cert_pem.bytes())},
        {"token": "abc"},
    )
    config = load_config({"KUBECONFIG": str(path)}, tmp_path / "no-service-account")
    assert config.source == f"kubeconfig {path}, context c"
    answer = KubeClient(config).patch("/api/v1/nodes/n/status", [{"op": "add"}])
    assert answer["kind"] == "Node"
    (seen,) = api.seen
    assert (seen.method, seen.authorization, seen.body) == ("PATCH", "Bearer abc", [{"op": "add"}])


def test_kubeconfig_client_certificate_as_data_or_files(
    tmp_path: Path, ca: trustme.CA, api: TlsApiServer
) -> None:
    leaf = ca.issue_cert("worker-1.example", common_name="system:node:worker-1")
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.pem").write_bytes(ca.cert_pem.bytes())
    (tmp_path / "pki" / "user.crt").write_bytes(leaf.cert_chain_pems[0].bytes())
    (tmp_path / "pki" / "user.key").write_bytes(leaf.private_key_pem.bytes())
    as_data = {
        "client-certificate-data": _b64(leaf.cert_chain_pems[0].bytes()),
        "client-key-data": _b64(leaf.private_key_pem.bytes()),
    }
    # file paths relative to the kubeconfig's own directory, as kubectl reads them
    as_files = {"client-certificate": "pki/user.crt", "client-key": "pki/user.key"}
    for user in (as_data, as_files):
        cluster = {"server": api.url, "certificate-authority": "pki/ca.pem"}
        path = _kubeconfig(tmp_path / "config", cluster, user)
        KubeClient(kubeconfig_config({"KUBECONFIG": str(path)})).get("/api/v1/nodes/n")
    assert [(s.client, s.authorization) for s in api.seen] == [("system:node:worker-1", "")] * 2


def test_kubeconfig_token_file_is_read_again_when_it_changes(
    tmp_path: Path, ca: trustme.CA, api: TlsApiServer
) -> None:
    _rotate(tmp_path, "one")
    cluster = {"server": api.url, "certificate-authority-data": _b64(ca.cert_pem.bytes())}
    path = _kubeconfig(tmp_path / "config", cluster, {"tokenFile": "token"})
    client = KubeClient(kubeconfig_config({"KUBECONFIG": str(path)}))
    client.get("/a")
    _rotate(tmp_path, "two")
    client.get("/a")
    assert [s.authorization for s in api.seen] == ["Bearer one", "Bearer two"]


def test_kubeconfig_tls_server_name_and_skipping_verification(
    tmp_path: Path, ca: trustme.CA
) -> None:
    server = TlsApiServer(ca, "kube.internal")  # a name that is not the address dialled
    try:
        ca_data = _b64(ca.cert_pem.bytes())
        plain = {"server": server.url, "certificate-authority-data": ca_data}
        path = _kubeconfig(tmp_path / "config", plain, {})
        with pytest.raises(KubeApiError, match=r"127\.0\.0\.1"):
            KubeClient(kubeconfig_config({"KUBECONFIG": str(path)})).get("/a")
        named = {**plain, "tls-server-name": "kube.internal"}
        path = _kubeconfig(tmp_path / "config", named, {})
        KubeClient(kubeconfig_config({"KUBECONFIG": str(path)})).get("/a")
        # an authority that never signed the server's certificate: refused unless skipped
        path = _kubeconfig(tmp_path / "config", {"server": server.url}, {})
        with pytest.raises(KubeApiError, match="CERTIFICATE_VERIFY_FAILED"):
            KubeClient(kubeconfig_config({"KUBECONFIG": str(path)})).get("/a")
        skipping = {"server": server.url, "insecure-skip-tls-verify": True}
        path = _kubeconfig(tmp_path / "config", skipping, {})
        with pytest.warns(InsecureRequestWarning):  # the operator is told, as by any client
            KubeClient(kubeconfig_config({"KUBECONFIG": str(path)})).get("/b")
        assert [s.path for s in server.seen] == ["/a", "/b"]
    finally:
        server.close()


def test_kubeconfig_list_merges_first_wins(
    tmp_path: Path, ca: trustme.CA, api: TlsApiServer
) -> None:
    ca_data = _b64(ca.cert_pem.bytes())
    first = tmp_path / "first"
    first.write_text(yaml.safe_dump({
        "current-context": "other",
        "users": [{"name": "u", "user": {"token": "from-first"}}],
    }))  # fmt: skip
    second = _kubeconfig(
        tmp_path / "second",
        {"server": api.url, "certificate-authority-data": ca_data},
        {"token": "from-second"},
        **{"current-context": "c"},
    )
    other = {"name": "other", "context": {"cluster": "k", "user": "u"}}
    data = yaml.safe_load(second.read_text())
    data["contexts"].append(other)
    second.write_text(yaml.safe_dump(data))
    listed = os.pathsep.join([str(tmp_path / "missing"), str(first), str(second)])
    config = kubeconfig_config({"KUBECONFIG": listed})
    assert config.source.endswith("context other")
    KubeClient(config).get("/a")
    assert api.seen[0].authorization == "Bearer from-first"


def test_api_errors_carry_the_status_and_the_servers_reason(
    tmp_path: Path, ca: trustme.CA, api: TlsApiServer
) -> None:
    cluster = {"server": api.url, "certificate-authority-data": _b64(ca.cert_pem.bytes())}
    client = KubeClient(
        kubeconfig_config({"KUBECONFIG": str(_kubeconfig(tmp_path / "c", cluster, {}))})
    )
    with pytest.raises(KubeApiError, match="HTTP 404 NotFound: gone") as failed:
        client.get("/missing")
    assert failed.value.status == 404
    api.close()
    with pytest.raises(KubeApiError) as unreachable:
        client.get("/a", timeout_seconds=2)
    assert unreachable.value.status is None


@pytest.mark.parametrize(
    ("cluster", "user", "message"),
    [
        ({"server": "https://x"}, {"exec": {"command": "aws"}}, "exec is not supported"),
        ({"server": "https://x"}, {"auth-provider": {"name": "gcp"}}, "auth-provider is not"),
        ({"server": "x:6443"}, {}, "is not an http\\(s\\) URL"),
        ({"server": "https://x", "certificate-authority-data": "!!"}, {}, "is not base64"),
        ({"server": "https://x", "certificate-authority-data": _b64(b"junk")}, {}, "authority"),
        ({"server": "https://x", "certificate-authority": "nope.pem"}, {}, "authority"),
        ({"server": "https://x"}, {"client-certificate-data": _b64(b"x")}, "both its certif"),
        ({"server": "https://x"}, {"client-certificate": "a", "client-key": "b"}, "not usable"),
    ],
)
def test_unusable_kubeconfigs_say_why(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], message: str
) -> None:
    path = _kubeconfig(tmp_path / "config", cluster, user)
    with pytest.raises(KubeConfigError, match=message):
        kubeconfig_config({"KUBECONFIG": str(path)})


def test_missing_or_incomplete_kubeconfigs_say_why(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="no kubeconfig file at KUBECONFIG"):
        kubeconfig_config({"KUBECONFIG": str(tmp_path / "none")})
    with pytest.raises(KubeConfigError, match="KUBECONFIG is not set and there is no"):
        kubeconfig_config({"HOME": str(tmp_path)})
    path = _kubeconfig(tmp_path / "config", {"server": "https://x"}, {})
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "current-context": "elsewhere"}))
    with pytest.raises(KubeConfigError, match="has no context named 'elsewhere'"):
        kubeconfig_config({"KUBECONFIG": str(path)})
    path.write_text(yaml.safe_dump({**data, "current-context": ""}))
    with pytest.raises(KubeConfigError, match="sets no current-context"):
        kubeconfig_config({"KUBECONFIG": str(path)})
    # neither in a cluster nor configured: both reasons given
    with pytest.raises(KubeConfigError, match=r"no kubeconfig file.*not in a cluster"):
        load_config({"KUBECONFIG": str(tmp_path / "none")}, tmp_path)
