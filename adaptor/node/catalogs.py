"""The node's catalog follows its file: with --catalog-dir (e.g. the volume the catalog refresh
CronJob writes, config/catalog-refresh), a catalog rewritten while `serve` runs is used from the
next StartVM on, without a restart. The reloader's own `CatalogLoader` keeps the snapshot by the
file's mtime and size, so a check is one stat when nothing changed; a file that fails to load
keeps the catalog in use."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from adaptor.planning.placement import Placement
from adaptor.runtime.periodic import OwnedTask
from providers.core.catalog import Catalog
from providers.core.errors import PeerpodsError
from providers.core.snapshots import CatalogLoader

log = logging.getLogger(__name__)


class CatalogReloader:
    """Swaps the placement's catalog when its snapshot file changes."""

    def __init__(
        self,
        placement: Placement,
        cloud: str,
        region: str,
        catalog_dir: Path,
        interval_seconds: float = 60.0,
    ) -> None:
        self.placement = placement
        self.cloud = cloud
        self.region = region
        self.catalog_dir = catalog_dir
        self.interval_seconds = interval_seconds
        self.reloads = 0
        self._loader = CatalogLoader(catalog_dir)
        self._seen: Catalog | None = None  # the loader's catalog the last check saw
        self._task = OwnedTask("catalog-reload")

    def check(self) -> bool:
        """Load the snapshot (kept while unchanged); True when the placement got a new one.
        Blocking file IO."""
        try:
            catalog = self._loader.snapshot(self.cloud, self.region)
        except PeerpodsError as exc:
            log.warning("catalog not reloaded, the one in use stays: %s", exc)
            return False
        if catalog is self._seen:
            return False
        self._seen = catalog
        if catalog == self.placement.catalog:  # the file the placement's catalog came from
            return False
        self.placement.catalog = catalog
        self.reloads += 1
        log.info(
            "catalog of %s %s reloaded from %s (%d types)",
            self.cloud,
            self.region,
            self.catalog_dir,
            len(catalog.types),
        )
        return True

    def start(self) -> None:
        self._task.start(self._loop)

    async def stop(self) -> None:
        await self._task.stop()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_seconds)
            await asyncio.to_thread(self.check)
