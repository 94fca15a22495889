"""The daemon's warm pools, built over its provider, store and placement in use."""

from __future__ import annotations

from adaptor.node.catalogs import PlacementInUse
from adaptor.planning.placement import allowed
from adaptor.settings import WarmPoolSettings
from adaptor.state import StateStore
from adaptor.warmpool import PoolRecord, Sources, WarmConfig, WarmPool
from providers.core.base import Provider
from providers.core.errors import InvalidRequest
from providers.core.warm import WarmCapable


def warm_pool_for(
    settings: WarmPoolSettings, provider: Provider, store: StateStore, placement: PlacementInUse
) -> WarmPool | None:
    """The warm pools `serve` keeps (None when none is configured). A provider that cannot
    keep stopped VMs (static, local) is refused with a clear error, before anything runs."""
    config = WarmConfig.of(settings, provider.zones)
    if not config.pools:
        return None
    if not isinstance(provider, WarmCapable):
        raise InvalidRequest(
            f"--warm-pool: the {provider.name} provider cannot keep stopped VMs "
            "(warm pools need aws, azure or gcp)"
        )
    config_of = getattr(provider, "config", None)
    image = str(getattr(config_of, "image_id", "") or getattr(config_of, "image", "") or "")
    patterns = tuple(provider.allowed_types)
    return WarmPool(
        provider,
        PoolRecord(store),
        config,
        default_image=image,
        zones=tuple(provider.zones),
        sources=Sources(
            catalog=lambda: placement.current.catalog,
            account_quota=lambda: placement.current.account_quota,
            allowed=lambda name: allowed(name, patterns),
        ),
    )
