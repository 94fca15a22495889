"""serve follows its catalog file: with --catalog-dir, a catalog rewritten while it runs (the
refresh CronJob's volume) is used from then on, an unreadable rewrite keeps the one in use, and
nothing is reloaded while the file stays the same. A file that cannot even be stat'ed (a symlink
loop, ESTALE) is retried at every check, named by /readyz (still ready: the catalog in use
serves) until it loads again."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import FrozenInstanceError
from pathlib import Path

import httpx
import pytest

from adaptor.node.catalogs import CatalogReloader, PlacementInUse
from adaptor.node.daemon import Daemon
from adaptor.node.readiness import Readiness
from adaptor.planning.placement import Placement, quota_pool
from providers.core.snapshots import default_catalog_dir, load_snapshot
from tests.adaptor.daemon_proc import daemon_settings
from tests.adaptor.fakes import FakeProvider


@pytest.fixture
def catalogs() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        shutil.copy(default_catalog_dir() / "aws-us-east-1.json", directory)
        yield Path(directory)


def _rewrite(path: Path, keep: int) -> None:
    doc = json.loads(path.read_text())
    doc["types"] = doc["types"][:keep]
    path.write_text(json.dumps(doc))
    stat = path.stat()  # a new mtime even within the same clock tick
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


def test_a_rewritten_catalog_replaces_the_one_in_use(catalogs: Path) -> None:
    first = load_snapshot("aws", "us-east-1", catalogs)
    pool = quota_pool("h100=8", first, None)
    placement = Placement(catalog=first, quota=pool)
    placements = PlacementInUse(placement)
    reloader = CatalogReloader(placements, "aws", "us-east-1", catalogs)
    assert reloader.check() is False and placements.current is placement  # unchanged file
    _rewrite(catalogs / "aws-us-east-1.json", keep=3)
    assert reloader.check() is True
    reloaded = placements.current
    assert reloaded.catalog is not None and len(reloaded.catalog.types) == 3
    # a new placement: the one a plan in flight holds keeps its catalog; the quota pool is shared
    assert placement.catalog is first and reloaded is not placement
    assert reloaded.quota is pool
    (catalogs / "aws-us-east-1.json").write_text("{not json")
    assert reloader.check() is False  # a broken file never replaces a good catalog
    assert placements.current is reloaded


def test_a_placement_is_never_changed() -> None:
    placement = Placement(catalog=load_snapshot("aws", "us-east-1"))
    with pytest.raises(FrozenInstanceError):
        placement.catalog = None  # type: ignore[misc]
    assert placement.selector is placement.selector  # one index for the placement's life
    assert placement.selector.catalog is placement.catalog


class AwsLike(FakeProvider):
    name = "aws"
    region = "us-east-1"


async def test_serve_with_a_catalog_dir_reloads(catalogs: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as root:
        settings = daemon_settings(Path(root), catalog_dir=str(catalogs))
        daemon = Daemon(settings, provider=AwsLike())
        await daemon.start()
        try:
            assert daemon.catalogs is not None
            _rewrite(catalogs / "aws-us-east-1.json", keep=2)
            assert daemon.catalogs.check() is True
            catalog = daemon.catalogs.placements.current.catalog
            assert catalog is not None and len(catalog.types) == 2
        finally:
            await daemon.close()
        assert daemon.catalogs is None


def _loop_in_place_of(path: Path) -> str:
    """The catalog file becomes a symlink to itself: every stat of it fails with ELOOP. Returns
    what it held."""
    text = path.read_text()
    path.unlink()
    os.symlink(path.name, path)
    return text


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met within 10 s")


async def test_reload_survives_a_symlink_loop_and_resumes_once_fixed(catalogs: Path) -> None:
    path = catalogs / "aws-us-east-1.json"
    placements = PlacementInUse(Placement(catalog=load_snapshot("aws", "us-east-1", catalogs)))
    reloader = CatalogReloader(placements, "aws", "us-east-1", catalogs, interval_seconds=0.02)
    readiness = Readiness(FakeProvider(), lambda: True, notes=[reloader.status])
    await readiness.ask_cloud()
    text = _loop_in_place_of(path)
    reloader.start()
    try:
        await _until(lambda: reloader.problem is not None)
        ready, why = await readiness.check()
        assert ready, why  # the catalog in use still serves
        assert why.startswith("ok; catalog not reloaded: ") and "symbolic links" in why, why
        path.unlink()
        path.write_text(text)
        _rewrite(path, keep=4)
        await _until(lambda: reloader.reloads == 1)
        catalog = placements.current.catalog
        assert catalog is not None and len(catalog.types) == 4
        assert reloader.problem is None and await readiness.check() == (True, "ok")
    finally:
        await reloader.stop()


async def test_readyz_names_a_catalog_it_cannot_reload(catalogs: Path) -> None:
    path = catalogs / "aws-us-east-1.json"
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as root:
        settings = daemon_settings(
            Path(root), catalog_dir=str(catalogs), status_address="127.0.0.1:0"
        )
        daemon = Daemon(settings, provider=AwsLike())
        await daemon.start()
        try:
            assert daemon.catalogs is not None and daemon.status is not None
            readyz = f"{daemon.status.url}/readyz"
            await _until_ok(readyz, "ok")
            text = _loop_in_place_of(path)
            assert await asyncio.to_thread(daemon.catalogs.check) is False
            said = await _get(readyz)
            assert said.status_code == 200 and "catalog not reloaded" in said.text, said.text
            assert "Too many levels of symbolic links" in said.text
            path.unlink()
            path.write_text(text)
            _rewrite(path, keep=2)
            assert await asyncio.to_thread(daemon.catalogs.check) is True
            assert (await _get(readyz)).text == "ok"
        finally:
            await daemon.close()


async def _get(url: str) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.get(url, headers={"Host": "127.0.0.1"})


async def _until_ok(url: str, text: str) -> None:
    for _ in range(200):
        if (await _get(url)).text == text:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never said {text!r}")
