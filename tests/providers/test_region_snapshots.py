"""A catalog for every AWS region that sells GPUs (by moto's copy of AWS' own offerings data):
each bundled snapshot loads and has GPU types, the regions left out offer no GPU family there,
and a snapshot made again by scripts/make_catalogs.py is byte for byte the bundled one.

The snapshots are made from one moto release's data (make_catalogs.MOTO_DATA, pinned in
config/constraints.txt, named in each snapshot's source). Another release lists other regions
and types (5.2.5 sells GPUs in ap-south-2), so the comparison with moto's data holds for that
release; with another one installed the maker refuses to write, and the region lists are
checked as recorded."""

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


def _made_with_installed_moto() -> bool:
    import moto

    return bool(moto.__version__ == make_catalogs().MOTO_DATA)


def test_every_region_that_sells_gpus_has_a_snapshot() -> None:
    script = make_catalogs()
    bundled = set(available_snapshots("aws"))
    assert set(script.AWS_REGIONS) == bundled
    assert not bundled & set(script.AWS_REGIONS_WITHOUT_GPUS)
    if _made_with_installed_moto():  # the data the snapshots were made from: check the record
        offerings = _moto_offerings()
        with_gpus = {r for r, ts in offerings.items() if any(GPU_FAMILY.match(t) for t in ts)}
        assert with_gpus == bundled, sorted(with_gpus ^ bundled)
        assert set(offerings) - with_gpus == set(script.AWS_REGIONS_WITHOUT_GPUS)
    for region in sorted(bundled):
        catalog = load_catalog("aws", region)
        assert catalog.region == region
        assert catalog.source == script.AWS_SOURCE_LABEL
        assert f"moto {script.MOTO_DATA} " in catalog.source
        assert any(t.gpu for t in catalog.types), region
    assert (default_catalog_dir() / "aws-eu-west-1.json").is_file()


def test_the_constraints_pin_the_moto_the_snapshots_were_made_from() -> None:
    pins = (ROOT / "config" / "constraints.txt").read_text().splitlines()
    assert f"moto=={make_catalogs().MOTO_DATA}" in pins


@pytest.mark.slow
def test_a_snapshot_is_made_again_identically(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = make_catalogs().main(["--out", str(tmp_path), "aws-eu-west-1"])
    if not _made_with_installed_moto():  # refused: another release's data, not mislabelled
        assert code == 1 and not (tmp_path / "aws-eu-west-1.json").exists()
        assert "config/constraints.txt" in capsys.readouterr().err
        return
    assert code == 0
    made = (tmp_path / "aws-eu-west-1.json").read_text()
    assert made == (default_catalog_dir() / "aws-eu-west-1.json").read_text()
