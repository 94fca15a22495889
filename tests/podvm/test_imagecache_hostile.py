"""Hostile peers: a registry on loopback that lies (digests, sizes, stalls, realms) and clients of
the mirror that try to leave its names. A pull that fails stores nothing of the image; the mirror
answers 404, never a file outside its blobs, never a 500."""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from adaptor.cli.main import main
from adaptor.podvm.imagecache.auth import Credentials
from adaptor.podvm.imagecache.errors import (
    AuthenticationFailed,
    ContentMismatch,
    ContentTooLarge,
    PullTimeout,
    RegistryResponseError,
    RegistryUnreachable,
    UnsupportedImage,
)
from adaptor.podvm.imagecache.manifest import Platform
from adaptor.podvm.imagecache.pull import Puller, PullOptions
from adaptor.podvm.imagecache.reference import parse
from adaptor.podvm.imagecache.registry import Limits
from adaptor.podvm.imagecache.store import ImageStore, StoredManifest
from tests.fake_apiserver import LoopbackServer
from tests.podvm.imagecache_peers import (
    OCI_INDEX,
    OCI_MANIFEST,
    ROOT,
    free_port,
    mirror,
    mirror_process,
    sha256,
)

Answer = tuple[int, dict[str, str], bytes]


@dataclass
class FakeRegistry:
    """Answers GETs from `routes` (path -> answer, or a function writing the answer itself);
    anything else is a 404. Records each request's path and Authorization header."""

    routes: dict[str, Answer | Callable[[BaseHTTPRequestHandler], None]] = field(
        default_factory=dict
    )
    requests: list[tuple[str, str]] = field(default_factory=list)
    port: int = 0

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def image(
        self,
        config: bytes,
        layers: list[bytes],
        declared: dict[str, int] | None = None,
        served: dict[str, bytes] | None = None,
    ) -> bytes:
        """Serve a manifest of `config` and `layers` under team/app:v1 (sizes as declared,
        bytes as served, where a test lies); its bytes."""
        declared, served = declared or {}, served or {}
        blobs = [config, *layers]
        descriptors = [
            {
                "mediaType": "application/octet-stream",
                "digest": sha256(b),
                "size": declared.get(sha256(b), len(b)),
            }
            for b in blobs
        ]
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": descriptors[0],
                "layers": descriptors[1:],
            }
        ).encode()
        headers = {"Content-Type": OCI_MANIFEST, "Docker-Content-Digest": sha256(manifest)}
        self.routes["/v2/team/app/manifests/v1"] = (200, headers, manifest)
        for blob in blobs:
            body = served.get(sha256(blob), blob)
            self.routes[f"/v2/team/app/blobs/{sha256(blob)}"] = (200, {}, body)
        return manifest


def send(handler: BaseHTTPRequestHandler, answer: Answer) -> None:
    """Write `answer` (status, headers, body) as the whole response, its length declared."""
    status, headers, body = answer
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@pytest.fixture
def fake() -> Iterator[FakeRegistry]:
    registry = FakeRegistry()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: object) -> None:
            pass

        def do_GET(self) -> None:
            registry.requests.append((self.path, self.headers.get("Authorization", "")))
            route = registry.routes.get(self.path.split("?", 1)[0])
            if callable(route):
                route(self)
                return
            send(self, route or (404, {}, b'{"errors":[]}'))

    with LoopbackServer(Handler) as server:
        registry.port = server.port
        yield registry


def pull(store: ImageStore, fake: FakeRegistry, **options: Any) -> None:
    puller = Puller(store, PullOptions(plain_http=frozenset({fake.host}), **options))
    try:
        puller.pull(parse(f"{fake.host}/team/app:v1"))
    finally:
        puller.close()


def nothing_stored(store: ImageStore, *digests: str) -> None:
    assert store.images() == []
    assert list((store.root / "tmp").iterdir()) == []
    for digest in digests:
        assert store.blob_path(digest) is None


def test_a_blob_whose_bytes_do_not_match_its_digest_is_not_stored(
    fake: FakeRegistry, tmp_path: Path
) -> None:
    config, layer = b'{"os":"linux"}', b"layer"
    forged = b"LAYER"  # the same size, other bytes
    fake.image(config, [layer], served={sha256(layer): forged})
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ContentMismatch, match="hash to"):
        pull(store, fake)
    nothing_stored(store, sha256(layer), sha256(forged))


