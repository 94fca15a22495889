"""The test topology itself: its underlay bridge stands for a cloud network, which runs no host's
netfilter on what it carries; the worker's CNI bridge keeps the host's setting."""

from __future__ import annotations

import os

import pytest

from tests.podnet.topology import BRIDGE_NF, Topology, bridge_netfilter, path


def _setting(ns: str, name: str) -> str:
    from adaptor.podnet import _netns

    with _netns.entered(ns), open(f"/proc/sys/net/bridge/{name}") as f:
        return f.read().strip()


def test_underlay_bridge_skips_netfilter_and_worker_keeps_it(topo: Topology) -> None:
    if not os.path.exists("/proc/sys/net/bridge"):
        pytest.skip("br_netfilter is not loaded: no bridge passes frames to netfilter")
    underlay = path(topo.ns("U"))
    assert [_setting(underlay, n) for n in BRIDGE_NF] == ["0"] * 3
    assert _setting(topo.worker, BRIDGE_NF[0]) == "1"
    assert bridge_netfilter(underlay, True) is False
    assert [_setting(underlay, n) for n in BRIDGE_NF] == ["1"] * 3
    assert bridge_netfilter(underlay, False) is True
