"""Image references as Docker reads them, so a listed image names what the pod's would.

`busybox` is `docker.io/library/busybox:latest`; the first component is a registry only when it
looks like a host (a dot, a port or `localhost`). Docker Hub's API host is not its name:
`registry-1.docker.io` and `index.docker.io` are read as `docker.io`, and `api_host` gives the
host to dial.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from providers.core.errors import InvalidRequest

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
_HUB_ALIASES = frozenset({DOCKER_HUB, DOCKER_HUB_API, "index.docker.io"})
_MAX_LENGTH = 4 << 10

# The distribution project's reference grammar (reference/regexp.go), as facts.
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*", re.ASCII)
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", re.ASCII)
_DIGEST = re.compile(r"sha256:[a-f0-9]{64}", re.ASCII)
_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"(?::[0-9]{1,5})?",
    re.ASCII,
)


class ImageReferenceError(InvalidRequest):
    """Text that is not an image reference."""


def is_digest(text: str) -> bool:
    """A sha256 digest as registries write them (the only algorithm the store keeps)."""
    return _DIGEST.fullmatch(text) is not None


def is_tag(text: str) -> bool:
    return _TAG.fullmatch(text) is not None


def is_repository(text: str) -> bool:
    """A repository path: lower-case components joined by `/`, never `.` or `..`."""
    return len(text) <= 255 and all(_COMPONENT.fullmatch(part) for part in text.split("/"))


def is_registry(text: str) -> bool:
    """A registry host, with its port if any."""
    return len(text) <= 255 and _HOST.fullmatch(text) is not None


def api_host(registry: str) -> str:
    """The host that serves a registry's API (Docker Hub's is not `docker.io`)."""
    return DOCKER_HUB_API if registry == DOCKER_HUB else registry


@dataclass(frozen=True)
class ImageReference:
    """One image: where it lives, and the tag or digest that picks it."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def reference(self) -> str:
        """What the manifest is fetched by: the digest when there is one, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse(text: str) -> ImageReference:
    """Read `text` as Docker does; `ImageReferenceError` names what is wrong."""
    if not text or len(text) > _MAX_LENGTH or text != text.strip():
        raise ImageReferenceError(f"invalid image reference {text[:80]!r}")
    name, digest = text, None
    if "@" in name:
        name, digest = name.split("@", 1)
        if not is_digest(digest):
            raise ImageReferenceError(f"{text}: invalid digest {digest!r} (sha256:<64 hex>)")
    tag = None
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
        if not is_tag(tag):
            raise ImageReferenceError(f"{text}: invalid tag {tag!r}")
    registry, repository = _split_registry(name)
    if not is_registry(registry):
        raise ImageReferenceError(f"{text}: invalid registry {registry!r}")
    if not is_repository(repository):
        raise ImageReferenceError(
            f"{text}: invalid repository {repository!r} (lower-case letters, digits, "
            "separators . _ - between them, components joined by /)"
        )
    if tag is None and digest is None:
        tag = "latest"
    return ImageReference(registry, repository, tag, digest)


def _split_registry(name: str) -> tuple[str, str]:
    """(registry, repository): the first component is a registry only when it looks like a host."""
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        if first.lower() not in _HUB_ALIASES:
            return first, rest
        name = rest
    if "/" not in name:
        name = f"library/{name}"
    return DOCKER_HUB, name
