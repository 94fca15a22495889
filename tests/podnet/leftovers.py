"""Counting tunnel parts left in namespaces (test and benchmark code): after every sandbox is
gone, each count must be 0."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable

from adaptor.podnet import _netns, _nl, _notrack


def kernel_leftovers(worker: str, pods: Iterable[str]) -> dict[str, int]:
    """VXLAN devices, ingress qdiscs and u32 redirects in the pods' netns (and the worker's),
    and NOTRACK set elements (and per-pod rules) with a peerpod comment in the worker's."""
    counts = {"vxlan devices": 0, "ingress qdiscs": 0, "u32 redirects": 0, "NOTRACK elements": 0}
    for ns in (worker, *pods):
        if not os.path.exists(ns):
            continue
        with _netns.entered(ns):
            sock = _nl.Netlink(_nl.NETLINK_ROUTE)
        with sock:
            counts["vxlan devices"] += sum(
                1 for p in sock.get(_nl.links_get()) if _nl.vxlan_of(p) is not None
            )
            for index, kind in map(_nl.tc_kind, sock.get(_nl.qdiscs_get())):
                if kind != "ingress":
                    continue
                counts["ingress qdiscs"] += 1
                for payload in sock.get(_nl.ingress_filters_get(index)):
                    if _nl.redirect_of(payload) is not None:
                        counts["u32 redirects"] += 1
    with _netns.nftables(worker) as nft:
        for _base, _hook, ours, _which in _notrack.CHAINS:
            for rule in _notrack.rules_in(nft, ours):
                if str(rule.get_attr("NFTA_RULE_USERDATA") or "").startswith("peerpod [vni:"):
                    counts["NOTRACK elements"] += 1
    with _netns.entered(worker):
        nft_sock = _nl.Netlink(_nl.NETLINK_NETFILTER)  # not the module's kept one: closed here
    with nft_sock:
        try:
            replies = nft_sock.get(_nl.elements_get(_notrack.TABLE, _notrack.SET))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            replies = []
    for payload in replies:
        for _key, text in _nl.elements_of(payload):
            counts["NOTRACK elements"] += len(_notrack.owners(text) or ())
    return counts


def nothing_left(counts: dict[str, int]) -> bool:
    return not any(counts.values())
