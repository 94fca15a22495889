"""`peerpods plan` shows the capacity type a pod gets and the price its instance type ranks by."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from adaptor.cli.main import main
from providers.core.catalog import Catalog, GpuSpec, InstanceType

GIB = 1024
CATALOG = Catalog(
    cloud="aws",
    region="test-1",
    types=tuple(
        InstanceType(
            name=name,
            vcpus=16,
            memory_mib=128 * GIB,
            gpu=GpuSpec(model="h100-80gb", count=1, memory_mib=80 * GIB),
            price_per_hour=od,
            spot_price_per_hour=spot,
        )
        for name, od, spot in (("od-cheap.xl", 8.0, 6.5), ("spot-cheap.xl", 10.0, 3.0))
    ),
)


def manifest(tmp_path: Path, namespace: str, capacity: str | None) -> str:
    meta: dict[str, object] = {"name": "train", "namespace": namespace}
    if capacity is not None:
        meta["annotations"] = {"peerpods.io/capacity-type": capacity}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "runtimeClassName": "kata-remote",
            "containers": [
                {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}
            ],
        },
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    (tmp_path / "aws-test-1.json").write_text(CATALOG.model_dump_json())
    return str(path)


def plan(capsys: pytest.CaptureFixture[str], path: str, *argv: str) -> tuple[int, str, str]:
    catalog_dir = str(Path(path).parent)
    code = main(["plan", path, "--region", "test-1", "--catalog-dir", catalog_dir, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_spot_or_on_demand_plan_shows_capacity_and_spot_price(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = manifest(tmp_path, "ml", "spot-or-on-demand")
    code, out, _ = plan(capsys, path)
    assert code == 0
    assert "request (as CreateVM reads it): " in out and "capacity spot-or-on-demand" in out
    assert "SPOT USD/H" in out
    assert (
        "capacity: spot-or-on-demand; ranked by spot price, spot-cheap.xl at $3/h, then the "
        "same types on-demand after Spot capacity errors everywhere"
    ) in out
    code, out, _ = plan(capsys, path, "--output", "json")
    data = json.loads(out)
    assert data["intent"]["capacity_type"] == "spot-or-on-demand"
    assert data["selected"] == "spot-cheap.xl"
    assert data["price"] == {"market": "spot", "per_hour": 3.0, "estimated": False}


def test_on_demand_by_default_and_namespace_policy_denies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = plan(capsys, manifest(tmp_path, "web", None), "--output", "json")
    data = json.loads(out)
    assert code == 0 and data["intent"]["capacity_type"] == "on-demand"
    assert data["selected"] == "od-cheap.xl"
    assert data["price"] == {"market": "on-demand", "per_hour": 8.0, "estimated": False}
    code, out, _ = plan(capsys, manifest(tmp_path, "web", None), "--default-capacity-type", "spot")
    assert code == 0 and "capacity: spot; ranked by spot price, spot-cheap.xl at $3/h" in out
    code, _, err = plan(
        capsys, manifest(tmp_path, "web", "spot"), "--namespace-capacity-types", "*=on-demand"
    )
    assert code == 1
    assert "namespace web may not ask for spot capacity (allowed there: on-demand)" in err
