"""Host paths as the host sees them, reached from a container that mounts the host at a root
(`--host-root`): symbolic links are followed as a chroot into that root would follow them, so an
absolute link names a path under the root, `..` stops at the root, and nothing the installer
reads, writes or deletes can lie outside it."""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from providers.core.errors import PeerpodsError

MAX_LINKS = 40  # as Linux's path walk


class HostPathError(PeerpodsError):
    """A host path that cannot be reached inside the host root (a link loop, a bad path)."""


def host_path(value: object) -> PurePosixPath:
    """A host path from a record or a setting: absolute, no '..', no NUL; else HostPathError."""
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        raise HostPathError(f"{value!r} is not an absolute host path")
    path = PurePosixPath(value)
    if ".." in path.parts:
        raise HostPathError(f"{value} has '..' in it")
    return path


def resolve(root: Path, path: PurePosixPath) -> Path:
    """Where `path` of the host is under `root`, every link in it followed inside `root`.

    A missing component ends the walk (the rest is taken as written: it is about to be made).
    """
    parts = [p for p in path.parts[1:] if p not in ("", ".")]
    done: list[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = root.joinpath(*done, part)
        try:
            mode = os.lstat(candidate).st_mode
        except FileNotFoundError:
            done.append(part)
            done.extend(p for p in parts if p not in ("", "."))
            if ".." in done:
                raise HostPathError(f"{path}: '..' below a missing directory") from None
            break
        except OSError as exc:
            raise HostPathError(f"{path}: {exc.strerror}") from None
        if not stat.S_ISLNK(mode):
            done.append(part)
            continue
        links += 1
        if links > MAX_LINKS:
            raise HostPathError(f"{path}: too many levels of symbolic links")
        target = os.readlink(candidate)
        if target.startswith("/"):
            done = []
        parts = [p for p in target.split("/") if p not in ("", ".")] + parts
    return root.joinpath(*done)


def inside(root: Path, path: Path) -> bool:
    """Whether `path` (already resolved) lies under `root`."""
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True
