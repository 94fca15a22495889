"""Catalog loaders: each cloud's live listing turned into a `providers.core.catalog.Catalog`.

One module per cloud, each with `load_catalog(region, *, client=None, progress=None)`. A module,
and its SDK, is imported only when its cloud is asked for, so `aws` works without the Azure SDK
installed. Loaders block (SDK calls): callers in an event loop use `asyncio.to_thread`.
"""

from __future__ import annotations

import importlib
from typing import Any

from providers.clouds.loaders._common import Progress, import_sdk, no_progress, report
from providers.core.catalog import Catalog
from providers.core.errors import InvalidRequest

__all__ = ["LOADERS", "Progress", "import_sdk", "load", "no_progress", "report"]

LOADERS: dict[str, str] = {
    "aws": "providers.clouds.loaders.aws",
    "azure": "providers.clouds.loaders.azure",
    "gcp": "providers.clouds.loaders.gcp",
}


def load(cloud: str, region: str, **kwargs: Any) -> Catalog:
    """Load the live catalog of `cloud` in `region` (keyword arguments go to the loader)."""
    module_name = LOADERS.get(cloud)
    if module_name is None:
        raise InvalidRequest(
            f"no catalog loader for provider {cloud!r} (known: {', '.join(sorted(LOADERS))})"
        )
    module = importlib.import_module(module_name)
    catalog: Catalog = module.load_catalog(region, **kwargs)
    return catalog
