"""serve follows its catalog file: with --catalog-dir, a catalog rewritten while it runs (the
refresh CronJob's volume) is used from then on, an unreadable rewrite keeps the one in use, and
nothing is reloaded while the file stays the same."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptor.node.catalogs import CatalogReloader
from adaptor.node.daemon import Daemon
from adaptor.planning.placement import Placement
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
    placement = Placement(catalog=first)
    reloader = CatalogReloader(placement, "aws", "us-east-1", catalogs)
    assert reloader.check() is False and placement.catalog is first  # unchanged file
    _rewrite(catalogs / "aws-us-east-1.json", keep=3)
    assert reloader.check() is True
    assert placement.catalog is not None and len(placement.catalog.types) == 3
    (catalogs / "aws-us-east-1.json").write_text("{not json")
    assert reloader.check() is False  # a broken file never replaces a good catalog
    assert len(placement.catalog.types) == 3


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
            assert len(daemon.catalogs.placement.catalog.types) == 2  # type: ignore[union-attr]
        finally:
            await daemon.close()
        assert daemon.catalogs is None
