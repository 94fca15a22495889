"""Network namespaces: checking a path is one, and opening netlink sockets inside one.

A netlink socket belongs to the namespace it was created in. To get one for another namespace,
the calling thread enters it (setns(2) changes only the calling thread's namespace), creates the
socket and returns at once. Only worker threads do this, never the event loop's thread, and the
thread is always back in its own namespace when the call returns.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator, Sequence
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netns import setns
from pyroute2.nftables.main import NFTables

from adaptor.podnet._errors import BadNetns, NetnsGone, PodNetError

# ioctl(2) on a namespace file: which kind of namespace it is (linux/nsfs.h).
NS_GET_NSTYPE = 0xB703
CLONE_NEWNET = 0x40000000
_OWN = "/proc/thread-self/ns/net"
# Where the CRI puts pod network namespaces (CreateVM's path must name a file directly inside).
NETNS_DIRS = ("/run/netns", "/var/run/netns")
# Network namespaces that are never a pod's: this process's, its thread's, the host's (pid 1).
_NOT_PODS = {
    "/proc/self/ns/net": "the adaptor's own",
    _OWN: "the adaptor's own",
    "/proc/1/ns/net": "the host's",
}


def _nsfs_device() -> int:
    """The device number every namespace file shares (nsfs is one internal filesystem)."""
    return os.stat(_OWN).st_dev


def _open_path(path: str, dirs: Sequence[str] | None) -> int:
    """An O_PATH descriptor for `path`: it opens nothing (a FIFO or device cannot block or
    react). With `dirs`, `path` must be a name directly in one of them and is not followed
    when it is a symbolic link."""
    if "\0" in path:
        raise BadNetns("network namespace path contains a NUL byte")
    if dirs is None:
        try:
            return os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NetnsGone(f"network namespace {path} does not exist") from None
        except OSError as exc:
            raise BadNetns(f"network namespace {path} cannot be opened: {exc.strerror}") from None
    parent, name = os.path.split(path)
    allowed = {d.rstrip("/") or "/" for d in dirs}
    if not os.path.isabs(path) or name in ("", ".", "..") or parent not in allowed:
        raise BadNetns(
            f"network namespace {path} is not a file directly in {' or '.join(sorted(allowed))}"
        )
    try:
        directory = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
        finally:
            os.close(directory)
    except FileNotFoundError:
        raise BadNetns(f"network namespace {path} does not exist") from None
    except OSError as exc:
        raise BadNetns(f"network namespace {path} cannot be opened: {exc.strerror}") from None


def open_netns(path: str, dirs: Sequence[str] | None = None) -> int:
    """A read-only descriptor of the network namespace at `path`; BadNetns for anything else.

    Only an nsfs file is ever opened for reading (checked on an O_PATH descriptor first), so
    no path can block the calling thread. `dirs`: see `_open_path`.
    """
    handle = _open_path(path, dirs)
    try:
        info = os.fstat(handle)
        if stat.S_ISLNK(info.st_mode):
            raise BadNetns(f"network namespace {path} is a symbolic link")
        if not stat.S_ISREG(info.st_mode) or info.st_dev != _nsfs_device():
            raise BadNetns(f"{path} is not a network namespace")
        fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(handle)
    try:
        kind = fcntl.ioctl(fd, NS_GET_NSTYPE)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.ENOTTY, errno.EINVAL):
            raise BadNetns(f"{path} is not a network namespace") from None
        raise BadNetns(f"{path}: cannot read its namespace type: {exc.strerror}") from None
    if kind != CLONE_NEWNET:
        os.close(fd)
        raise BadNetns(f"{path} is a namespace, but not a network namespace")
    return fd


def check_netns(path: str) -> None:
    """BadNetns unless `path` is a network namespace file (a bind mount of nsfs)."""
    try:
        os.close(open_netns(path))
    except NetnsGone as exc:
        raise BadNetns(str(exc)) from None


def check_pod_netns(
    path: str, dirs: Sequence[str] = NETNS_DIRS, host_netns: str | None = None
) -> None:
    """BadNetns unless `path` is a network namespace file directly in `dirs` that is not the
    adaptor's own, the host's, or the worker's (`host_netns`): the tunnel redirects the pod's
    interface, which in any of those would cut the node off. Namespaces are compared by device
    and inode, whatever path names them."""
    fd = open_netns(path, dirs)
    try:
        mine = os.fstat(fd)
    finally:
        os.close(fd)
    others = dict(_NOT_PODS)
    if host_netns is not None:
        others[host_netns] = "the worker's"
    for other, whose in others.items():
        try:
            info = os.stat(other)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) == (mine.st_dev, mine.st_ino):
            raise BadNetns(f"{path} is {whose} network namespace, not a pod's")


def netns_exists(path: str) -> bool:
    """Whether `path` still names a network namespace."""
    try:
        check_netns(path)
    except BadNetns:
        return False
    return True


@contextlib.contextmanager
def entered(path: str | None) -> Iterator[None]:
    """Run the block with the calling thread inside the netns at `path` (None: stay)."""
    if path is None:
        yield
        return
    target = open_netns(path)
    own = os.open(_OWN, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            setns(target)
        except OSError as exc:
            raise PodNetError(f"cannot enter network namespace {path}: {exc}") from None
        try:
            yield
        finally:
            # Failing to return would leave this thread in the pod's namespace: nothing sane
            # can follow, so it surfaces as an error no caller catches as a pod problem.
            setns(own)
    finally:
        os.close(target)
        os.close(own)


def iproute(path: str | None) -> Any:
    """An rtnetlink socket in the netns at `path` (None: this thread's own)."""
    with entered(path):
        return IPRoute()


def nftables(path: str | None) -> Any:
    """An nf_tables socket (family ip) in the netns at `path` (None: this thread's own)."""
    with entered(path):
        return NFTables(nfgen_family=2)
