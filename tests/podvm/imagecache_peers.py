"""Real peers for the image cache's tests: Debian's distribution registry (`docker-registry`),
skopeo, an OCI image layout written by hand, a token service, and `peerpods podvm image-mirror`
as its own process.

Every process is started on a free loopback port and stopped (and waited for) by its fixture.
Outside CI the tests skip when the registry or skopeo is missing; under CI=true that is a failure
(tests/run installs both).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs, urlsplit

import pytest
import urllib3

from tests.fake_apiserver import LoopbackServer

ROOT = Path(__file__).resolve().parents[2]
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def need(*tools: str) -> None:
    """Skip (fail under CI) when a peer binary is missing."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        reason = f"needs {', '.join(missing)} (Debian packages; tests/run installs them)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def wait_http(
    url: str,
    process: subprocess.Popen[bytes] | None,
    log: IO[bytes] | None = None,
    seconds: float = 20,
) -> None:
    """Until `url` answers at all (any status), or fail with the process's output."""
    deadline = time.monotonic() + seconds
    http = urllib3.PoolManager(retries=False, timeout=1.0)
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            out = b""
            if log is not None:
                log.seek(0)
                out = log.read()
            text = out.decode(errors="replace")[-2000:]
            raise AssertionError(f"{process.args!r} exited {process.returncode}: {text}")
        with contextlib.suppress(urllib3.exceptions.HTTPError):
            http.request("GET", url).release_conn()
            return
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {seconds}s")