def test_the_cli_reports_it_in_one_line_and_exits_1(
    fake: FakeRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, layer = b'{"os":"linux"}', b"layer"
    fake.image(config, [layer], served={sha256(layer): b"LAYER"})
    store = tmp_path / "store"
    code = main(
        [
            "podvm",
            "pull-images",
            "--store",
            str(store),
            "--plain-http",
            fake.host,
            f"{fake.host}/team/app:v1",
        ]
    )
    assert code == 1
    out, err = capsys.readouterr()
    assert out.startswith(f"failed {fake.host}/team/app:v1: ")
    assert "Traceback" not in out + err
    assert len(out.splitlines()) == 1
    nothing_stored(ImageStore(store), sha256(layer))


def test_a_blob_over_the_limit_is_refused_before_it_is_fetched(
    fake: FakeRegistry, tmp_path: Path
) -> None:
    config, layer = b'{"os":"linux"}', b"x" * 5000
    fake.image(config, [layer])
    store = ImageStore(tmp_path / "store", max_blob_bytes=4096)
    with pytest.raises(ContentTooLarge, match="over the store's limit"):
        pull(store, fake)
    assert not any("/blobs/" in path for path, _ in fake.requests)
    nothing_stored(store, sha256(layer))


def test_a_blob_longer_than_declared_is_cut_off(fake: FakeRegistry, tmp_path: Path) -> None:
    config, layer = b'{"os":"linux"}', b"y" * 3000

    def endless(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        chunk = b"y" * 1000
        for _ in range(100):
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        handler.wfile.write(b"0\r\n\r\n")

    fake.image(config, [layer])
    fake.routes[f"/v2/team/app/blobs/{sha256(layer)}"] = endless
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ContentTooLarge, match="declared size"):
        pull(store, fake)
    nothing_stored(store, sha256(layer))


def test_a_manifest_over_its_cap_or_announced_wrongly_is_refused(
    fake: FakeRegistry, tmp_path: Path
) -> None:
    store = ImageStore(tmp_path / "store")
    big = b'{"pad":"' + b"x" * (4 << 20) + b'"}'
    fake.routes["/v2/team/app/manifests/v1"] = (200, {"Content-Type": OCI_MANIFEST}, big)
    with pytest.raises(ContentTooLarge, match="manifest larger than"):
        pull(store, fake)
    manifest = fake.image(b"{}", [b"layer"])
    headers = {"Content-Type": OCI_MANIFEST, "Docker-Content-Digest": sha256(b"other")}
    fake.routes["/v2/team/app/manifests/v1"] = (200, headers, manifest)
    with pytest.raises(ContentMismatch, match="announced as"):
        pull(store, fake)
    nothing_stored(store)


def test_an_index_entry_whose_manifest_differs_is_refused(
    fake: FakeRegistry, tmp_path: Path
) -> None:
    manifest = fake.image(b"{}", [b"layer"])
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": sha256(b"another manifest"),
                    "size": len(manifest),
                    "platform": {"os": "linux", "architecture": "amd64"},
                }
            ],
        }
    ).encode()
    fake.routes["/v2/team/app/manifests/v1"] = (200, {"Content-Type": OCI_INDEX}, index)
    fake.routes[f"/v2/team/app/manifests/{sha256(b'another manifest')}"] = (
        200,
        {"Content-Type": OCI_MANIFEST},
        manifest,
    )
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ContentMismatch):
        pull(store, fake)
    with pytest.raises(UnsupportedImage, match="no manifest for linux/s390x"):
        pull(store, fake, platform=Platform("linux", "s390x"))
    nothing_stored(store)


