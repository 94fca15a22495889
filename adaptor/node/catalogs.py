"""The node's catalog follows its file: with --catalog-dir (e.g. the volume the catalog refresh
CronJob writes, config/catalog-refresh), a catalog rewritten while `serve` runs is used from the
next StartVM on, without a restart. The reloader's own `CatalogLoader` keeps the snapshot by the
file's mtime and size, so a check is one stat when nothing changed; a file that fails to load
keeps the catalog in use, and is retried at every check (whatever the error: a symlink loop,
ESTALE on NFS) while /readyz says why, until it loads again.

A placement is never changed: a new catalog gives a new placement (sharing the quota pool and
the account's quotas of the one before), put in the daemon's `PlacementInUse`. A StartVM plans
with the placement in use when its plan begins, so it sees one catalog from start to end."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

from adaptor.planning.placement import Placement, Plan
from adaptor.runtime.periodic import OwnedTask
from providers.core.catalog import Catalog
from providers.core.contract import VMIntent
from providers.core.errors import PeerpodsError
from providers.core.snapshots import CatalogLoader

log = logging.getLogger(__name__)


class PlacementInUse:
    """The placement StartVM plans with now (the sandbox manager's planner): the one the daemon
    built, until a catalog reload puts a new one in its place."""

    def __init__(self, placement: Placement) -> None:
        self._placement = placement

    @property
    def current(self) -> Placement:
        return self._placement

    def put(self, placement: Placement) -> None:
        """Plans begun from now on use `placement` (one reference swap: safe from a thread)."""
        self._placement = placement

    async def plan(self, intent: VMIntent, sandbox_id: str) -> Plan:
        """The plan of the placement in use as it begins (see `Placement.plan`)."""
        return await self._placement.plan(intent, sandbox_id)

    def release(self, sandbox_id: str) -> None:
        """Forget the sandbox's reservation (every placement in turn shares one quota pool)."""
        self._placement.release(sandbox_id)


class CatalogReloader:
    """Puts a placement over the new catalog in use when the snapshot file changes."""

    def __init__(
        self,
        placements: PlacementInUse,
        cloud: str,
        region: str,
        catalog_dir: Path,
        interval_seconds: float = 60.0,
    ) -> None:
        self.placements = placements
        self.cloud = cloud
        self.region = region
        self.catalog_dir = catalog_dir
        self.interval_seconds = interval_seconds
        self.reloads = 0
        self.problem: str | None = None  # why the last check could not load the file
        self._loader = CatalogLoader(catalog_dir)
        self._seen: Catalog | None = None  # the loader's catalog the last check saw
        self._task = OwnedTask("catalog-reload")

    def check(self) -> bool:
        """Load the snapshot (kept while unchanged); True when a placement over a new one is in
        use. Blocking file IO, and the new catalog's selection index is built here, not by the
        first StartVM that follows."""
        try:
            catalog = self._loader.snapshot(self.cloud, self.region)
        except PeerpodsError as exc:
            self._failed(str(exc))
            return False
        except OSError as exc:  # a symlink loop, ESTALE on NFS: retried at the next check
            self._failed(f"{self.catalog_dir}: {exc.strerror or exc}")
            return False
        if self.problem is not None:
            log.info("catalog of %s %s readable again", self.cloud, self.region)
            self.problem = None
        if catalog is self._seen:
            return False
        self._seen = catalog
        in_use = self.placements.current
        if catalog == in_use.catalog:  # the file the placement's catalog came from
            return False
        placement = replace(in_use, catalog=catalog)
        placement.selector  # noqa: B018 - built off the event loop, before any StartVM uses it
        self.placements.put(placement)
        self.reloads += 1
        log.info(
            "catalog of %s %s reloaded from %s (%d types)",
            self.cloud,
            self.region,
            self.catalog_dir,
            len(catalog.types),
        )
        return True

    def _failed(self, why: str) -> None:
        if why != self.problem:  # once per new reason, not at every check
            log.warning("catalog not reloaded, the one in use stays (retried): %s", why)
        self.problem = why

    def status(self) -> str | None:
        """What /readyz adds while the file cannot be read (the catalog in use still serves)."""
        return None if self.problem is None else f"catalog not reloaded: {self.problem}"

    def start(self) -> None:
        self._task.start(self._loop)

    async def stop(self) -> None:
        await self._task.stop()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_seconds)
            try:
                await asyncio.to_thread(self.check)
            except Exception as exc:  # whatever one check meets, the next one runs
                self._failed(f"{type(exc).__name__}: {exc}")
