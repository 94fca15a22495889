"""Common asks on the bundled catalogs of each cloud, region offerings, and the catalog cache."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from providers.core import snapshots
from providers.core.catalog import Catalog
from providers.core.errors import CatalogError, InvalidRequest, NoMatch
from providers.core.request import InstanceRequest
from providers.core.selection import select

GIB = 1024
H100 = ("h100",)


def pick(cloud: str, region: str | None = None, **fields: Any) -> str:
    catalog = snapshots.load_catalog(cloud, region)
    return select(catalog, InstanceRequest(**fields)).selected.name


ASKS: list[tuple[str, dict[str, Any], str]] = [
    # AWS us-east-1 (moto's real DescribeInstanceTypes data, with on-demand prices)
    ("aws", {"gpus": 1, "gpu_models": H100}, "p5.4xlarge"),
    ("aws", {"gpus": 8, "gpu_models": H100}, "p5.48xlarge"),
    ("aws", {"gpus": 1, "gpu_models": ("a100-80gb",)}, "p4de.24xlarge"),
    ("aws", {"gpus": 1, "gpu_models": ("l4",)}, "g6.xlarge"),
    ("aws", {"gpus": 1, "gpu_models": ("t4",)}, "g4dn.xlarge"),
    ("aws", {"gpus": 1, "gpu_memory_mib": 20 * GIB}, "g6.xlarge"),
    ("aws", {"mig": {"1g.10gb": 2}}, "p5.4xlarge"),
    ("aws", {"mig": {"1g.10gb": 8}}, "p4d.24xlarge"),
    ("aws", {"mig": {"1g.10gb": 8}, "gpu_models": ("h100",)}, "p5.48xlarge"),
    ("aws", {"mig": {"3g.40gb": 1, "4g.40gb": 1}}, "p5.4xlarge"),
    ("aws", {"gpus": 1, "gpu_models": ("l4",), "fractional": True}, "g6f.large"),
    ("aws", {"gpus": 1, "gpu_models": ("h200",)}, "p5en.48xlarge"),
    ("aws", {"gpus": 1, "gpu_models": ("t4",), "arch": "arm64"}, "g5g.xlarge"),
    ("aws", {"gpus": 1}, "g4dn.xlarge"),  # a GPU means NVIDIA: not the cheaper g4ad (AMD)
    ("aws", {"gpus": 1, "gpu_models": ("Radeon Pro V520",)}, "g4ad.xlarge"),
    # Azure eastus (no prices: smallest fit)
    ("azure", {"gpus": 1, "gpu_models": H100}, "Standard_NC40ads_H100_v5"),
    ("azure", {"gpus": 1, "gpu_models": ("h100-80gb",)}, "Standard_ND96isr_H100_v5"),
    ("azure", {"gpus": 8, "gpu_models": H100}, "Standard_ND96isr_H100_v5"),
    ("azure", {"gpus": 1, "gpu_models": ("a100-80gb",)}, "Standard_NC24ads_A100_v4"),
    ("azure", {"gpus": 1, "gpu_models": ("t4",)}, "Standard_NC4as_T4_v3"),
    ("azure", {"gpus": 1, "gpu_memory_mib": 20 * GIB}, "Standard_NV36ads_A10_v5"),
    ("azure", {"mig": {"1g.10gb": 2}}, "Standard_NC24ads_A100_v4"),
    ("azure", {"mig": {"1g.10gb": 8}}, "Standard_NC48ads_A100_v4"),
    ("azure", {"mig": {"3g.40gb": 1, "4g.40gb": 1}}, "Standard_NC24ads_A100_v4"),
    ("azure", {"gpus": 1, "gpu_models": ("a10",), "fractional": True}, "Standard_NV6ads_A10_v5"),
    ("azure", {"gpus": 8, "gpu_models": ("h200",), "rdma": True}, "Standard_ND96isr_H200_v5"),
    # GCP us-central1 (bundled A2/A3/G2, attachable N1)
    # a3-highgpu-1g is sold only as Spot or Flex-start (GCP's accelerator-optimized machine
    # docs): an on-demand pod gets the cheapest on-demand 8-GPU A3 (equal prices: by name)
    ("gcp", {"gpus": 1, "gpu_models": H100}, "a3-edgegpu-8g"),
    ("gcp", {"gpus": 8, "gpu_models": H100}, "a3-edgegpu-8g"),  # equal 8-GPU A3s: by name
    ("gcp", {"gpus": 1, "gpu_models": ("a100-80gb",)}, "a2-ultragpu-1g"),
    ("gcp", {"gpus": 1, "gpu_models": ("l4",)}, "g2-standard-4"),
    ("gcp", {"gpus": 1, "gpu_models": ("t4",)}, "n1-standard-1"),
    ("gcp", {"gpus": 1, "gpu_memory_mib": 20 * GIB}, "g2-standard-4"),
    ("gcp", {"mig": {"1g.10gb": 2}}, "a2-highgpu-1g"),
    ("gcp", {"mig": {"1g.10gb": 8}}, "a2-highgpu-2g"),
    ("gcp", {"mig": {"3g.40gb": 1, "4g.40gb": 1}}, "a2-ultragpu-1g"),
    ("gcp", {"gpus": 1, "gpu_models": ("l4",), "fractional": True}, "g2-standard-4"),
    ("gcp", {"gpus": 16, "gpu_models": ("a100",)}, "a2-megagpu-16g"),
]


@pytest.mark.parametrize(("cloud", "fields", "expected"), ASKS)
def test_common_asks(cloud: str, fields: dict[str, Any], expected: str) -> None:
    assert pick(cloud, **fields) == expected


@pytest.mark.parametrize(
    ("cloud", "fields", "message"),
    [
        ("aws", {"gpus": 16, "gpu_models": H100}, "16 h100-80gb GPUs exceed the largest type, 8"),
        ("aws", {"mig": {"9g.99gb": 1}}, "no type offers MIG profile 9g.99gb"),
        ("azure", {"gpus": 1, "gpu_models": ("l4",)}, "no type offers GPU model l4"),
        ("gcp", {"gpus": 1, "gpu_models": ("l4",), "rdma": True}, "RDMA"),
    ],
)
def test_impossible_asks(cloud: str, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(NoMatch, match=message):
        pick(cloud, **fields)


def test_caa_counter_example_on_the_real_catalog() -> None:
    catalog = snapshots.load_catalog("aws", "us-east-1")
    subset = Catalog(
        cloud="aws",
        region="us-east-1",
        types=tuple(
            t for t in catalog.types if t.name in ("c5.2xlarge", "r5.xlarge", "x2iedn.xlarge")
        ),
    )
    assert len(subset.types) == 3
    request = InstanceRequest(vcpus=8, memory_mib=8 * GIB)
    assert select(subset, request).selected.name == "c5.2xlarge"
    # and over the whole catalog the choice has at least those resources
    chosen = select(catalog, request).selected.instance_type
    assert chosen.vcpus >= 8 and chosen.memory_mib >= 8 * GIB and chosen.gpu is None


def test_region_offerings() -> None:
    east = snapshots.load_catalog("aws", "us-east-1")
    names = {t.name for t in east.types}
    assert {"p5en.48xlarge", "p5e.48xlarge"} <= names  # p5e: the recorded supplement
    with pytest.raises(NoMatch, match="not in the aws us-east-1 catalog"):
        select(east, InstanceRequest(instance_type="p9e.48xlarge"))
    # a zone narrows: every candidate is offered there
    for zone in ("us-east-1a", "us-east-1b", "us-east-1e"):
        selection = select(east, InstanceRequest(gpus=1, gpu_models=("h200",), zone=zone))
        for candidate in selection.candidates:
            assert zone in candidate.instance_type.zones
        rejected = {r.name: r.reason for r in selection.rejections}
        p5en = next(t for t in east.types if t.name == "p5en.48xlarge")
        if zone not in p5en.zones:
            assert rejected["p5en.48xlarge"] == f"not offered in zone {zone}"
    azure = snapshots.load_catalog("azure", "eastus")
    h200 = InstanceRequest(gpus=8, gpu_models=("h200",), zone="1")
    with pytest.raises(NoMatch, match="offered in zone 1"):
        _ = select(azure, h200).selected


def test_every_snapshot_loads_and_resolves() -> None:
    for cloud, region in (
        ("aws", "us-east-1"),
        ("aws", "us-west-2"),
        ("azure", "eastus"),
        ("gcp", "us-central1"),
    ):
        catalog = snapshots.load_catalog(cloud, region)
        assert catalog.cloud == cloud and catalog.region == region and catalog.types
        assert select(catalog, InstanceRequest(gpus=1)).candidates


# --- the catalog cache ------------------------------------------------------------------------


def test_loader_reuses_and_notices_changes(tmp_path: Path) -> None:
    source = snapshots.snapshot_path("azure", "eastus")
    target = tmp_path / "azure-eastus.json"
    shutil.copy(source, target)
    loader = snapshots.CatalogLoader(tmp_path)
    first = loader.load("azure", "eastus")
    assert loader.load("azure", "eastus") is first
    assert snapshots.load_catalog("azure", "eastus", catalog_dir=tmp_path) is not first  # read now
    data = json.loads(target.read_text())
    data["types"] = data["types"][:3]
    target.write_text(json.dumps(data))
    os.utime(target, ns=(1, 1))  # a different mtime even on a coarse clock
    second = loader.snapshot("azure", "eastus")
    assert second is not first and len(second.types) == 3
    # an expired TTL reloads too
    third = snapshots.CatalogLoader(tmp_path, ttl_seconds=0.0)
    assert third.snapshot("azure", "eastus") is not third.snapshot("azure", "eastus")
    assert third.snapshot("azure", "eastus") == second


def test_two_loaders_over_different_folders_keep_their_own(tmp_path: Path) -> None:
    """Catalogs are kept per loader, never per process: two folders, two catalogs."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for folder, keep in ((ours, 2), (theirs, 5)):
        folder.mkdir()
        data = json.loads(snapshots.snapshot_path("azure", "eastus").read_text())
        data["types"] = data["types"][:keep]
        (folder / "azure-eastus.json").write_text(json.dumps(data))
    mine, yours = snapshots.CatalogLoader(ours), snapshots.CatalogLoader(theirs)
    assert len(mine.load("azure", "eastus").types) == 2
    assert len(yours.load("azure", "eastus").types) == 5
    assert len(mine.load("azure", "eastus").types) == 2
    mine.clear()  # forgets its own, not the other's
    assert yours.load("azure", "eastus") is yours.load("azure", "eastus")


