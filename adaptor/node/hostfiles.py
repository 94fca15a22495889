"""Files on the host as the node installer writes them: atomically, with the mode and owner of
the file they replace (a 0600 containerd configuration stays 0600), never through a link out of
the host root, and with every directory made on the way noted for uninstall."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from adaptor.node.hostpath import HostPathError, inside, resolve


@dataclass(frozen=True)
class Owner:
    """Mode bits and owner of a file."""

    mode: int
    uid: int
    gid: int

    @classmethod
    def of(cls, path: Path) -> Owner:
        found = os.stat(path)
        return cls(stat.S_IMODE(found.st_mode), found.st_uid, found.st_gid)


# New files: owned by whoever runs the installer (root on a node; -1 leaves fchown a no-op)
ROOT_0644 = Owner(0o644, -1, -1)
ROOT_0600 = Owner(0o600, -1, -1)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class HostFiles:
    """Reads and writes host paths under one host root."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def real(self, path: PurePosixPath) -> Path:
        """Where the host path is, links followed inside the root."""
        found = resolve(self.root, path)
        if not inside(self.root, found):  # resolve never leaves it; a last guard
            raise HostPathError(f"{path} leads outside the host root")
        return found

    def host_name(self, real: Path) -> str:
        return str(PurePosixPath("/") / real.relative_to(self.root))

    def read(self, path: PurePosixPath) -> bytes | None:
        """The file's content, None when it does not exist."""
        real = self.real(path)
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise HostPathError(f"{path} is not a regular file")
            return file.read()

    def owner(self, path: PurePosixPath) -> Owner | None:
        try:
            return Owner.of(self.real(path))
        except FileNotFoundError:
            return None

    def write(
        self, path: PurePosixPath, data: bytes, owner: Owner, created: list[str], private: bool
    ) -> None:
        """Replace the file (its link, if it is one, stays and points at the new content)."""
        real = self.real(path)
        self._directories(real.parent, created, 0o700 if private else 0o755)
        temporary = real.with_name(f".{real.name}.peerpods")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        fd = os.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                os.fchown(file.fileno(), owner.uid, owner.gid)
                os.fchmod(file.fileno(), owner.mode)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, real)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise

    def _directories(self, real: Path, created: list[str], mode: int) -> None:
        missing: list[Path] = []
        parent = real
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        for directory in reversed(missing):
            own = mode if directory == real else 0o755  # only the file's own folder is private
            directory.mkdir(mode=own)
            os.chmod(directory, own)  # whatever the umask
            created.append(self.host_name(directory))

    def remove(self, path: PurePosixPath) -> None:
        os.unlink(self.real(path))

    def remove_directory(self, path: PurePosixPath) -> bool:
        """rmdir: False when something else lives there now."""
        try:
            os.rmdir(self.real(path))
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True
