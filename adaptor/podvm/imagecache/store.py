"""The image store: blobs by digest on the pod VM's root volume, and the references naming them.

    <root>/blobs/sha256/<hex>   one file per blob (manifests and indexes too), its digest checked
    <root>/index.json           (registry, repository, tag or digest) -> manifest digest and type
    <root>/tmp/                 blobs being written
    <root>/lock                 held while index.json is rewritten
    <root>/pull.lock            held (shared) by each pull; `sweep` clears tmp/ when none is

Every file is written to `tmp/`, fsynced and renamed into place, so a crash leaves either the
whole blob or none, and a blob whose bytes do not hash to its name is never renamed in. A
reference is recorded only after every blob it needs is stored, so the mirror never serves half
an image. The root must be a directory of this user (a symbolic link is refused, a wider mode
narrowed to 0700, as the state directory is); paths inside are opened without following links.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import stat
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptor.podvm.imagecache.reference import is_digest, is_registry, is_repository, is_tag
from providers.core.errors import InvalidRequest, PeerpodsError

log = logging.getLogger(__name__)

DEFAULT_STORE = Path("/var/lib/peerpods/images")
DEFAULT_MAX_BLOB_BYTES = 64 << 30
MAX_INDEX_BYTES = 64 << 20
_CHUNK = 1 << 20


class StoreError(PeerpodsError):
    """The store cannot be opened, read or written."""


class StoreRootError(StoreError, InvalidRequest):
    """The store's root is not a directory this user owns (a link, another user's)."""


class BlobTooLarge(StoreError):
    """A blob over the store's size limit (or over the size its descriptor declared)."""


class DigestMismatch(StoreError):
    """A blob whose bytes do not hash to the digest it was fetched by."""


@dataclass(frozen=True)
class StoredManifest:
    """What a reference resolves to: a manifest (or index) blob and its media type."""

    digest: str
    media_type: str
    size: int


@dataclass(frozen=True)
class StoredImage:
    """One recorded reference, as `images()` lists them."""

    registry: str
    repository: str
    reference: str
    manifest: StoredManifest