def test_a_stalled_blob_runs_into_its_deadline(fake: FakeRegistry, tmp_path: Path) -> None:
    config, layer = b"{}", b"z" * 1000
    release = threading.Event()

    def stall(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(layer)))
        handler.end_headers()
        handler.wfile.write(layer[:10])
        handler.wfile.flush()
        release.wait(30)

    fake.image(config, [layer])
    fake.routes[f"/v2/team/app/blobs/{sha256(layer)}"] = stall
    store = ImageStore(tmp_path / "store")
    started = time.monotonic()
    try:
        with pytest.raises(PullTimeout):
            pull(store, fake, limits=Limits(blob_seconds=1.0))
    finally:
        release.set()
    assert time.monotonic() - started < 15
    nothing_stored(store, sha256(layer))


def test_registry_errors_are_named(fake: FakeRegistry, tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    fake.routes["/v2/team/app/manifests/v1"] = (500, {}, b"oops")
    with pytest.raises(RegistryResponseError, match="HTTP 500"):
        pull(store, fake)
    fake.routes["/v2/team/app/manifests/v1"] = (200, {"Content-Type": OCI_MANIFEST}, b"[1,2")
    with pytest.raises(UnsupportedImage, match="not JSON"):
        pull(store, fake)
    schema1 = json.dumps({"schemaVersion": 1, "name": "team/app"}).encode()
    kind = "application/vnd.docker.distribution.manifest.v1+prettyjws"
    fake.routes["/v2/team/app/manifests/v1"] = (200, {"Content-Type": kind}, schema1)
    with pytest.raises(UnsupportedImage, match="unsupported manifest type"):
        pull(store, fake)
    closed = f"127.0.0.1:{free_port()}"
    puller = Puller(store, PullOptions(plain_http=frozenset({closed})))
    with pytest.raises(RegistryUnreachable):
        puller.pull(parse(f"{closed}/team/app:v1"))
    puller.close()
    nothing_stored(store)


def challenge(realm: str) -> Answer:
    header = f'Bearer realm="{realm}",service="fake",scope="repository:team/app:pull"'
    return (401, {"WWW-Authenticate": header}, b"")


def test_a_realm_that_is_not_http_is_refused(fake: FakeRegistry, tmp_path: Path) -> None:
    fake.routes["/v2/team/app/manifests/v1"] = challenge("file:///etc/passwd")
    store = ImageStore(tmp_path / "store")
    with pytest.raises(AuthenticationFailed, match="invalid token realm"):
        pull(store, fake)


def test_credentials_never_go_to_a_plain_http_realm_on_another_host(
    fake: FakeRegistry, tmp_path: Path
) -> None:
    # the same loopback service under another name: to the client, another host
    fake.routes["/v2/team/app/manifests/v1"] = challenge(f"http://localhost:{fake.port}/token")
    fake.routes["/token"] = (200, {}, b'{"token": "t0ken"}')
    store = ImageStore(tmp_path / "store")
    creds = {fake.host: Credentials("reader", "read-secret")}
    with pytest.raises(AuthenticationFailed, match="refused the token"):
        pull(store, fake, credentials=creds)
    sent = {path.split("?")[0]: auth for path, auth in fake.requests}
    assert sent["/token"] == ""
    # on the registry's own host, over HTTP as the registry itself is: sent
    fake.requests.clear()
    fake.routes["/v2/team/app/manifests/v1"] = challenge(f"http://127.0.0.1:{fake.port}/token")
    with pytest.raises(AuthenticationFailed):
        pull(store, fake, credentials=creds)
    token_auth = [auth for path, auth in fake.requests if path.startswith("/token")]
    assert token_auth == ["Basic " + base64.b64encode(b"reader:read-secret").decode()]
    # the token is then sent to the registry, never the password
    assert [a for p, a in fake.requests if p.startswith("/v2/")] == ["", "Bearer t0ken"]


# the mirror


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, ImageStore, str]]:
    """A mirror over a store holding quay.io/team/app:v1 (one layer); its address."""
    store = ImageStore(tmp_path / "store")
    layer = b"layer bytes"
    store.put(sha256(layer), layer)
    manifest = json.dumps({"schemaVersion": 2, "layers": []}).encode()
    store.put(sha256(manifest), manifest)
    stored = StoredManifest(sha256(manifest), OCI_MANIFEST, len(manifest))
    store.record("quay.io", "team/app", {"v1": stored}, [sha256(layer)])
    with mirror(store.root) as address:
        yield address, store, sha256(layer)


