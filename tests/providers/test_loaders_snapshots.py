"""The bundled snapshots are what the loaders make, and known prices merge as documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from providers.core import prices
from providers.core.catalog import Catalog, InstanceType
from providers.core.errors import CatalogError
from tests.providers.catalog_script import make_catalogs

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "providers" / "snapshots"


def _snapshot(name: str) -> Catalog:
    return Catalog.model_validate_json((SNAPSHOTS / f"{name}.json").read_text())


@pytest.mark.parametrize(
    "name", ["aws-us-east-1", "aws-us-west-2", "azure-eastus", "gcp-us-central1"]
)
def test_snapshot_is_a_valid_catalog(name: str) -> None:
    catalog = _snapshot(name)
    assert f"{catalog.cloud}-{catalog.region}" == name
    names = [t.name for t in catalog.types]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert catalog.source.startswith("snapshot")
    assert all(t.zones for t in catalog.types)
    assert any(t.gpu for t in catalog.types)


@pytest.mark.parametrize("name", ["azure-eastus", "gcp-us-central1"])
def test_snapshot_is_byte_for_byte_what_the_script_writes(name: str, tmp_path: Path) -> None:
    script = make_catalogs()
    assert script.main(["--out", str(tmp_path), name]) == 0
    assert (tmp_path / f"{name}.json").read_text() == (SNAPSHOTS / f"{name}.json").read_text()


def test_script_refuses_unknown_snapshot_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert make_catalogs().main(["--out", str(tmp_path), "aws-mars-1"]) == 2
    assert "unknown snapshot aws-mars-1" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_aws_snapshots_have_region_offerings_and_us_east_1_prices() -> None:
    east, west = _snapshot("aws-us-east-1"), _snapshot("aws-us-west-2")
    by_east = east.by_name()
    # moto's data lacks p5e, p6-b300 and p6e-gb200 in us-east-1: the recorded supplement adds them
    assert {"p5e.48xlarge", "p5en.48xlarge", "p6-b300.48xlarge", "p6e-gb200.36xlarge"} <= set(
        by_east
    )
    assert by_east["p5.48xlarge"].price_per_hour == pytest.approx(55.04)
    assert by_east["g6f.large"].gpu is not None and by_east["g6f.large"].gpu.fraction == 0.125
    priced = {t.name for t in east.types if t.price_per_hour is not None}
    assert priced <= set(prices.known_prices("aws", "us-east-1"))
    assert len(priced) >= 40
    assert all(z.startswith("us-east-1") for t in east.types for z in t.zones)
    assert all(z.startswith("us-west-2") for t in west.types for z in t.zones)
    # us-west-2 lists the us-east-1 on-demand rates for these GPU types (AWS Price List)
    assert west.by_name()["p5.48xlarge"].price_per_hour == pytest.approx(55.04)


def test_known_prices_come_from_the_bundled_csv() -> None:
    table = prices.known_prices("aws", "us-east-1")
    assert table["p4de.24xlarge"] == pytest.approx(27.44705)
    assert prices.price_per_hour("aws", "us-east-1", "g6e.xlarge") == pytest.approx(1.861)
    assert prices.price_per_hour("aws", "us-east-1", "c5.large") is None
    assert prices.known_prices("azure", "eastus")["Standard_NC24ads_A100_v4"] == 3.673
    assert prices.known_prices("aws", "eu-nowhere-1") == {}
    with pytest.raises(TypeError):
        table["x"] = 1.0  # type: ignore[index]


def test_with_prices_fills_only_missing_prices(tmp_path: Path) -> None:
    (tmp_path / "aws-xx-test-1.csv").write_text(
        "instance_type,usd_per_hour\na.large,1.5\nb.large,2\n"
    )
    catalog = Catalog(
        cloud="aws",
        region="xx-test-1",
        types=(
            InstanceType(name="a.large", vcpus=2, memory_mib=4096),
            InstanceType(name="b.large", vcpus=2, memory_mib=4096, price_per_hour=9.0),
            InstanceType(name="c.large", vcpus=2, memory_mib=4096),
        ),
    )
    priced = prices.with_prices(catalog, tmp_path)
    assert [t.price_per_hour for t in priced.types] == [1.5, 9.0, None]
    assert catalog.types[0].price_per_hour is None  # the input is untouched


@pytest.mark.parametrize(
    "content",
    [
        "name,price\na.large,1\n",
        "instance_type,usd_per_hour\na.large,cheap\n",
        "instance_type,usd_per_hour\na.large,-1\n",
        "instance_type,usd_per_hour\n,1\n",
        "instance_type,usd_per_hour\na.large,nan\n",
    ],
)
def test_malformed_price_files_are_catalog_errors(tmp_path: Path, content: str) -> None:
    (tmp_path / "aws-xx-bad-1.csv").write_text(content)
    with pytest.raises(CatalogError, match=r"aws-xx-bad-1\.csv"):
        prices.known_prices("aws", "xx-bad-1", tmp_path)


def test_spot_prices_and_attached_gpu_rows_merge(tmp_path: Path) -> None:
    from providers.core.catalog import AttachableGpu

    (tmp_path / "gcp-xx-test1.csv").write_text(
        "instance_type,usd_per_hour,spot_usd_per_hour\n"
        "a3-highgpu-1g,,3.5\n"  # sold as Spot only: no on-demand price
        "gpu:t4,0.35,0.14\n"
        "n1-standard-4,0.19,0.04\n"
    )
    t4 = AttachableGpu(model="t4", memory_mib=16384, counts=(1, 2, 4))
    catalog = Catalog(
        cloud="gcp",
        region="xx-test1",
        types=(
            InstanceType(name="n1-standard-4", vcpus=4, memory_mib=15360, attachable_gpus=(t4,)),
            InstanceType(name="a3-highgpu-1g", vcpus=26, memory_mib=239616),
        ),
    )
    n1, a3 = prices.with_prices(catalog, tmp_path).types
    assert (n1.price_per_hour, n1.spot_price_per_hour) == (0.19, 0.04)
    assert (n1.attachable_gpus[0].price_per_hour, n1.attachable_gpus[0].spot_price_per_hour) == (
        0.35,
        0.14,
    )
    assert (a3.price_per_hour, a3.spot_price_per_hour) == (None, 3.5)
    assert prices.known_prices("gcp", "xx-test1", tmp_path) == {"n1-standard-4": 0.19}
    assert prices.write_prices(prices.with_prices(catalog, tmp_path), tmp_path / "out.csv") == 3
    assert (tmp_path / "out.csv").read_text() == (tmp_path / "gcp-xx-test1.csv").read_text()


def test_a_row_without_any_price_is_malformed(tmp_path: Path) -> None:
    (tmp_path / "aws-xx-bad-2.csv").write_text(
        "instance_type,usd_per_hour,spot_usd_per_hour\na.large,,\n"
    )
    with pytest.raises(CatalogError, match=r"aws-xx-bad-2\.csv:2"):
        prices.known_prices("aws", "xx-bad-2", tmp_path)