class BlobWriter:
    """One blob being written: bytes hashed and counted as they come, renamed in on `commit`."""

    def __init__(self, store: ImageStore, digest: str, expected_size: int | None) -> None:
        self._store, self.digest, self._expected = store, digest, expected_size
        self._limit = store.max_blob_bytes if expected_size is None else expected_size
        if self._limit > store.max_blob_bytes:
            raise BlobTooLarge(
                f"blob {digest} of {expected_size} bytes is over the limit of "
                f"{store.max_blob_bytes} bytes"
            )
        self._hash = hashlib.sha256()
        self.size = 0
        self._tmp = store.root / "tmp" / f"{digest[7:19]}.{secrets.token_hex(8)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd: int | None = os.open(self._tmp, flags, 0o644)

    def write(self, chunk: bytes) -> None:
        if self._fd is None:
            raise StoreError(f"blob {self.digest}: written after it was closed")
        self.size += len(chunk)
        if self.size > self._limit:
            which = "its declared size" if self._expected is not None else "the store's limit"
            raise BlobTooLarge(f"blob {self.digest} is larger than {which} ({self._limit} bytes)")
        self._hash.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(self._fd, view) :]

    def commit(self) -> Path:
        """Check size and digest, fsync, rename into place; the blob's path."""
        if self._fd is None:
            raise StoreError(f"blob {self.digest}: committed twice")
        if self._expected is not None and self.size != self._expected:
            raise DigestMismatch(
                f"blob {self.digest}: {self.size} bytes received, {self._expected} declared"
            )
        actual = "sha256:" + self._hash.hexdigest()
        if actual != self.digest:
            raise DigestMismatch(f"blob {self.digest}: its bytes hash to {actual}")
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        target = self._store.blob_file(self.digest)
        os.rename(self._tmp, target)
        self._store.sync_directory(target.parent)
        return target

    def discard(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()


class ImageStore:
    """Blobs and references under `root` (created 0700 when missing)."""

    def __init__(self, root: Path, *, max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES) -> None:
        self.root = Path(root)
        self.max_blob_bytes = max_blob_bytes
        _own_root(self.root)
        for sub in ("blobs", "blobs/sha256", "tmp"):
            _own_subdirectory(self.root / sub)
        self._index_lock = threading.Lock()
        self._index_key: tuple[int, int, int] | None = None
        self._images: dict[tuple[str, str], dict[str, Any]] = {}

    # blobs

    def blob_file(self, digest: str) -> Path:
        """Where a blob of this digest lives (whether or not it is there)."""
        if not is_digest(digest):
            raise StoreError(f"invalid digest {digest[:80]!r}")
        return self.root / "blobs" / "sha256" / digest[7:]

    def blob_path(self, digest: str) -> Path | None:
        """The stored blob's path: a regular file, never a link; None when absent."""
        if not is_digest(digest):
            return None
        path = self.blob_file(digest)
        try:
            info = path.lstat()
        except OSError:
            return None
        return path if stat.S_ISREG(info.st_mode) else None

    def blob_size(self, digest: str) -> int | None:
        path = self.blob_path(digest)
        try:
            return None if path is None else path.lstat().st_size
        except OSError:
            return None

    def open_blob(self, digest: str) -> tuple[int, int] | None:
        """(fd, size) of a stored blob, opened without following a link; the caller closes
        the fd. None when absent or not a regular file."""
        if not is_digest(digest):
            return None
        try:
            fd = os.open(self.blob_file(digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            return None
        return fd, info.st_size

    def read_blob(self, digest: str, limit: int) -> bytes | None:
        """A small stored blob's bytes (a manifest); None when absent or over `limit`."""
        opened = self.open_blob(digest)
        if opened is None:
            return None
        fd, size = opened
        try:
            data = os.read(fd, size + 1) if size <= limit else b""
        finally:
            os.close(fd)
        return data if size <= limit and len(data) == size else None

    def writer(self, digest: str, expected_size: int | None = None) -> BlobWriter:
        if not is_digest(digest):
            raise StoreError(f"invalid digest {digest[:80]!r}")
        return BlobWriter(self, digest, expected_size)

    def put(self, digest: str, data: bytes) -> Path:
        """Store a blob held in memory (a manifest), checked like a streamed one."""
        existing = self.blob_path(digest)
        if existing is not None and self.blob_size(digest) == len(data):
            return existing
        writer = self.writer(digest, len(data))
        try:
            writer.write(data)
            return writer.commit()
        finally:
            writer.discard()

    # references

    def record(
        self,
        registry: str,
        repository: str,
        refs: Mapping[str, StoredManifest],
        blobs: Iterable[str],
    ) -> None:
        """Add references and the blobs they need, once every one of those blobs is stored."""
        if not (is_registry(registry) and is_repository(repository)):
            raise StoreError(f"invalid image name {registry}/{repository}")
        needed = {*blobs, *(m.digest for m in refs.values())}
        missing = sorted(d for d in needed if self.blob_path(d) is None)
        if missing:
            raise StoreError(f"{registry}/{repository}: blobs not stored: {', '.join(missing)}")
        for ref in refs:
            if not (is_tag(ref) or is_digest(ref)):
                raise StoreError(f"invalid reference {ref[:80]!r}")
        with self._flocked("lock", fcntl.LOCK_EX):
            images = self._read_index()
            entry = images.setdefault((registry, repository), {"refs": {}, "blobs": []})
            for ref, manifest in refs.items():
                entry["refs"][ref] = {
                    "digest": manifest.digest,
                    "mediaType": manifest.media_type,
                    "size": manifest.size,
                }
            entry["blobs"] = sorted({*entry["blobs"], *needed})
            self._write_index(images)

    def resolve(self, registry: str, repository: str, reference: str) -> StoredManifest | None:
        """The manifest a tag or digest names in this repository, if it was pulled."""
        entry = self._load().get((registry, repository))
        found = entry["refs"].get(reference) if entry else None
        if found is None or self.blob_path(found["digest"]) is None:
            return None
        return StoredManifest(found["digest"], found["mediaType"], found["size"])

    def has_repository(self, registry: str, repository: str) -> bool:
        return (registry, repository) in self._load()

    def repository_blob(self, registry: str, repository: str, digest: str) -> bool:
        """Whether this repository's images use the blob (the mirror serves only those)."""
        entry = self._load().get((registry, repository))
        return entry is not None and digest in entry["blobs"]

    def tags(self, registry: str, repository: str) -> list[str] | None:
        """The repository's stored tags, sorted; None when it has no image stored."""
        entry = self._load().get((registry, repository))
        return None if entry is None else sorted(r for r in entry["refs"] if not is_digest(r))

    def registries(self) -> list[str]:
        """The registries with at least one image stored, sorted."""
        return sorted({registry for registry, _ in self._load()})

    def images(self) -> list[StoredImage]:
        """Every recorded reference, sorted by name and reference."""
        return sorted(
            (
                StoredImage(reg, repo, ref, StoredManifest(m["digest"], m["mediaType"], m["size"]))
                for (reg, repo), entry in self._load().items()
                for ref, m in entry["refs"].items()
            ),
            key=lambda image: (image.registry, image.repository, image.reference),
        )

    # pulls in flight, and what a killed one left

    def pulling(self) -> contextlib.AbstractContextManager[None]:
        """Held (shared) while a pull may be writing to `tmp/`, so `sweep` leaves it alone."""
        return self._flocked("pull.lock", fcntl.LOCK_SH)

    def sweep(self) -> int:
        """Remove what pulls left in `tmp/` (a pull killed mid-blob leaves a partial file, up to
        a layer's size), unless one is running now; how many files went."""
        fd = self._open_lock("pull.lock")
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0  # a pull is running: its files are not leftovers
            removed = 0
            for entry in os.scandir(self.root / "tmp"):
                if not entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        removed += 1
            if removed:
                log.info("image store %s: removed %d partial files", self.root, removed)
            return removed
        finally:
            os.close(fd)

    # files

    def sync_directory(self, directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _open_lock(self, name: str) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(self.root / name, flags, 0o600)

    @contextlib.contextmanager
    def _flocked(self, name: str, operation: int) -> Iterator[None]:
        """The lock file `name` held (`operation`: LOCK_SH or LOCK_EX) for the block."""
        fd = self._open_lock(name)
        try:
            fcntl.flock(fd, operation)
            yield
        finally:
            os.close(fd)

    def _load(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The index, read again only when its file changed (another process pulled)."""
        try:
            info = os.stat(self.root / "index.json", follow_symlinks=False)
            key: tuple[int, int, int] | None = (info.st_ino, info.st_mtime_ns, info.st_size)
        except FileNotFoundError:
            key = None
        with self._index_lock:
            if key != self._index_key:
                self._images = self._read_index()
                self._index_key = key
            return self._images

    def _read_index(self) -> dict[tuple[str, str], dict[str, Any]]:
        try:
            fd = os.open(self.root / "index.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StoreError(f"{self.root}/index.json: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as stream:
            data = stream.read(MAX_INDEX_BYTES + 1)
        if len(data) > MAX_INDEX_BYTES:
            raise StoreError(f"{self.root}/index.json: larger than {MAX_INDEX_BYTES} bytes")
        try:
            document = json.loads(data)
        except ValueError:
            raise StoreError(f"{self.root}/index.json: not JSON") from None
        return _images_of(document)

    def _write_index(self, images: Mapping[tuple[str, str], Mapping[str, Any]]) -> None:
        document = {
            "version": 1,
            "images": [
                {"registry": reg, "repository": repo, **entry}
                for (reg, repo), entry in sorted(images.items())
            ],
        }
        data = json.dumps(document, indent=1, sort_keys=True).encode()
        tmp = self.root / "tmp" / f"index.{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self.root / "index.json")
        self.sync_directory(self.root)


def _images_of(document: object) -> dict[tuple[str, str], dict[str, Any]]:
    """The index's entries; a malformed entry is left out (and logged), never served."""
    images: dict[tuple[str, str], dict[str, Any]] = {}
    entries = document.get("images") if isinstance(document, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        try:
            reg, repo = entry["registry"], entry["repository"]
            if not (is_registry(reg) and is_repository(repo)):
                raise ValueError(f"invalid name {reg}/{repo}")
            refs = {
                ref: {"digest": m["digest"], "mediaType": str(m["mediaType"]), "size": m["size"]}
                for ref, m in entry["refs"].items()
                if (is_tag(ref) or is_digest(ref)) and is_digest(m["digest"])
            }
            blobs = [d for d in entry["blobs"] if is_digest(d)]
        except (TypeError, KeyError, AttributeError, ValueError) as exc:
            log.warning("image store index: entry left out: %s", exc)
            continue
        images[(reg, repo)] = {"refs": refs, "blobs": blobs}
    return images


def _own_root(root: Path) -> None:
    """Create the root 0700, or check the one there: a directory of this user, not a link."""
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise StoreRootError(f"image store {root}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise StoreRootError(
                f"image store {root} belongs to uid {info.st_uid}, not {os.geteuid()}"
            )
        if info.st_mode & 0o077:
            log.warning("image store %s was mode %o; narrowed to 0700", root, info.st_mode & 0o777)
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _own_subdirectory(path: Path) -> None:
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.lstat()
    except OSError as exc:
        raise StoreRootError(f"image store {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise StoreRootError(f"image store {path}: not a directory of uid {os.geteuid()}")
