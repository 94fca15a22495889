"""Pod network tests run on the real kernel in namespaces they create; they need CAP_NET_ADMIN.

Without it they skip, except under CI=true, where a skip would hide that CI never ran them: there
they fail. Every test also checks that the root netns (links, addresses, routes, qdiscs, rules,
nf_tables) is exactly as it was.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from adaptor.podnet import _notrack
from tests.podnet.snapshot import snapshot
from tests.podnet.topology import Topology


def _can_admin_net() -> str:
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) for network namespaces"
    try:
        from pyroute2 import netns  # noqa: F401
    except ImportError:
        return "pyroute2 is not installed"
    return ""


@pytest.fixture(autouse=True)
def _net_admin() -> None:
    reason = _can_admin_net()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"pod network tests must run in CI: {reason}")
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def _root_netns_unchanged(_net_admin: None) -> Iterator[None]:
    before = snapshot(None)
    yield
    assert snapshot(None) == before, "the root network namespace changed"


@pytest.fixture
def topo() -> Iterator[Topology]:
    topology = Topology().build()
    try:
        yield topology
    finally:
        # a cached nf_tables socket would keep the worker's netns alive after it is deleted
        _notrack.close_sockets()
        topology.close()
