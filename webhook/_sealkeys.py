"""The contract seal's keys, from a Secret of their own (never from the TLS key, which
cert-manager rotates on every renewal: a pod sealed under the old key would no longer be
recognised, and its re-invocation would be translated again from resources it no longer has).

The Secret is mounted as a directory (`--seal-key-dir`): the file `current` is the key new seals
are made with; every other file is a key still accepted (a previous key during a rotation, or
the next one before it becomes current). A rotation that never strands a replica (each step
followed by `kubectl rollout restart deployment/peerpods-webhook`, docs/install.md):

1. add the new key as `next`: every replica accepts it, none seals with it yet;
2. make it `current` and keep the old one as `previous`: both are accepted everywhere;
3. once the pods sealed under `previous` are gone (or updated: an update re-seals under the
   current key), remove `previous`.

A key file holds at least 32 bytes (e.g. `head -c 32 /dev/urandom | base64`); the key used is
a SHA-256 of it under a fixed label, so any text of that length works.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from providers.core.errors import PeerpodsError

CURRENT = "current"
MIN_BYTES = 32


class SealKeyError(PeerpodsError):
    """The seal keys cannot be read, or one is too short."""


@dataclass(frozen=True)
class SealKeys:
    """The key new seals are made with, and the others still accepted."""

    current: bytes = field(repr=False)
    accepted: tuple[bytes, ...] = field(default=(), repr=False)


def derive(material: bytes) -> bytes:
    """The seal key of a key file's content."""
    return hashlib.sha256(b"peerpods contract seal\0" + material).digest()


def _read(path: Path) -> bytes:
    try:
        material = path.read_bytes().strip()
    except OSError as exc:
        raise SealKeyError(f"cannot read seal key {path}: {exc.strerror or exc}") from None
    if len(material) < MIN_BYTES:
        raise SealKeyError(
            f"seal key {path} holds {len(material)} bytes, fewer than {MIN_BYTES} "
            "(make one with: head -c 32 /dev/urandom | base64)"
        )
    return derive(material)


def load_seal_keys(directory: Path) -> SealKeys:
    """The keys of a mounted Secret (Kubernetes' own `..data` entries are skipped)."""
    current = directory / CURRENT
    if not current.is_file():
        raise SealKeyError(
            f"no contract-seal key at {current}: create the Secret peerpods-webhook-seal with a "
            "`current` key (docs/install.md); the webhook never derives one from its TLS key"
        )
    accepted = []
    for path in sorted(directory.iterdir()):
        if path.name == CURRENT or path.name.startswith(".") or not path.is_file():
            continue
        accepted.append(_read(path))
    key = _read(current)
    return SealKeys(key, tuple(k for k in dict.fromkeys(accepted) if k != key))
