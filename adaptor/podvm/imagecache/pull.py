"""Pull images over the OCI distribution API into the image store.

One image: its manifest by tag or digest; an index (or Docker manifest list) resolves to the
platform asked for (linux/amd64 by default) and is kept too, so the mirror answers a pull by tag
exactly as the registry did; then the config and layers, streamed into the store, each checked
against its digest and declared size, those already stored skipped. The references are recorded
only once every blob is in, so a failed pull leaves no image behind (only whole, verified blobs,
which a later pull reuses).

`pull_images` pulls several, one after the other, and reports each; one image failing does not
stop the others.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import urllib3

from adaptor.podvm.imagecache.auth import Credentials
from adaptor.podvm.imagecache.errors import (
    AuthenticationFailed,
    ContentMismatch,
    ContentTooLarge,
    ImageNotFound,
    PullError,
    PullTimeout,
    RegistryResponseError,
    RegistryUnreachable,
    UnsupportedImage,
)
from adaptor.podvm.imagecache.manifest import (
    ACCEPT,
    INDEX_TYPES,
    MANIFEST_TYPES,
    Descriptor,
    ManifestError,
    Platform,
    choose,
    index_entries,
    manifest_blobs,
    media_type_of,
)
from adaptor.podvm.imagecache.reference import ImageReference
from adaptor.podvm.imagecache.registry import Limits, Manifest, RegistryClient
from adaptor.podvm.imagecache.store import (
    BlobTooLarge,
    DigestMismatch,
    ImageStore,
    StoredManifest,
    StoreError,
)

__all__ = [
    "AuthenticationFailed",
    "ContentMismatch",
    "ContentTooLarge",
    "ImageNotFound",
    "PullError",
    "PullOptions",
    "PullResult",
    "PullTimeout",
    "Puller",
    "RegistryResponseError",
    "RegistryUnreachable",
    "UnsupportedImage",
    "pull_images",
]

log = logging.getLogger(__name__)

DEFAULT_PLATFORM = Platform("linux", "amd64")


@dataclass(frozen=True)
class PullOptions:
    """How images are pulled: which platform, with which credentials, over what."""

    platform: Platform = DEFAULT_PLATFORM
    credentials: Mapping[str, Credentials] = field(default_factory=dict)
    plain_http: frozenset[str] = frozenset()  # registries spoken to over HTTP, not HTTPS
    limits: Limits = field(default_factory=Limits)
    parallel_blobs: int = 4


@dataclass(frozen=True)
class PullResult:
    """What became of one image."""

    image: str
    manifest_digest: str | None = None  # what its reference resolves to (an index, maybe)
    fetched_blobs: int = 0
    fetched_bytes: int = 0
    stored_blobs: int = 0  # already in the store, not fetched again
    seconds: float = 0.0
    error: PullError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def summary(self) -> str:
        if self.error is not None:
            return f"failed {self.image}: {self.error}"
        return (
            f"pulled {self.image} {self.manifest_digest}: {self.fetched_blobs} blobs fetched "
            f"({self.fetched_bytes} bytes), {self.stored_blobs} already stored, "
            f"{self.seconds:.1f}s"
        )


class Puller:
    """Pulls images into one store, sharing connections and tokens between them."""

    def __init__(self, store: ImageStore, options: PullOptions = PullOptions()) -> None:
        self._store, self._options = store, options
        self._held = contextlib.ExitStack()
        self._held.enter_context(store.pulling())  # until close: `sweep` leaves tmp/ alone
        self._pool = urllib3.PoolManager(num_pools=16, maxsize=max(1, options.parallel_blobs))
        self._clients: dict[str, RegistryClient] = {}

    def close(self) -> None:
        self._pool.clear()
        self._held.close()

    def pull(self, ref: ImageReference) -> PullResult:
        """Pull one image; a `PullError` says why it could not be."""
        started = time.monotonic()
        client = self._client(ref.registry)
        try:
            top = client.manifest(ref.repository, ref.reference, ACCEPT)
            top_digest = _verified_digest(top, ref.digest, ref)
            top_type = media_type_of(top.body, top.content_type)
            manifests = {top_digest: top.body}
            refs = {top_digest: StoredManifest(top_digest, top_type, len(top.body))}
            if top_type in INDEX_TYPES:
                entry = choose(index_entries(top.body), self._options.platform)
                image = client.manifest(ref.repository, entry.digest, ACCEPT)
                image_digest = _verified_digest(image, entry.digest, ref)
                image_type = media_type_of(image.body, image.content_type)
                manifests[image_digest] = image.body
                refs[image_digest] = StoredManifest(image_digest, image_type, len(image.body))
            else:
                image, image_type = top, top_type
            if image_type not in MANIFEST_TYPES:
                raise UnsupportedImage(f"{ref}: unsupported manifest type {image_type!r}")
            blobs = manifest_blobs(image.body)
        except ManifestError as exc:
            raise UnsupportedImage(f"{ref}: {exc}") from None
        fetched = self._fetch_blobs(client, ref, blobs)
        if ref.tag and not ref.digest:
            refs[ref.tag] = refs[top_digest]
        try:
            for digest, body in manifests.items():
                self._store.put(digest, body)
            self._store.record(ref.registry, ref.repository, refs, [b.digest for b in blobs])
        except (StoreError, OSError) as exc:
            raise PullError(f"{ref}: image store: {_text(exc)}") from None
        return PullResult(
            str(ref),
            top_digest,
            fetched_blobs=len(fetched),
            fetched_bytes=sum(b.size for b in fetched),
            stored_blobs=len({b.digest for b in blobs}) - len(fetched),
            seconds=time.monotonic() - started,
        )

    def _client(self, registry: str) -> RegistryClient:
        if registry not in self._clients:
            self._clients[registry] = RegistryClient(
                registry,
                self._pool,
                credentials=self._options.credentials.get(registry),
                plain_http=registry in self._options.plain_http,
                limits=self._options.limits,
            )
        return self._clients[registry]

    def _fetch_blobs(
        self, client: RegistryClient, ref: ImageReference, blobs: Sequence[Descriptor]
    ) -> list[Descriptor]:
        """Fetch the blobs not yet stored, a few at a time; the ones fetched."""
        unique = {b.digest: b for b in blobs}
        for blob in unique.values():
            if blob.size > self._store.max_blob_bytes:
                raise ContentTooLarge(
                    f"{ref}: blob {blob.digest} of {blob.size} bytes is over the store's limit "
                    f"of {self._store.max_blob_bytes} bytes"
                )
        missing = [b for b in unique.values() if self._store.blob_size(b.digest) != b.size]
        if not missing:
            return []
        with ThreadPoolExecutor(max_workers=max(1, self._options.parallel_blobs)) as pool:
            futures = [pool.submit(self._fetch_blob, client, ref, blob) for blob in missing]
            _, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for future in pending:
                future.cancel()
            for future in futures:
                if future.done() and not future.cancelled() and future.exception() is not None:
                    future.result()  # the first failure, as raised
        return missing

    def _fetch_blob(self, client: RegistryClient, ref: ImageReference, blob: Descriptor) -> None:
        try:
            writer = self._store.writer(blob.digest, blob.size)
        except BlobTooLarge as exc:
            raise ContentTooLarge(f"{ref}: {exc}") from None
        except (StoreError, OSError) as exc:
            raise PullError(f"{ref}: image store: {_text(exc)}") from None
        try:
            client.blob(ref.repository, blob.digest, writer.write)
            writer.commit()
        except BlobTooLarge as exc:
            raise ContentTooLarge(f"{ref}: {exc}") from None
        except DigestMismatch as exc:
            raise ContentMismatch(f"{ref}: {exc}") from None
        except (StoreError, OSError) as exc:
            raise PullError(f"{ref}: image store: {_text(exc)}") from None
        finally:
            writer.discard()
        log.debug("stored blob %s of %s (%d bytes)", blob.digest, ref, blob.size)


def pull_images(
    refs: Sequence[ImageReference],
    store: ImageStore,
    options: PullOptions = PullOptions(),
    report: Callable[[PullResult], None] | None = None,
) -> list[PullResult]:
    """Pull each image in turn; a failed one is reported and the next one pulled. What an
    earlier, killed pull left in the store's `tmp/` is removed first."""
    store.sweep()
    puller = Puller(store, options)
    results: list[PullResult] = []
    try:
        for ref in refs:
            try:
                result = puller.pull(ref)
            except PullError as exc:
                result = PullResult(str(ref), error=exc)
            results.append(result)
            if report is not None:
                report(result)
    finally:
        puller.close()
    return results


def _verified_digest(manifest: Manifest, expected: str | None, ref: ImageReference) -> str:
    """The manifest's digest, which must be the one it was asked by and the one announced."""
    digest = "sha256:" + hashlib.sha256(manifest.body).hexdigest()
    if expected is not None and digest != expected:
        raise ContentMismatch(f"{ref}: manifest {expected} hashes to {digest}")
    announced = manifest.digest_header.strip()
    if announced.startswith("sha256:") and announced != digest:
        raise ContentMismatch(f"{ref}: manifest announced as {announced} hashes to {digest}")
    return digest


def _text(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
    return str(exc)
