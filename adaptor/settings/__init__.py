"""The node daemon's setting sections, declared once (see `providers.core.settings`).

Each lower layer's sub-config is built from its section here (`ManagerConfig`,
`PodNetSettings`, the CDI config), and `adaptor.node.settings.ServeSettings` composes them;
the `serve` flags, their env twins and the configuration reference derive from the same fields.
"""

from adaptor.settings._cdi import CdiNames, CdiSettings
from adaptor.settings._podnet import PodNetworkSettings
from adaptor.settings._sandbox import ReclaimSettings, SandboxSettings
from adaptor.settings._tls import AgentTls
from adaptor.settings._warmpool import WarmPoolList, WarmPoolSettings, parse_pool

__all__ = [
    "AgentTls",
    "CdiNames",
    "CdiSettings",
    "PodNetworkSettings",
    "ReclaimSettings",
    "SandboxSettings",
    "WarmPoolList",
    "WarmPoolSettings",
    "parse_pool",
]
