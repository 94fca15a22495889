"""The image cache against real peers: an image pushed by skopeo to Debian's distribution
registry, pulled by `peerpods podvm pull-images`, then, with the registry stopped, pulled again
by skopeo through `peerpods podvm image-mirror`, by tag and by digest, byte for byte."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3

from adaptor.cli.main import main
from adaptor.podvm.imagecache.mirror import mirror_location
from adaptor.podvm.imagecache.store import ImageStore
from tests.podvm.imagecache_peers import (
    Pushed,
    TokenService,
    mirror,
    need,
    push,
    registry,
    sha256,
    skopeo,
    write_layout,
)


@pytest.fixture(autouse=True)
def _peers() -> None:
    need("docker-registry", "skopeo")


def pull(store: Path, *args: str) -> int:
    return main(["podvm", "pull-images", "--store", str(store), *args])


@pytest.fixture
def pushed(tmp_path: Path) -> Iterator[Pushed]:
    with registry(tmp_path / "registry") as reg:
        yield push(tmp_path, reg)


def oci_blobs(path: Path) -> dict[str, bytes]:
    return {f"sha256:{p.name}": p.read_bytes() for p in (path / "blobs" / "sha256").iterdir()}


def test_pulled_then_served_by_the_mirror_with_the_registry_gone(
    pushed: Pushed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    assert pull(store, "--plain-http", pushed.registry.host, pushed.image) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"pulled {pushed.image} {pushed.layout.index_digest}: 3 blobs fetched")
    pushed.registry.process.terminate()
    pushed.registry.process.wait(10)

    amd64 = pushed.layout.manifests["linux/amd64"]
    with mirror(store) as address:
        base = mirror_location(pushed.registry.host, address)
        by_tag = skopeo(
            tmp_path / "home",
            *("--override-os", "linux", "--override-arch", "amd64", "copy"),
            "--src-tls-verify=false",
            f"docker://{base}/team/app:v1",
            f"oci:{tmp_path / 'by-tag'}:v1",
        )
        assert by_tag.returncode == 0, by_tag.stderr
        by_digest = skopeo(
            tmp_path / "home",
            "copy",
            "--all",
            "--src-tls-verify=false",
            f"docker://{base}/team/app@{amd64}",
            f"oci:{tmp_path / 'by-digest'}:x",
        )
        assert by_digest.returncode == 0, by_digest.stderr
        inspected = skopeo(
            tmp_path / "home", "inspect", "--tls-verify=false", f"docker://{base}/team/app:v1"
        )
        assert inspected.returncode == 0, inspected.stderr
        # the arm64 manifest was never pulled: the mirror says so, the puller goes upstream
        arm64 = pushed.layout.manifests["linux/arm64"]
        missing = skopeo(
            tmp_path / "home",
            *("inspect", "--raw", "--tls-verify=false"),
            f"docker://{base}/team/app@{arm64}",
        )
        assert missing.returncode != 0
        assert "manifest unknown" in missing.stderr.lower()

    wanted = {**{d: pushed.layout.blob(d) for d in pushed.layout.layers["linux/amd64"]}}
    wanted[pushed.layout.configs["linux/amd64"]] = pushed.layout.blob(
        pushed.layout.configs["linux/amd64"]
    )
    for folder in ("by-tag", "by-digest"):
        copied = oci_blobs(tmp_path / folder)
        for digest, data in wanted.items():
            assert copied[digest] == data, f"{folder}: {digest} differs"
        assert sha256(copied[amd64]) == amd64  # the manifest's own bytes, as pushed
    info = json.loads(inspected.stdout)
    assert info["Digest"] == pushed.layout.index_digest
    assert info["Architecture"] == "amd64"
    assert info["RepoTags"] == ["v1"]


def test_the_mirror_answers_404_for_what_it_does_not_hold(pushed: Pushed, tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert pull(store, "--plain-http", pushed.registry.host, pushed.image) == 0
    http = urllib3.PoolManager(retries=False)
    with mirror(store) as address:
        name = f"{address}/v2/" + mirror_location(pushed.registry.host, address).split("/", 1)[1]
        cases = {
            f"http://{name}/team/app/manifests/v2": "MANIFEST_UNKNOWN",
            f"http://{name}/team/other/manifests/v1": "NAME_UNKNOWN",
            f"http://{address}/v2/docker.io/library/busybox/manifests/latest": "NAME_UNKNOWN",
            f"http://{address}/v3/whatever": "NOT_FOUND",
            f"http://{name}/team/app/blobs/{sha256(b'nothing')}": "BLOB_UNKNOWN",
            # a blob of the arm64 image, which the store does not hold
            f"http://{name}/team/app/blobs/{pushed.layout.layers['linux/arm64'][0]}": (
                "BLOB_UNKNOWN"
            ),
        }
        for url, code in cases.items():
            response = http.request("GET", url)
            assert response.status == 404, url
            assert response.headers["Docker-Distribution-API-Version"] == "registry/2.0"
            assert json.loads(response.data)["errors"][0]["code"] == code, url
        root = http.request("GET", f"http://{address}/v2/")
        assert root.status == 200
        assert root.headers["Docker-Distribution-API-Version"] == "registry/2.0"
        head = http.request("HEAD", f"http://{name}/team/app/manifests/v1")
        assert head.status == 200
        assert head.headers["Docker-Content-Digest"] == pushed.layout.index_digest
        assert head.headers["Content-Type"] == "application/vnd.oci.image.index.v1+json"
        assert int(head.headers["Content-Length"]) == len(
            pushed.layout.blob(pushed.layout.index_digest)
        )
        layer = pushed.layout.layers["linux/amd64"][0]
        head = http.request("HEAD", f"http://{name}/team/app/blobs/{layer}")
        assert head.status == 200
        assert head.data == b""
        assert head.headers["Docker-Content-Digest"] == layer
        assert int(head.headers["Content-Length"]) == len(pushed.layout.blob(layer))
        tags = http.request("GET", f"http://{name}/team/app/tags/list")
        assert json.loads(tags.data)["tags"] == ["v1"]
        for method in ("PUT", "POST", "PATCH", "DELETE"):
            response = http.request(method, f"http://{name}/team/app/manifests/v1", body=b"{}")
            assert response.status == 405, method
            assert json.loads(response.data)["errors"][0]["code"] == "UNSUPPORTED"


def test_a_second_pull_fetches_only_what_is_new(
    pushed: Pushed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    assert pull(store, "--plain-http", pushed.registry.host, pushed.image) == 0
    capsys.readouterr()
    assert pull(store, "--plain-http", pushed.registry.host, pushed.image) == 0
    assert ": 0 blobs fetched (0 bytes), 3 already stored" in capsys.readouterr().out
    arm = pull(
        store, "--plain-http", pushed.registry.host, "--platform", "linux/arm64", pushed.image
    )
    assert arm == 0
    assert ": 3 blobs fetched" in capsys.readouterr().out
    images = ImageStore(store).images()
    refs = {(i.repository, i.reference) for i in images}
    assert ("team/app", "v1") in refs
    assert ("team/app", pushed.layout.manifests["linux/arm64"]) in refs
    assert ("team/app", pushed.layout.manifests["linux/amd64"]) in refs


def test_one_failed_image_does_not_stop_the_others(
    pushed: Pushed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = tmp_path / "images.txt"
    missing = f"{pushed.registry.host}/team/missing:v1"
    images.write_text(f"# the pool's images\n{missing}\n\n{pushed.image}  # the app\n")
    store = tmp_path / "store"
    code = pull(store, "--plain-http", pushed.registry.host, "--images-file", str(images))
    assert code == 1
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == f"failed {missing}: {pushed.registry.host}: manifest team/missing:v1: " + (
        "not found"
    )
    assert lines[1].startswith(f"pulled {pushed.image} ")
    assert captured.err.strip() == "peerpods podvm pull-images: 1 of 2 images failed"
    assert ImageStore(store).registries() == [pushed.registry.host]


def test_an_image_pulled_by_digest_is_served_by_digest_only(pushed: Pushed, tmp_path: Path) -> None:
    store = tmp_path / "store"
    image = f"{pushed.registry.host}/team/app@{pushed.layout.index_digest}"
    assert pull(store, "--plain-http", pushed.registry.host, image) == 0
    opened = ImageStore(store)
    assert opened.resolve(pushed.registry.host, "team/app", "v1") is None
    found = opened.resolve(pushed.registry.host, "team/app", pushed.layout.index_digest)
    assert found is not None
    assert found.media_type == "application/vnd.oci.image.index.v1+json"


# authentication


def auth_file(path: Path, registry: str, user: str, password: str) -> Path:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {registry: {"auth": token}}}))
    return path


def test_anonymous_bearer_tokens(tmp_path: Path) -> None:
    with (
        TokenService(tmp_path, {"pusher": "push-secret"}, anonymous_pull=True) as tokens,
        registry(tmp_path / "registry", tokens.auth_config()) as reg,
    ):
        pushed = push(tmp_path, reg, "team/app", "--dest-creds", "pusher:push-secret")
        tokens.requests.clear()
        assert pull(tmp_path / "store", "--plain-http", reg.host, pushed.image) == 0
    # one token for the repository, asked for anonymously, used for every request after
    assert tokens.requests == [("", "repository:team/app:pull")]


def test_bearer_tokens_with_credentials_from_the_auth_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    users = {"pusher": "push-secret", "reader": "read-secret"}
    with (
        TokenService(tmp_path, users, anonymous_pull=False) as tokens,
        registry(tmp_path / "registry", tokens.auth_config()) as reg,
    ):
        pushed = push(tmp_path, reg, "team/app", "--dest-creds", "pusher:push-secret")
        store = tmp_path / "store"
        assert pull(store, "--plain-http", reg.host, pushed.image) == 1
        assert "the token service refused an anonymous pull (401)" in capsys.readouterr().out
        wrong = auth_file(tmp_path / "wrong.json", reg.host, "reader", "guess")
        assert pull(store, "--plain-http", reg.host, "--auth", str(wrong), pushed.image) == 1
        assert "the token service refused the credentials (401)" in capsys.readouterr().out
        assert ImageStore(store).images() == []
        tokens.requests.clear()
        right = auth_file(tmp_path / "auth.json", reg.host, "reader", "read-secret")
        assert pull(store, "--plain-http", reg.host, "--auth", str(right), pushed.image) == 0
    assert tokens.requests == [("reader", "repository:team/app:pull")]


def test_basic_auth_from_htpasswd(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    need("htpasswd")
    users = tmp_path / "htpasswd"
    made = subprocess.run(
        ["htpasswd", "-Bbc", str(users), "reader", "read-secret"], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    config = {"htpasswd": {"realm": "test", "path": str(users)}}
    with registry(tmp_path / "registry", config) as reg:
        pushed = push(tmp_path, reg, "team/app", "--dest-creds", "reader:read-secret")
        store = tmp_path / "store"
        assert pull(store, "--plain-http", reg.host, pushed.image) == 1
        assert "credentials needed" in capsys.readouterr().out
        right = auth_file(tmp_path / "auth.json", reg.host, "reader", "read-secret")
        assert pull(store, "--plain-http", reg.host, "--auth", str(right), pushed.image) == 0


def test_docker_media_types_are_served_as_the_registry_served_them(tmp_path: Path) -> None:
    """A Docker manifest list and Docker v2 manifests (as Docker Hub serves most images):
    what skopeo copies through the mirror is what it copies from the registry itself."""
    layout = write_layout(tmp_path / "layout")
    home = tmp_path / "home"
    with registry(tmp_path / "registry") as reg:
        image = f"{reg.host}/team/app:v1"
        pushed = skopeo(
            home,
            *("copy", "--all", "--format", "v2s2", "--dest-tls-verify=false"),
            f"oci:{layout.path}:v1",
            f"docker://{image}",
        )
        assert pushed.returncode == 0, pushed.stderr
        raw = skopeo(home, "inspect", "--raw", "--tls-verify=false", f"docker://{image}")
        index = json.loads(raw.stdout)
        assert index["mediaType"] == "application/vnd.docker.distribution.manifest.list.v2+json"
        direct = skopeo(
            home, "copy", "--src-tls-verify=false", f"docker://{image}", f"oci:{tmp_path / 'a'}:v1"
        )
        assert direct.returncode == 0, direct.stderr
        assert pull(tmp_path / "store", "--plain-http", reg.host, image) == 0
    with mirror(tmp_path / "store") as address:
        base = mirror_location(reg.host, address)
        mirrored = skopeo(
            home,
            "copy",
            "--src-tls-verify=false",
            f"docker://{base}/team/app:v1",
            f"oci:{tmp_path / 'b'}:v1",
        )
        assert mirrored.returncode == 0, mirrored.stderr
        raw_mirrored = skopeo(
            home, "inspect", "--raw", "--tls-verify=false", f"docker://{base}/team/app:v1"
        )
    assert raw_mirrored.stdout == raw.stdout
    assert oci_blobs(tmp_path / "b") == oci_blobs(tmp_path / "a")
    stored = ImageStore(tmp_path / "store").resolve(reg.host, "team/app", "v1")
    assert stored is not None
    assert stored.media_type == "application/vnd.docker.distribution.manifest.list.v2+json"