def raw_get(address: str, path: str) -> tuple[int, bytes]:
    """A GET of `path` exactly as written (no client normalising dots or escapes)."""
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.putrequest("GET", path, skip_accept_encoding=True)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_names_that_leave_the_store_are_404(
    served: tuple[str, ImageStore, str], tmp_path: Path
) -> None:
    address, _, layer = served
    (tmp_path / "secret").write_text("outside")
    assert raw_get(address, "/v2/quay.io/team/app/manifests/v1")[0] == 200
    assert raw_get(address, f"/v2/quay.io/team/app/blobs/{layer}") == (200, b"layer bytes")
    for path in [
        "/v2/quay.io/team/../team/app/manifests/v1",
        "/v2/quay.io/../../../../etc/passwd/manifests/v1",
        "/v2/quay.io/%2e%2e/%2e%2e/secret/blobs/" + layer,
        "/v2/quay.io/team/app/manifests/..%2f..%2findex.json",
        "/v2/quay.io/team/app/blobs/sha256:..%2f..%2f..%2fsecret",
        "/v2/quay.io/team/app/blobs/../../../index.json",
        "/v2/quay.io/TEAM/app/manifests/v1",
        "/v2/quay.io/team/app/manifests/v1%00",
        "/v2/quay.io//team/app/manifests/v1",
        "/v2/../v2/quay.io/team/app/manifests/v1",
    ]:
        status, body = raw_get(address, path)
        assert status in (400, 404), path  # 400: uvicorn refusing the request line itself
        assert b"outside" not in body and b"layer bytes" not in body, path
        if status == 404:
            assert (
                json.loads(body)["errors"][0]["code"].endswith("_UNKNOWN")
                or json.loads(body)["errors"][0]["code"] == "NOT_FOUND"
            ), path


def test_a_linked_blob_is_not_served(served: tuple[str, ImageStore, str], tmp_path: Path) -> None:
    address, store, layer = served
    outside = tmp_path / "secret"
    outside.write_text("outside")
    path = store.blob_file(layer)
    path.unlink()
    path.symlink_to(outside)
    status, body = raw_get(address, f"/v2/quay.io/team/app/blobs/{layer}")
    assert status == 404
    assert json.loads(body)["errors"][0]["code"] == "BLOB_UNKNOWN"


def test_a_damaged_index_is_answered_404_not_500(served: tuple[str, ImageStore, str]) -> None:
    address, store, _ = served
    (store.root / "index.json").write_text("{damaged")
    status, body = raw_get(address, "/v2/quay.io/team/app/manifests/v1")
    assert status == 404
    assert json.loads(body)["errors"][0]["code"] == "NAME_UNKNOWN"


