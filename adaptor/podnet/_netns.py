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
from collections.abc import Iterator
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netns import setns
from pyroute2.nftables.main import NFTables

from adaptor.podnet._errors import BadNetns, NetnsGone, PodNetError

# ioctl(2) on a namespace file: which kind of namespace it is (linux/nsfs.h).
NS_GET_NSTYPE = 0xB703
CLONE_NEWNET = 0x40000000
_OWN = "/proc/thread-self/ns/net"


def check_netns(path: str) -> None:
    """BadNetns unless `path` is a network namespace file (a bind mount of nsfs)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BadNetns(f"network namespace {path} does not exist") from None
    except OSError as exc:
        raise BadNetns(f"network namespace {path} cannot be opened: {exc.strerror}") from None
    try:
        kind = fcntl.ioctl(fd, NS_GET_NSTYPE)
    except OSError as exc:
        if exc.errno in (errno.ENOTTY, errno.EINVAL):
            raise BadNetns(f"{path} is not a network namespace") from None
        raise BadNetns(f"{path}: cannot read its namespace type: {exc.strerror}") from None
    finally:
        os.close(fd)
    if kind != CLONE_NEWNET:
        raise BadNetns(f"{path} is a namespace, but not a network namespace")


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
    try:
        target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NetnsGone(f"network namespace {path} does not exist") from None
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
