"""A comparable listing of a netns: links, addresses, routes, qdiscs, filters, nf_tables rules."""

from __future__ import annotations

import socket
from typing import Any

from adaptor.podnet import _netns


def _clean(msg: Any, *attrs: str) -> tuple[Any, ...]:
    return tuple(msg.get_attr(a) for a in attrs)


def snapshot(ns: str | None) -> dict[str, Any]:
    """What a test must leave as it found it (None: this thread's own netns)."""
    with _netns.iproute(ns) as ipr:
        links = sorted(
            (int(li["index"]), li.get_attr("IFLA_IFNAME"), li.get_attr("IFLA_MTU"))
            for li in ipr.get_links()
        )
        addrs = sorted(
            (int(a["index"]), a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.get_addr()
        )
        routes = sorted(
            (
                r["family"],
                r["dst_len"],
                str(_clean(r, "RTA_DST", "RTA_GATEWAY", "RTA_OIF", "RTA_TABLE")),
            )
            for r in ipr.get_routes(family=socket.AF_INET)
        )
        qdiscs = sorted(
            (int(q["index"]), q["handle"], q["parent"], q.get_attr("TCA_KIND"))
            for q in ipr.get_qdiscs()
        )
        filters = sorted(
            (int(f["index"]), f["parent"], f["info"], str(f.get_attr("TCA_KIND")))
            for _i, _name, _mtu in links
            for f in ipr.get_filters(index=_i, parent=0xFFFF0000)
        )
        rules = sorted(str(_clean(r, "FRA_TABLE", "FRA_PRIORITY")) for r in ipr.get_rules())
    with _netns.nftables(ns) as nft:
        tables = sorted(str(t.get_attr("NFTA_TABLE_NAME")) for t in nft.get_tables())
        chains = sorted(
            (str(c.get_attr("NFTA_CHAIN_TABLE")), str(c.get_attr("NFTA_CHAIN_NAME")))
            for c in nft.get_chains()
        )
        nft_rules = sorted(
            (
                str(r.get_attr("NFTA_RULE_CHAIN")),
                str(r.get_attr("NFTA_RULE_USERDATA")),
                len(r.get_attr("NFTA_RULE_EXPRESSIONS") or ()),
            )
            for r in nft.get_rules()
        )
    return {
        "links": links,
        "addresses": addrs,
        "routes": routes,
        "qdiscs": qdiscs,
        "filters": filters,
        "rules": rules,
        "nft_tables": tables,
        "nft_chains": chains,
        "nft_rules": nft_rules,
    }