def test_the_mirror_refuses_a_non_loopback_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    for address in ("0.0.0.0:5170", "10.1.2.3:5170", "example.com:5170", "127.0.0.1", "[::1]:0"):
        code = main(["podvm", "image-mirror", "--store", str(store), "--listen", address])
        assert code == 2, address
        err = capsys.readouterr().err.strip()
        assert err.startswith("peerpods podvm: "), err
        assert len(err.splitlines()) == 1
    assert not store.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["Not/An/Image"], "invalid repository"),
        (["quay.io/app@sha256:1234"], "invalid digest"),
        ([], "no images given"),
        (["--platform", "linux", "busybox"], "--platform"),
        (["--auth", "/nonexistent/auth.json", "busybox"], "cannot read it"),
        (["--images-file", "/nonexistent/images", "busybox"], "--images-file"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_made(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    code = main(["podvm", "pull-images", "--store", str(store), *argv])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("peerpods podvm: ") and message in err, err
    assert len(err.splitlines()) == 1
    assert not store.exists()


def test_an_auth_file_not_in_docker_format_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    for content, message in [
        ("[]", 'no "auths"'),
        ('{"auths": {"quay.io": {"auth": "!!notbase64"}}}', "no usable credentials"),
        (
            '{"auths": {"quay.io": {"auth": "' + base64.b64encode(b"nocolon").decode() + '"}}}',
            "no usable credentials",
        ),
    ]:
        auth = tmp_path / "auth.json"
        auth.write_text(content)
        code = main(["podvm", "pull-images", "--store", str(store), "--auth", str(auth), "busybox"])
        assert code == 2
        assert message in capsys.readouterr().err
    assert not store.exists()


# what a killed pull leaves, and what an abandoned download holds


def test_a_pull_killed_mid_blob_leaves_a_partial_file_the_mirror_sweeps(
    fake: FakeRegistry, tmp_path: Path
) -> None:
    layer = os.urandom(4 << 20)
    release = threading.Event()

    def stall(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(layer)))
        handler.end_headers()
        handler.wfile.write(layer[: 5 << 19])
        handler.wfile.flush()
        release.wait(30)

    fake.image(b"{}", [layer])
    fake.routes[f"/v2/team/app/blobs/{sha256(layer)}"] = stall
    store = tmp_path / "store"
    command = [sys.executable, "-m", "adaptor.cli.main", "podvm", "pull-images"]
    command += ["--store", str(store), "--plain-http", fake.host, f"{fake.host}/team/app:v1"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            partial = [p for p in (store / "tmp").glob("*") if p.stat().st_size >= 1 << 20]
            if partial:
                break
            time.sleep(0.05)
        assert partial, "the pull never wrote the first MiB of the blob"
        # while the pull runs, its file is not a leftover
        assert ImageStore(store).sweep() == 0
        process.kill()
        process.wait(10)
    finally:
        release.set()
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert partial[0].exists()
    with mirror(store):
        pass
    assert list((store / "tmp").iterdir()) == []
    assert ImageStore(store).images() == []


def mirror_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_abandoned_downloads_hold_no_file_open(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    layer = os.urandom(8 << 20)
    store.put(sha256(layer), layer)
    manifest = json.dumps({"schemaVersion": 2, "layers": []}).encode()
    store.put(sha256(manifest), manifest)
    stored = StoredManifest(sha256(manifest), OCI_MANIFEST, len(manifest))
    store.record("quay.io", "team/app", {"v1": stored}, [sha256(layer)])
    path = f"/v2/quay.io/team/app/blobs/{sha256(layer)}"
    with mirror_process(store.root) as (address, process):
        assert raw_get(address, path) == (200, layer)
        baseline = mirror_fds(process.pid)
        host, port = address.rsplit(":", 1)
        for _ in range(20):
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
                sock.recv(4096)  # the headers and a little of the body, then gone
        deadline = time.monotonic() + 10
        while mirror_fds(process.pid) > baseline and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mirror_fds(process.pid) <= baseline
        assert raw_get(address, path) == (200, layer)  # and it still serves


def test_a_blob_redirected_to_another_host_is_fetched_without_our_token(
    fake: FakeRegistry, tmp_path: Path
) -> None:
    config, layer = b'{"os":"linux"}', b"layer from the CDN"
    fake.image(config, [layer])
    manifest_route = fake.routes["/v2/team/app/manifests/v1"]
    assert isinstance(manifest_route, tuple)
    token_auth = "Bearer t0ken"

    def guarded(answer: Answer) -> Callable[[BaseHTTPRequestHandler], None]:
        def route(handler: BaseHTTPRequestHandler) -> None:
            if handler.headers.get("Authorization") != token_auth:
                send(handler, challenge(f"http://127.0.0.1:{fake.port}/token"))
            else:
                send(handler, answer)

        return route

    fake.routes["/v2/team/app/manifests/v1"] = guarded(manifest_route)
    fake.routes[f"/v2/team/app/blobs/{sha256(config)}"] = guarded((200, {}, config))
    cdn = f"http://localhost:{fake.port}/cdn/layer"  # another host name, to the client
    fake.routes[f"/v2/team/app/blobs/{sha256(layer)}"] = guarded((307, {"Location": cdn}, b""))
    fake.routes["/cdn/layer"] = (200, {}, layer)
    fake.routes["/token"] = (200, {}, b'{"token": "t0ken"}')
    store = ImageStore(tmp_path / "store")
    pull(store, fake)
    sent = dict(fake.requests)
    assert sent[f"/v2/team/app/blobs/{sha256(layer)}"] == token_auth
    assert sent["/cdn/layer"] == ""
    assert store.read_blob(sha256(layer), 1 << 20) == layer
