"""Manifests and indexes (OCI and Docker v2), read into typed descriptors and checked.

Only what a pull needs: an index's per-platform manifests, a manifest's config and layers. A
descriptor's digest must be a sha256 digest and its size a non-negative integer; anything else,
or a media type the puller does not know (Docker's schema 1), is a `ManifestError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from adaptor.podvm.imagecache.reference import is_digest
from providers.core.errors import PeerpodsError

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))


class ManifestError(PeerpodsError):
    """A manifest or index that cannot be read, or of a kind not supported."""


@dataclass(frozen=True)
class Platform:
    """os/architecture[/variant], as `linux/amd64` or `linux/arm64/v8`."""

    os: str
    architecture: str
    variant: str = ""

    @classmethod
    def parse(cls, text: str) -> Platform:
        parts = text.split("/")
        if len(parts) not in (2, 3) or not all(p and p.isascii() and p.isalnum() for p in parts):
            raise ValueError(f"invalid platform {text!r} (os/architecture[/variant])")
        return cls(*parts)

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


@dataclass(frozen=True)
class Descriptor:
    """A blob or manifest named by digest, with its size and media type."""

    media_type: str
    digest: str
    size: int
    platform: Platform | None = None


def media_type_of(body: bytes, content_type: str) -> str:
    """The document's media type: its own `mediaType`, else the response's Content-Type."""
    declared = _document(body).get("mediaType")
    if isinstance(declared, str) and declared:
        return declared
    return content_type.split(";", 1)[0].strip()


def index_entries(body: bytes) -> list[Descriptor]:
    """The manifests an index lists, with their platforms."""
    entries = _document(body).get("manifests")
    if not isinstance(entries, list):
        raise ManifestError("index without a manifests list")
    return [_descriptor(entry, with_platform=True) for entry in entries]


def manifest_blobs(body: bytes) -> list[Descriptor]:
    """A manifest's config, then its layers."""
    document = _document(body)
    if document.get("schemaVersion") != 2:
        raise ManifestError("only schema version 2 manifests are supported")
    layers = document.get("layers")
    if not isinstance(layers, list):
        raise ManifestError("manifest without a layers list")
    return [_descriptor(document.get("config")), *(_descriptor(layer) for layer in layers)]


def choose(entries: list[Descriptor], platform: Platform) -> Descriptor:
    """The index entry for `platform` (any variant when none is asked for)."""
    for entry in entries:
        p = entry.platform
        if p is None or (p.os, p.architecture) != (platform.os, platform.architecture):
            continue
        if not platform.variant or p.variant == platform.variant:
            return entry
    offered = ", ".join(str(e.platform) for e in entries if e.platform) or "none"
    raise ManifestError(f"no manifest for {platform} in the index (offered: {offered})")


def _document(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise ManifestError("manifest is not JSON") from None
    if not isinstance(document, dict):
        raise ManifestError("manifest is not a JSON object")
    return document


def _descriptor(value: object, *, with_platform: bool = False) -> Descriptor:
    if not isinstance(value, dict):
        raise ManifestError("descriptor is not a JSON object")
    media_type, digest, size = value.get("mediaType"), value.get("digest"), value.get("size")
    if not isinstance(digest, str) or not is_digest(digest):
        raise ManifestError(f"descriptor digest {str(digest)[:80]!r} is not a sha256 digest")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ManifestError(f"descriptor {digest}: invalid size {size!r}")
    platform = None
    raw = value.get("platform")
    if with_platform and isinstance(raw, dict):
        os_, arch = raw.get("os"), raw.get("architecture")
        variant = raw.get("variant") or ""
        if isinstance(os_, str) and isinstance(arch, str) and isinstance(variant, str):
            platform = Platform(os_, arch, variant)
    return Descriptor(media_type if isinstance(media_type, str) else "", digest, size, platform)