def stop(process: subprocess.Popen[bytes], log: IO[bytes] | None = None) -> None:
    """Terminate (then kill) and reap the process; close its log."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    if log is not None:
        log.close()


# An OCI image layout, written by hand


@dataclass
class Layout:
    """An image layout on disk: an index of two platforms under `tag`, and what is in it."""

    path: Path
    tag: str
    index_digest: str
    manifests: dict[str, str] = field(default_factory=dict)  # platform -> manifest digest
    layers: dict[str, list[str]] = field(default_factory=dict)  # platform -> layer digests
    configs: dict[str, str] = field(default_factory=dict)  # platform -> config digest

    def blob(self, digest: str) -> bytes:
        return (self.path / "blobs" / "sha256" / digest[7:]).read_bytes()


def _tar(files: Mapping[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(content), 0, 0o644
            tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def write_layout(path: Path, tag: str = "v1", layer_bytes: int = 300_000) -> Layout:
    """Two platforms (linux/amd64, linux/arm64), each a config and two gzipped layers: one of
    incompressible bytes, one small."""
    blobs = path / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        digest = sha256(data)
        (blobs / digest[7:]).write_bytes(data)
        return digest

    layout = Layout(path, tag, "")
    entries = []
    for arch in ("amd64", "arm64"):
        tars = [
            _tar({f"data-{arch}.bin": os.urandom(layer_bytes)}),
            _tar({"etc/hello": f"hello from {arch}\n".encode()}),
        ]
        layers = [gzip.compress(t, mtime=0) for t in tars]
        config = json.dumps(
            {
                "architecture": arch,
                "os": "linux",
                "config": {"Cmd": ["/bin/true"]},
                "rootfs": {"type": "layers", "diff_ids": [sha256(t) for t in tars]},
            }
        ).encode()
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, "digest": put(config), "size": len(config)},
                "layers": [
                    {"mediaType": OCI_LAYER, "digest": put(layer), "size": len(layer)}
                    for layer in layers
                ],
            }
        ).encode()
        platform = f"linux/{arch}"
        layout.manifests[platform] = put(manifest)
        layout.layers[platform] = [sha256(layer) for layer in layers]
        layout.configs[platform] = sha256(config)
        entries.append(
            {
                "mediaType": OCI_MANIFEST,
                "digest": layout.manifests[platform],
                "size": len(manifest),
                "platform": {"architecture": arch, "os": "linux"},
            }
        )
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
    layout.index_digest = put(index)
    top = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": OCI_INDEX,
                "digest": layout.index_digest,
                "size": len(index),
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    (path / "index.json").write_text(json.dumps(top))
    (path / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    return layout


# skopeo


def skopeo(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """skopeo with no host configuration: an empty registries.conf, no auth file, any policy."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "registries.conf").write_text("")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_RUNTIME_DIR": str(home),
        "CONTAINERS_REGISTRIES_CONF": str(home / "registries.conf"),
        "REGISTRY_AUTH_FILE": str(home / "auth.json"),
        "TMPDIR": str(home),
    }
    command = ["skopeo", "--insecure-policy", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


# the distribution registry


@dataclass
class Registry:
    """A docker-registry process on loopback."""

    port: int
    process: subprocess.Popen[bytes]
    log: IO[bytes]

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"


def start_registry(base: Path, auth: Mapping[str, Any] | None = None) -> Registry:
    base.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "error", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(base / "data")}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "test-secret"},
    }
    if auth:
        config["auth"] = dict(auth)
    (base / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    log = (base / "registry.log").open("w+b")  # a file, not a pipe nobody drains
    process = subprocess.Popen(
        ["docker-registry", "serve", str(base / "config.yml")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(base)},
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/", process, log)
    except BaseException:
        stop(process, log)
        raise
    return Registry(port, process, log)


@contextlib.contextmanager
def registry(base: Path, auth: Mapping[str, Any] | None = None) -> Iterator[Registry]:
    running = start_registry(base, auth)
    try:
        yield running
    finally:
        stop(running.process, running.log)


@dataclass
class Pushed:
    """An image layout pushed by skopeo to a registry."""

    layout: Layout
    image: str  # registry/repo:tag as pull-images reads it
    registry: Registry


def push(tmp: Path, reg: Registry, repo: str = "team/app", *creds: str) -> Pushed:
    """A layout of two platforms (`write_layout`) copied whole (`--all`) to `reg`."""
    layout = write_layout(tmp / f"layout-{repo.replace('/', '-')}")
    copied = skopeo(
        tmp / "home",
        "copy",
        "--all",
        "--dest-tls-verify=false",
        *creds,
        f"oci:{layout.path}:{layout.tag}",
        f"docker://{reg.host}/{repo}:{layout.tag}",
    )
    assert copied.returncode == 0, copied.stderr
    return Pushed(layout, f"{reg.host}/{repo}:{layout.tag}", reg)


# the mirror, as `peerpods podvm image-mirror` runs it


@contextlib.contextmanager
def mirror_process(store: Path, *extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`peerpods podvm image-mirror` on a free loopback port: its host:port and process."""
    address = f"127.0.0.1:{free_port()}"
    with tempfile.TemporaryFile() as log:  # a file, not a pipe nobody drains
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "adaptor.cli.main", "podvm", "image-mirror"),
                *("--store", str(store), "--listen", address, *extra),
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_http(f"http://{address}/v2/", process, log)
            yield address, process
        finally:
            stop(process)


@contextlib.contextmanager
def mirror(store: Path, *extra: str) -> Iterator[str]:
    """`peerpods podvm image-mirror` on a free loopback port; its host:port."""
    with mirror_process(store, *extra) as (address, _):
        yield address


# a token service (the registry's `auth: token`), JWTs signed ES256 with an x5c chain


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenService(LoopbackServer):
    """Issues registry tokens: pull to anyone, push only with the right Basic credentials."""

    def __init__(self, base: Path, users: Mapping[str, str], *, anonymous_pull: bool) -> None:
        from datetime import UTC, datetime, timedelta

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.users, self.anonymous_pull = dict(users), anonymous_pull
        self.requests: list[tuple[str, str]] = []  # (user or "", scope)
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test token issuer")])
        now = datetime.now(UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(hours=1))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path = base / "token-cert.pem"
        self.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        super().__init__(self._handler())

    def auth_config(self) -> dict[str, Any]:
        return {
            "token": {
                "realm": f"http://127.0.0.1:{self.port}/token",
                "service": "test-registry",
                "issuer": "test-issuer",
                "rootcertbundle": str(self.cert_path),
            }
        }

    def token(self, user: str, scope: str) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        access = []
        for part in scope.split(" ") if scope else []:
            kind, _, rest = part.partition(":")
            name, _, actions = rest.rpartition(":")
            wanted = actions.split(",")
            allowed = [a for a in wanted if a == "pull" and (user or self.anonymous_pull)]
            allowed += [a for a in wanted if a in ("push", "delete") and user]
            access.append({"type": kind, "name": name, "actions": allowed})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "ES256", "x5c": [self._x5c]}
        claims = {
            "iss": "test-issuer",
            "sub": user,
            "aud": "test-registry",
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": os.urandom(8).hex(),
            "access": access,
        }
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        der = self._key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        return f"{signing_input}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                scope = " ".join(query.get("scope", []))
                user = ""
                header = self.headers.get("Authorization", "")
                if header.startswith("Basic "):
                    name, _, password = base64.b64decode(header[6:]).decode().partition(":")
                    if service.users.get(name) != password:
                        self.send_response(401)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    user = name
                service.requests.append((user, scope))
                if not user and not service.anonymous_pull:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps({"token": service.token(user, scope)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler
