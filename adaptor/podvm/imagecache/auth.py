"""Registry credentials and challenges: a docker-style auth.json, and WWW-Authenticate headers.

The auth file is what cloud-api-adaptor writes to /run/peerpod/auth.json from the pod's image
pull secrets: `{"auths": {"<registry>": {"auth": base64("user:password")}}}` (or `username` and
`password`), keyed by host or by URL (`https://index.docker.io/v1/` for Docker Hub).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from adaptor.podvm.imagecache.reference import DOCKER_HUB, DOCKER_HUB_API
from providers.core.errors import InvalidRequest

MAX_AUTH_FILE_BYTES = 1 << 20
_HUB_KEYS = (DOCKER_HUB, DOCKER_HUB_API, "index.docker.io")
_PARAM = re.compile(r'\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,"]*))\s*,?')


class AuthFileError(InvalidRequest):
    """An auth file that cannot be read or is not docker's format."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def basic(self) -> str:
        """The value of an Authorization header carrying these credentials."""
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return f"Basic {token}"


@dataclass(frozen=True)
class Challenge:
    """A registry's WWW-Authenticate: its scheme (bearer or basic) and parameters."""

    scheme: str
    params: Mapping[str, str]


def parse_challenge(header: str) -> Challenge | None:
    """The first challenge of a WWW-Authenticate header; None when it cannot be read."""
    scheme, _, rest = header.strip().partition(" ")
    if not scheme.isalpha():
        return None
    params: dict[str, str] = {}
    position = 0
    while position < len(rest):
        match = _PARAM.match(rest, position)
        if match is None or match.end() == position:
            break
        quoted, bare = match.group(2), match.group(3)
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare or ""
        params[match.group(1).lower()] = value
        position = match.end()
    return Challenge(scheme.lower(), params)


def load_auth_file(path: Path) -> dict[str, Credentials]:
    """Credentials by registry name (Docker Hub's under `docker.io`)."""
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_AUTH_FILE_BYTES + 1)
    except OSError as exc:
        raise AuthFileError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_AUTH_FILE_BYTES:
        raise AuthFileError(f"{path}: larger than {MAX_AUTH_FILE_BYTES} bytes")
    try:
        document = json.loads(data)
    except ValueError:
        raise AuthFileError(f"{path}: not JSON") from None
    auths = document.get("auths") if isinstance(document, dict) else None
    if not isinstance(auths, dict):
        raise AuthFileError(f'{path}: no "auths" object (docker config format)')
    found: dict[str, Credentials] = {}
    for name, entry in auths.items():
        credentials = _credentials(entry)
        if credentials is None:
            raise AuthFileError(f"{path}: the entry for {name!r} has no usable credentials")
        found[_registry_of(str(name))] = credentials
    return found


def _credentials(entry: object) -> Credentials | None:
    if not isinstance(entry, dict):
        return None
    encoded = entry.get("auth")
    if isinstance(encoded, str) and encoded:
        try:
            username, sep, password = (
                base64.b64decode(encoded, validate=True).decode().partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            return None
        return Credentials(username, password) if sep and username else None
    user, secret = entry.get("username"), entry.get("password")
    if isinstance(user, str) and user and isinstance(secret, str):
        return Credentials(user, secret)
    return None


def _registry_of(key: str) -> str:
    """`https://index.docker.io/v1/` -> docker.io; `quay.io` -> quay.io."""
    host = urlsplit(key).netloc if "://" in key else key.split("/", 1)[0]
    return DOCKER_HUB if host in _HUB_KEYS else host
