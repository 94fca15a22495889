"""Suite-wide guards: nothing in the tests may dial a non-loopback address.

moto and the fake clouds hand out private addresses (10.x); a Python audit hook refuses any
`socket.connect` to an address that is not loopback, and the test that tried it fails even if the
code under test swallowed the error.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

_violations: list[str] = []
# Networks that exist only inside network namespaces a test built (tests/podnet): reaching them
# never leaves this machine.
_namespaced: set[ipaddress.IPv4Network] = set()


def allow_addresses(*networks: str) -> None:
    """Let tests connect to addresses of `networks`, which live in namespaces they created."""
    _namespaced.update(ipaddress.IPv4Network(n) for n in networks)


def forbid_namespaced_addresses() -> None:
    """Undo `allow_addresses` once the namespaces are gone."""
    _namespaced.clear()


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False  # a hostname other than localhost: never resolved in tests
    return address.is_loopback or any(address in n for n in _namespaced)


def _guard(event: str, args: tuple[Any, ...]) -> None:
    if event not in ("socket.connect", "socket.getaddrinfo"):
        return
    if event == "socket.connect":
        address = args[1]
        if not isinstance(address, tuple):
            return  # unix sockets
        host = str(address[0])
    else:
        host = str(args[0]) if args[0] is not None else ""
    if not _is_loopback(host):
        _violations.append(f"{event} to {host!r}")
        raise ConnectionRefusedError(f"test guard: refusing non-loopback address {host!r}")


sys.addaudithook(_guard)

# The real-peers suite (tests/peers) runs only when it is asked for: it needs prebuilt binaries
# of Kata, containerd and Kubernetes that the default test command does not have.
collect_ignore = [] if os.environ.get("PEERPODS_PEERS_DIR") else ["peers"]


@pytest.fixture(autouse=True)
def _no_remote_connections() -> Iterator[None]:
    start = len(_violations)
    yield
    tried = _violations[start:]
    assert not tried, f"code under test tried to reach non-loopback addresses: {tried}"
