"""Spot selection: only types sold as Spot, ranked by the Spot price (on-demand as the ceiling
where no Spot price is published), and `peerpods select --spot` showing it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adaptor.cli.main import main
from providers.core.catalog import AttachableGpu, Catalog, GpuSpec, InstanceType
from providers.core.request import InstanceRequest
from providers.core.selection import select

GIB = 1024


def gpu_type(name: str, od: float | None, spot: float | None, **extra: Any) -> InstanceType:
    return InstanceType(
        name=name,
        vcpus=16,
        memory_mib=128 * GIB,
        gpu=GpuSpec(model="h100-80gb", count=1, memory_mib=80 * GIB),
        price_per_hour=od,
        spot_price_per_hour=spot,
        **extra,
    )


CATALOG = Catalog(
    cloud="aws",
    region="test-1",
    types=(
        gpu_type("cheap-od.xlarge", 8.0, 6.5),
        gpu_type("cheap-spot.xlarge", 10.0, 3.0),
        gpu_type("no-spot-price.xlarge", 5.0, None),
        gpu_type("spot-only.xlarge", None, 2.5, provisioning=("spot",)),
    ),
)
H100 = InstanceRequest(gpus=1, gpu_models=("h100",))


def test_on_demand_ranks_by_on_demand_price_and_skips_spot_only_types() -> None:
    selection = select(CATALOG, H100)
    assert [c.name for c in selection.candidates] == [
        "no-spot-price.xlarge",
        "cheap-od.xlarge",
        "cheap-spot.xlarge",
    ]
    assert selection.candidates[0].price_per_hour == 5.0


def test_spot_ranks_by_spot_price_with_on_demand_as_the_ceiling() -> None:
    selection = select(CATALOG, H100.model_copy(update={"provisioning": "spot"}))
    ranked = [(c.name, c.price_per_hour, c.price_estimated) for c in selection.candidates]
    assert ranked == [
        ("spot-only.xlarge", 2.5, False),
        ("cheap-spot.xlarge", 3.0, False),
        ("no-spot-price.xlarge", 5.0, True),  # no Spot price: on-demand, what Spot costs at most
        ("cheap-od.xlarge", 6.5, False),
    ]
    first = selection.candidates[0]
    assert "cheapest of 4 at $2.5/h Spot" in first.reasons[-1]
    assert "at most: no Spot price known" in selection.candidates[2].reasons[-1]


def test_spot_n1_adds_the_attached_gpus_spot_price() -> None:
    def n1(name: str, od: float, spot: float, gpu_od: float, gpu_spot: float | None) -> Any:
        return InstanceType(
            name=name,
            vcpus=8,
            memory_mib=30 * GIB,
            price_per_hour=od,
            spot_price_per_hour=spot,
            attachable_gpus=(
                AttachableGpu(
                    model="t4",
                    memory_mib=16 * GIB,
                    counts=(1, 2, 4),
                    price_per_hour=gpu_od,
                    spot_price_per_hour=gpu_spot,
                ),
            ),
        )

    catalog = Catalog(
        cloud="gcp",
        region="test-1",
        types=(
            n1("n1-standard-8", 0.38, 0.08, 0.35, 0.14),
            n1("n1-highcpu-8", 0.28, 0.07, 0.35, None),
        ),
    )
    spot = select(catalog, InstanceRequest(gpus=1, gpu_models=("t4",), provisioning="spot"))
    ranked = [(c.name, c.price_per_hour, c.price_estimated) for c in spot.candidates]
    # n1-highcpu-8's T4 has no Spot price: the VM is ranked by its on-demand total, a ceiling.
    assert ranked == [("n1-standard-8", 0.22, False), ("n1-highcpu-8", 0.63, True)]


def test_select_spot_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "aws-test-1.json").write_text(CATALOG.model_dump_json())
    argv = ["select", "--region", "test-1", "--catalog-dir", str(tmp_path), "--gpus", "1"]
    assert main([*argv, "--spot", "--output", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["selected"] == "spot-only.xlarge"
    assert data["candidates"][1]["price_per_hour"] == 3.0
    assert main([*argv, "--spot", "--limit", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:4] == ["#", "TYPE", "SPOT", "USD/H"]
    assert "no Spot price known" in lines[-2] or "no Spot price known" in lines[-1]
    assert main([*argv, "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["selected"] == "no-spot-price.xlarge"
