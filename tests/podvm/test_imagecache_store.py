"""The image store: blobs only under their digest, written whole or not at all, references only to
stored blobs, a root of ours that is not a link, links inside it never followed; and image
references read as Docker reads them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptor.cli.settings import PodvmImageMirrorSettings, PodvmPullImagesSettings
from adaptor.podvm.imagecache.mirror import DEFAULT_MIRROR_ADDRESS, mirror_location, upstream_of
from adaptor.podvm.imagecache.reference import ImageReference, ImageReferenceError, api_host, parse
from adaptor.podvm.imagecache.store import (
    DEFAULT_STORE,
    BlobTooLarge,
    DigestMismatch,
    ImageStore,
    StoredManifest,
    StoreError,
    StoreRootError,
)
from tests.podvm.imagecache_peers import sha256

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("busybox", ("docker.io", "library/busybox", "latest", None)),
        ("busybox:1.36", ("docker.io", "library/busybox", "1.36", None)),
        ("library/busybox", ("docker.io", "library/busybox", "latest", None)),
        ("nvidia/cuda:12.4.1-base", ("docker.io", "nvidia/cuda", "12.4.1-base", None)),
        ("docker.io/busybox", ("docker.io", "library/busybox", "latest", None)),
        ("registry-1.docker.io/library/busybox:1", ("docker.io", "library/busybox", "1", None)),
        ("index.docker.io/foo/bar", ("docker.io", "foo/bar", "latest", None)),
        ("localhost/app", ("localhost", "app", "latest", None)),
        ("127.0.0.1:5000/team/app:v1", ("127.0.0.1:5000", "team/app", "v1", None)),
        ("nvcr.io/nvidia/pytorch:25.01-py3", ("nvcr.io", "nvidia/pytorch", "25.01-py3", None)),
        ("quay.io/a/b@sha256:" + "a" * 64, ("quay.io", "a/b", None, "sha256:" + "a" * 64)),
        ("quay.io/a/b:t@sha256:" + "b" * 64, ("quay.io", "a/b", "t", "sha256:" + "b" * 64)),
    ],
)
def test_references_are_read_as_docker_reads_them(
    text: str, expected: tuple[str, str, str | None, str | None]
) -> None:
    ref = parse(text)
    assert ref == ImageReference(*expected)
    assert parse(str(ref)) == ref  # the canonical text reads back the same


@pytest.mark.parametrize(
    "text",
    [
        "",
        " busybox",
        "Busybox",
        "team/../app",
        "team//app",
        "app:",
        "app:-bad",
        "app@sha256:short",
        "app@md5:" + "a" * 32,
        "a:b:c",
        "host:99999999/app",
        "x" * 5000,
    ],
)
def test_bad_references_are_refused(text: str) -> None:
    with pytest.raises(ImageReferenceError):
        parse(text)


def test_docker_hub_is_dialled_at_its_api_host() -> None:
    assert api_host("docker.io") == "registry-1.docker.io"
    assert api_host("quay.io") == "quay.io"


def test_the_mirror_names_a_registry_with_a_port_in_one_path_component() -> None:
    assert mirror_location("docker.io") == "127.0.0.1:5170/docker.io"
    assert mirror_location("reg.example:5000", "127.0.0.1:9") == "127.0.0.1:9/reg.example_5000"
    assert upstream_of("reg.example_5000") == "reg.example:5000"
    assert upstream_of("docker.io") == "docker.io"


def test_the_defaults_are_the_commands_defaults() -> None:
    assert PodvmPullImagesSettings().store == str(DEFAULT_STORE)
    assert PodvmImageMirrorSettings().store == str(DEFAULT_STORE)
    assert PodvmImageMirrorSettings().listen == DEFAULT_MIRROR_ADDRESS == "127.0.0.1:5170"


# blobs


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "tmp").iterdir())


def test_a_blob_is_stored_under_its_digest_only_when_its_bytes_hash_to_it(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    data = b"layer bytes" * 1000
    digest = sha256(data)
    writer = store.writer(digest, len(data))
    writer.write(data[:5000])
    assert store.blob_path(digest) is None  # nothing visible before the commit
    writer.write(data[5000:])
    path = writer.commit()
    writer.discard()
    assert path.read_bytes() == data
    assert store.blob_path(digest) == path
    assert store.blob_size(digest) == len(data)

    other = b"x" * len(data)
    wrong = store.writer(sha256(b"something else"), len(other))
    wrong.write(other)
    with pytest.raises(DigestMismatch, match="hash to"):
        wrong.commit()
    wrong.discard()
    assert store.blob_path(sha256(b"something else")) is None
    assert leftovers(store.root) == []


def test_a_blob_larger_than_declared_or_than_the_limit_is_refused(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store", max_blob_bytes=1000)
    with pytest.raises(BlobTooLarge, match="over the limit"):
        store.writer(sha256(b"a" * 2000), 2000)
    writer = store.writer(sha256(b"a" * 10), 10)
    with pytest.raises(BlobTooLarge, match="declared size"):
        writer.write(b"a" * 11)
    writer.discard()
    undeclared = store.writer(sha256(b"b" * 1001))
    undeclared.write(b"b" * 1000)
    with pytest.raises(BlobTooLarge, match="limit"):
        undeclared.write(b"b")
    undeclared.discard()
    short = store.writer(sha256(b"c" * 10), 10)
    short.write(b"c" * 9)
    with pytest.raises(DigestMismatch, match="9 bytes received, 10 declared"):
        short.commit()
    short.discard()
    assert leftovers(store.root) == []
    assert list((store.root / "blobs" / "sha256").iterdir()) == []


def test_references_need_their_blobs_and_another_store_sees_them(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    manifest = json.dumps({"schemaVersion": 2}).encode()
    digest = sha256(manifest)
    stored = StoredManifest(digest, OCI_MANIFEST, len(manifest))
    layer = sha256(b"layer")
    with pytest.raises(StoreError, match="blobs not stored"):
        store.record("quay.io", "team/app", {"v1": stored}, [layer])
    store.put(digest, manifest)
    with pytest.raises(StoreError, match=layer):
        store.record("quay.io", "team/app", {"v1": stored}, [layer])
    reader = ImageStore(tmp_path / "store")  # as the mirror's process holds it
    assert reader.resolve("quay.io", "team/app", "v1") is None
    store.put(layer, b"layer")
    store.record("quay.io", "team/app", {"v1": stored, digest: stored}, [layer])
    assert reader.resolve("quay.io", "team/app", "v1") == stored
    assert reader.resolve("quay.io", "team/app", digest) == stored
    assert reader.resolve("quay.io", "team/app", "v2") is None
    assert reader.resolve("docker.io", "team/app", "v1") is None
    assert reader.registries() == ["quay.io"]
    assert reader.tags("quay.io", "team/app") == ["v1"]
    assert reader.tags("quay.io", "team/other") is None
    assert reader.repository_blob("quay.io", "team/app", layer)
    assert not reader.repository_blob("quay.io", "team/other", layer)
    assert [(i.repository, i.reference) for i in reader.images()] == [
        ("team/app", digest),
        ("team/app", "v1"),
    ]
    with pytest.raises(StoreError, match="invalid reference"):
        store.record("quay.io", "team/app", {"../x": stored}, [])


def test_a_damaged_index_entry_is_left_out(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    blob = b"manifest"
    store.put(sha256(blob), blob)
    good = {"digest": sha256(blob), "mediaType": OCI_MANIFEST, "size": len(blob)}
    index = {
        "version": 1,
        "images": [
            {"registry": "quay.io", "repository": "ok", "refs": {"v1": good}, "blobs": []},
            {"registry": "quay.io", "repository": "../etc", "refs": {"v1": good}, "blobs": []},
            {"registry": "quay.io", "repository": "broken", "refs": "nope", "blobs": []},
        ],
    }
    (store.root / "index.json").write_text(json.dumps(index))
    assert [(i.repository, i.reference) for i in store.images()] == [("ok", "v1")]
    (store.root / "index.json").write_text("{not json")
    with pytest.raises(StoreError, match="not JSON"):
        store.images()


# the root, and links


def test_the_root_is_created_0700_and_a_wider_one_narrowed(tmp_path: Path) -> None:
    ImageStore(tmp_path / "a" / "store")
    assert (tmp_path / "a" / "store").stat().st_mode & 0o777 == 0o700
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o755)
    wide.chmod(0o755)
    ImageStore(wide)
    assert wide.stat().st_mode & 0o777 == 0o700


def test_a_root_that_is_a_link_or_not_ours_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(StoreRootError):
        ImageStore(tmp_path / "link")
    assert not (real / "blobs").exists()
    if os.geteuid() != 0:
        return  # giving a directory away needs root
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    with pytest.raises(StoreRootError, match="belongs to uid 65534"):
        ImageStore(theirs)
    assert not (theirs / "blobs").exists()


def test_links_inside_the_store_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.write_bytes(b"not a blob")
    store = ImageStore(tmp_path / "store")
    digest = sha256(b"not a blob")
    store.blob_file(digest).symlink_to(outside)
    assert store.blob_path(digest) is None
    assert store.open_blob(digest) is None
    assert store.read_blob(digest, 1 << 20) is None
    manifest = b"{}"
    store.put(sha256(manifest), manifest)
    stored = StoredManifest(sha256(manifest), OCI_MANIFEST, 2)
    with pytest.raises(StoreError, match="blobs not stored"):
        store.record("quay.io", "app", {"v1": stored}, [digest])
    # a linked index is not read either
    (store.root / "index.json").symlink_to(outside)
    with pytest.raises(StoreError):
        store.images()
    (store.root / "index.json").unlink()
    # a linked blobs folder: the store refuses to open at all
    other = tmp_path / "other"
    ImageStore(other)
    (other / "blobs" / "sha256").rmdir()
    (other / "blobs" / "sha256").symlink_to(tmp_path)
    with pytest.raises(StoreRootError, match="not a directory"):
        ImageStore(other)


def test_sweep_removes_leftovers_only_when_no_pull_runs(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    (store.root / "tmp" / "abc.partial").write_bytes(b"half a layer")
    with store.pulling():
        assert ImageStore(store.root).sweep() == 0
    assert (store.root / "tmp" / "abc.partial").exists()
    assert store.sweep() == 1
    assert list((store.root / "tmp").iterdir()) == []


@given(st.text(alphabet=st.sampled_from("ab0:/._-@%A\\ \x00sh256"), max_size=40))
@settings(max_examples=400, deadline=None)
def test_any_text_is_a_clean_reference_or_refused(text: str) -> None:
    try:
        ref = parse(text)
    except ImageReferenceError:
        return
    parts = ref.repository.split("/")
    assert all(part and part not in (".", "..") for part in parts)
    assert not any(c in ref.repository for c in ":@%\\ \x00")
    assert "/" not in ref.registry and ".." not in ref.registry
    assert parse(str(ref)) == ref
