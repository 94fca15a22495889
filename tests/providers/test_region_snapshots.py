"""A catalog for every AWS region that sells GPUs (by moto's copy of AWS' own offerings data):
each bundled snapshot loads and has GPU types, the regions left out offer no GPU family there,
and a snapshot made again by scripts/make_catalogs.py is byte for byte the bundled one."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest

from providers.core.snapshots import available_snapshots, default_catalog_dir, load_catalog
from tests.providers.catalog_script import make_catalogs

ROOT = Path(__file__).resolve().parents[2]
# EC2's accelerated families with NVIDIA GPUs (g*, p*) besides the general ones
GPU_FAMILY = re.compile(r"^(g\d|p\d)")


def _moto_offerings() -> dict[str, set[str]]:
    import moto

    directory = Path(os.path.dirname(moto.__file__)) / "ec2/resources/instance_type_offerings"
    found: dict[str, set[str]] = {}
    for path in (directory / "availability-zone").glob("*.json.gz"):
        region = path.name.split(".")[0]
        offered = json.loads(gzip.decompress(path.read_bytes()))
        found[region] = {o["InstanceType"] for o in offered}
    return found


def test_every_region_that_sells_gpus_has_a_snapshot() -> None:
    offerings = _moto_offerings()
    with_gpus = {r for r, types in offerings.items() if any(GPU_FAMILY.match(t) for t in types)}
    bundled = set(available_snapshots("aws"))
    assert with_gpus <= bundled, sorted(with_gpus - bundled)
    assert set(make_catalogs().AWS_REGIONS) == bundled
    for region in sorted(bundled):
        catalog = load_catalog("aws", region)
        assert catalog.region == region
        assert any(t.gpu for t in catalog.types), region
    assert (default_catalog_dir() / "aws-eu-west-1.json").is_file()


@pytest.mark.slow
def test_a_snapshot_is_made_again_identically(tmp_path: Path) -> None:
    assert make_catalogs().main(["--out", str(tmp_path), "aws-eu-west-1"]) == 0
    made = (tmp_path / "aws-eu-west-1.json").read_text()
    assert made == (default_catalog_dir() / "aws-eu-west-1.json").read_text()
