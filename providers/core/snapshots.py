"""Where catalogs come from: bundled snapshots (offline, the default) or the live cloud APIs.

A snapshot is `providers/snapshots/<cloud>-<region>.json`, a `providers.core.catalog.Catalog`
as JSON.
`load_snapshot`, `load_live` and `load_catalog` read a catalog each time they are called. What
reads one again and again (the webhook's catalog source, the node's reloader) holds a
`CatalogLoader`: it keeps each catalog it loaded for a TTL (a snapshot also until its file
changes), so a catalog is parsed once and stays the same object while it is current (the
selector and device space built over it too). Live loading imports the cloud's loader module
only when asked, so an AWS-only install never imports the Azure SDK.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import cast

from pydantic import ValidationError

from providers.core.catalog import CLOUDS, Catalog, Cloud
from providers.core.errors import CatalogError, InvalidRequest

__all__ = [
    "CLOUDS",
    "DEFAULT_REGIONS",
    "DEFAULT_TTL_SECONDS",
    "CatalogLoader",
    "available_snapshots",
    "default_catalog_dir",
    "load_catalog",
    "load_live",
    "load_snapshot",
    "parse_cloud",
    "snapshot_json",
    "snapshot_path",
]

DEFAULT_REGIONS: dict[str, str] = {"aws": "us-east-1", "azure": "eastus", "gcp": "us-central1"}
DEFAULT_TTL_SECONDS = 3600.0

Progress = Callable[[str, int], None]  # (stage, items in the page just read): loaders' callback


def default_catalog_dir() -> Path:
    """`$PEERPODS_CATALOG_DIR`, else the bundled `providers/snapshots` (package data)."""
    env = os.environ.get("PEERPODS_CATALOG_DIR", "").strip()
    if env:
        return Path(env)
    return Path(str(resources.files("providers") / "snapshots"))


def parse_cloud(name: str) -> Cloud:
    """A cloud name, checked."""
    if name not in CLOUDS:
        raise InvalidRequest(f"unknown provider {name!r} (one of {', '.join(CLOUDS)})")
    return name


def snapshot_path(cloud: str, region: str, catalog_dir: Path | None = None) -> Path:
    if not region or "/" in region or region.startswith("."):
        raise InvalidRequest(f"invalid region {region!r}")
    return (catalog_dir or default_catalog_dir()) / f"{cloud}-{region}.json"


def snapshot_json(catalog: Catalog) -> str:
    """A catalog as snapshot JSON: one instance type per line, defaults left out (diffs well)."""
    import json

    head = catalog.model_dump(mode="json", exclude={"types"})
    lines = [
        json.dumps(t.model_dump(mode="json", exclude_defaults=True), separators=(",", ":"))
        for t in catalog.types
    ]
    body = ",\n".join(lines)
    return json.dumps(head)[:-1] + ', "types": [\n' + body + "\n]}\n"


def available_snapshots(cloud: str, catalog_dir: Path | None = None) -> list[str]:
    """Regions with a bundled snapshot for this cloud."""
    folder = catalog_dir or default_catalog_dir()
    prefix = f"{cloud}-"
    return sorted(p.stem[len(prefix) :] for p in folder.glob(f"{prefix}*.json"))


def load_snapshot(cloud: str, region: str, catalog_dir: Path | None = None) -> Catalog:
    """The bundled catalog for a cloud region, read now."""
    return _read_snapshot(cloud, region, catalog_dir)[0]


def _read_snapshot(
    cloud: str, region: str, catalog_dir: Path | None
) -> tuple[Catalog, tuple[int, int]]:
    """The snapshot and the (mtime_ns, size) of the file it was read from."""
    path = _snapshot_file(cloud, region, catalog_dir)
    stamp = _stamp(path, cloud, region, catalog_dir)
    try:
        catalog = Catalog.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CatalogError(f"{path}: invalid catalog at {where}: {first['msg']}") from None
    except OSError as exc:
        raise CatalogError(f"{path}: {exc.strerror or exc}") from None
    if catalog.cloud != cloud or catalog.region != region:
        raise CatalogError(
            f"{path}: holds {catalog.cloud} {catalog.region}, expected {cloud} {region}"
        )
    return catalog, stamp


def _snapshot_file(cloud: str, region: str, catalog_dir: Path | None) -> Path:
    parse_cloud(cloud)
    return snapshot_path(cloud, region, catalog_dir)


def _stamp(path: Path, cloud: str, region: str, catalog_dir: Path | None) -> tuple[int, int]:
    try:
        info = path.stat()
    except FileNotFoundError:
        known = ", ".join(available_snapshots(cloud, catalog_dir)) or "none"
        raise CatalogError(
            f"no catalog snapshot for {cloud} {region} in {path.parent} (regions: {known}); "
            f"write one with `peerpods catalog refresh --provider {cloud} --region {region} "
            "--out DIR` and give DIR as --catalog-dir (`peerpods select --live` reads the "
            "cloud's API instead)"
        ) from None
    return (info.st_mtime_ns, info.st_size)


def _loader(cloud: str) -> Callable[..., Catalog]:
    module_name = f"providers.clouds.loaders.{cloud}"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CatalogError(
            f"live {cloud} catalogs need the {cloud} SDK: pip install 'peerpods[{cloud}]' ({exc})"
        ) from None
    function = getattr(module, "load_catalog", None)
    if not callable(function):
        raise CatalogError(f"{module_name} has no load_catalog()")
    return cast(Callable[..., Catalog], function)


def load_live(
    cloud: str,
    region: str,
    progress: Progress | None = None,
    **client_options: object,
) -> Catalog:
    """The catalog from the cloud's API, read now (blocking: call it in a thread from async
    code)."""
    parse_cloud(cloud)
    function = _loader(cloud)
    options = dict(client_options)
    if progress is not None:
        options["progress"] = progress
    catalog = function(region, **options)
    if not isinstance(catalog, Catalog):
        raise CatalogError(f"the {cloud} loader returned {type(catalog).__name__}, not a Catalog")
    return catalog


def load_catalog(
    cloud: str,
    region: str | None = None,
    *,
    live: bool = False,
    catalog_dir: Path | None = None,
    progress: Progress | None = None,
) -> Catalog:
    """The catalog selection should use, read now: the bundled snapshot unless `live`."""
    parse_cloud(cloud)
    region = region or DEFAULT_REGIONS[cloud]
    if live:
        return load_live(cloud, region, progress)
    return load_snapshot(cloud, region, catalog_dir)


@dataclass(frozen=True)
class _Entry:
    catalog: Catalog
    loaded_at: float
    stamp: tuple[int, int] | None  # snapshot file (mtime_ns, size); None for live


class CatalogLoader:
    """Catalogs from one folder (and the clouds' APIs), each kept for `ttl_seconds` after it
    was loaded, a snapshot also only until its file changes: the same object comes back while
    it is current. Owned by whoever re-reads its catalog; safe to share between threads."""

    def __init__(
        self, catalog_dir: Path | None = None, ttl_seconds: float = DEFAULT_TTL_SECONDS
    ) -> None:
        self.catalog_dir = catalog_dir
        self.ttl_seconds = ttl_seconds
        self._entries: dict[tuple[str, str, str], _Entry] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Forget every loaded catalog (a forced refresh)."""
        with self._lock:
            self._entries.clear()

    def _fresh(self, key: tuple[str, str, str], stamp: tuple[int, int] | None) -> Catalog | None:
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or time.monotonic() - entry.loaded_at > self.ttl_seconds:
            return None
        return entry.catalog if entry.stamp == stamp else None

    def _keep(
        self, key: tuple[str, str, str], catalog: Catalog, stamp: tuple[int, int] | None
    ) -> None:
        with self._lock:
            self._entries[key] = _Entry(catalog, time.monotonic(), stamp)

    def snapshot(self, cloud: str, region: str) -> Catalog:
        """The snapshot of a cloud region: one stat while the kept one is current."""
        path = _snapshot_file(cloud, region, self.catalog_dir)
        key = ("snapshot", str(path), "")
        kept = self._fresh(key, _stamp(path, cloud, region, self.catalog_dir))
        if kept is not None:
            return kept
        catalog, stamp = _read_snapshot(cloud, region, self.catalog_dir)
        self._keep(key, catalog, stamp)
        return catalog

    def live(self, cloud: str, region: str, progress: Progress | None = None) -> Catalog:
        """The catalog from the cloud's API (blocking), kept for the TTL."""
        parse_cloud(cloud)
        key = ("live", cloud, region)
        kept = self._fresh(key, None)
        if kept is not None:
            return kept
        catalog = load_live(cloud, region, progress)
        self._keep(key, catalog, None)
        return catalog

    def load(self, cloud: str, region: str | None = None, *, live: bool = False) -> Catalog:
        """The catalog selection should use: the snapshot unless `live`."""
        parse_cloud(cloud)
        region = region or DEFAULT_REGIONS[cloud]
        return self.live(cloud, region) if live else self.snapshot(cloud, region)
