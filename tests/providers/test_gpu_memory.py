"""One memory figure per GPU model, in the MiB the driver reports, on every cloud.

Sources: EC2 DescribeInstanceTypes `GpuInfo.Gpus[].MemoryInfo.SizeInMiB` (the real records moto
bundles; https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_GpuDeviceMemoryInfo.html),
which is what `nvidia-smi --query-gpu=memory.total` reports on those hosts; NVIDIA's B200 ("180
GB") and GB200 ("186 GB") datasheet figures are not GiB: p6-b200 reports 183359 MiB and
p6e-gb200 189440 MiB per GPU. GCP's accelerator types and Azure's resource SKUs report no GPU
memory, so their catalogs must carry the same figure as AWS's for the same GPU.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from providers.core.catalog import Catalog
from providers.core.gpus import GPU_MODELS, aws_gpu

SNAPSHOTS = sorted((Path(__file__).parents[2] / "providers" / "snapshots").glob("*.json"))


def _moto_gpus() -> dict[str, set[int]]:
    """Model id -> every full-GPU memory figure in AWS's own DescribeInstanceTypes records."""
    moto = pytest.importorskip("moto")
    path = Path(os.path.dirname(moto.__file__)) / "ec2" / "resources" / "instance_types.json.gz"
    records = json.loads(gzip.decompress(path.read_bytes()))
    found: dict[str, set[int]] = {}
    for raw in records.values():
        for gpu in (raw.get("GpuInfo") or {}).get("Gpus", []):
            if float(gpu.get("GpuPartitionSize") or 1.0) < 1.0:
                continue
            memory = int(gpu["MemoryInfo"]["SizeInMiB"])
            found.setdefault(aws_gpu(gpu["Name"], memory).id, set()).add(memory)
    return found


def test_the_table_is_what_aws_reports_for_every_gpu_aws_sells() -> None:
    reported = _moto_gpus()
    assert {"b200", "b300", "h200", "l4", "a10g", "l40s", "rtx-pro-6000"} <= set(reported)
    for model, figures in reported.items():
        assert figures == {GPU_MODELS[model].memory_mib}, model


@pytest.mark.parametrize(
    ("model", "mib", "marketing_gb"),
    [("b200", 183359, 180), ("gb200", 189440, 186), ("l4", 22888, 24), ("a10g", 22888, 24)],
)
def test_figures_are_the_drivers_not_marketing_gb_read_as_gib(
    model: str, mib: int, marketing_gb: int
) -> None:
    assert GPU_MODELS[model].memory_mib == mib
    assert mib != marketing_gb * 1024


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.stem)
def test_every_catalog_carries_the_one_figure(path: Path) -> None:
    """A whole GPU has the table's figure; a share (g6f, NV*ads_A10_v5) that share of it."""
    catalog = Catalog.model_validate_json(path.read_text())
    checked = 0
    for t in catalog.types:
        if t.gpu is not None and t.gpu.model in GPU_MODELS:
            expected = round(GPU_MODELS[t.gpu.model].memory_mib * t.gpu.fraction)
            assert t.gpu.memory_mib == expected, (t.name, t.gpu)
            checked += 1
        for a in t.attachable_gpus:
            assert a.memory_mib == GPU_MODELS[a.model].memory_mib, (t.name, a.model)
            checked += 1
    assert checked


def test_the_same_gpu_has_the_same_memory_on_every_cloud() -> None:
    seen: dict[str, set[tuple[str, int]]] = {}
    for path in SNAPSHOTS:
        catalog = Catalog.model_validate_json(path.read_text())
        for t in catalog.types:
            if t.gpu is not None and t.gpu.fraction == 1.0:
                seen.setdefault(t.gpu.model, set()).add((catalog.cloud, t.gpu.memory_mib))
    for model in ("b200", "gb200", "h200", "h100-80gb", "a100-80gb", "l4"):
        figures = {mib for _cloud, mib in seen[model]}
        assert len(figures) == 1, (model, seen[model])
        assert len({cloud for cloud, _mib in seen[model]}) >= 2, model