def test_snapshot_errors(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="no catalog snapshot for aws eu-west-9"):
        snapshots.load_catalog("aws", "eu-west-9")
    with pytest.raises(InvalidRequest, match="unknown provider"):
        snapshots.load_catalog("oracle", "x")
    with pytest.raises(InvalidRequest, match="invalid region"):
        snapshots.load_catalog("aws", "../etc")
    (tmp_path / "aws-us-east-1.json").write_text(
        '{"cloud": "aws", "region": "us-east-1", "types": 3}'
    )
    with pytest.raises(CatalogError, match="invalid catalog at types"):
        snapshots.load_catalog("aws", "us-east-1", catalog_dir=tmp_path)
    (tmp_path / "gcp-us-east1.json").write_text('{"cloud": "aws", "region": "us-east-1"}')
    with pytest.raises(CatalogError, match="expected gcp us-east1"):
        snapshots.load_catalog("gcp", "us-east1", catalog_dir=tmp_path)
    (tmp_path / "azure-westus.json").write_bytes(b"\xff\xfe not json")
    with pytest.raises(CatalogError):
        snapshots.load_catalog("azure", "westus", catalog_dir=tmp_path)
    assert snapshots.available_snapshots("aws", tmp_path) == ["us-east-1"]


def test_live_goes_through_the_loader_and_is_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    import providers.clouds.loaders.aws as aws_loader

    calls: list[tuple[str, object]] = []
    fake = Catalog(cloud="aws", region="eu-west-1", source="live")

    def load_catalog(region: str, *, client: object = None, progress: object = None) -> Catalog:
        calls.append((region, progress))
        return fake

    monkeypatch.setattr(aws_loader, "load_catalog", load_catalog)
    seen: list[tuple[str, int]] = []
    got = snapshots.load_catalog(
        "aws", "eu-west-1", live=True, progress=lambda s, n: seen.append((s, n))
    )
    assert got is fake and len(calls) == 1 and calls[0][1] is not None
    snapshots.load_catalog("aws", "eu-west-1", live=True)
    assert len(calls) == 2  # read each time
    loader = snapshots.CatalogLoader()
    assert loader.load("aws", "eu-west-1", live=True) is fake
    assert loader.load("aws", "eu-west-1", live=True) is fake
    assert len(calls) == 3  # kept by the loader
