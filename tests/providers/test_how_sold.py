"""How each type is sold: selection takes only what the pod's capacity type can buy.

Sources: AWS, "Amazon EC2 P6e-GB200 UltraServers" (https://aws.amazon.com/ec2/instance-types/p6/:
available through EC2 Capacity Blocks for ML, in the Dallas Local Zone us-east-1-dfw-2a); GCP,
accelerator-optimized machine family and Cluster Director's consumption options
(https://cloud.google.com/compute/docs/accelerator-optimized-machines: A4X, A4 and A3 Ultra
through reservations, Flex-start and Spot; A3 High with 1, 2 or 4 GPUs only with Spot or
Flex-start); Azure, NCCadsH100v5 sizes (https://learn.microsoft.com/azure/virtual-machines/sizes/
gpu-accelerated/nccadsh100v5-series: confidential VMs with the H100 NVL in confidential mode).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from providers.core import snapshots
from providers.core.catalog import Catalog, GpuSpec, InstanceType
from providers.core.errors import NoMatch
from providers.core.offers import offer_for
from providers.core.request import InstanceRequest
from providers.core.selection import select


def _select(cloud: str, **fields: Any) -> str:
    catalog = snapshots.load_catalog(cloud)  # type: ignore[arg-type]
    return select(catalog, InstanceRequest(**fields)).selected.name


@pytest.mark.parametrize(
    ("cloud", "name", "provisioning", "confidential"),
    [
        ("aws", "p6e-gb200.36xlarge", ("capacity-block",), False),
        ("aws", "p5.48xlarge", ("on-demand", "spot"), False),
        ("aws", "p5e.48xlarge", ("spot", "capacity-block"), False),
        # AI Hypercomputer consumption options: Flex-start and Spot take any GPU machine except A4X
        ("gcp", "a4x-highgpu-4g", ("reservation",), False),
        ("gcp", "a4-highgpu-8g", ("spot", "flex-start", "reservation"), False),
        ("gcp", "a3-ultragpu-8g", ("spot", "flex-start", "reservation"), False),
        ("gcp", "a3-highgpu-1g", ("spot", "flex-start"), False),
        ("gcp", "a3-highgpu-8g", ("on-demand", "spot"), False),
        ("azure", "Standard_NCC40ads_H100_v5", ("on-demand", "spot"), True),
        ("azure", "Standard_NC40ads_H100_v5", ("on-demand", "spot"), False),
    ],
)
def test_the_bundled_catalogs_record_how_each_type_is_sold(
    cloud: str, name: str, provisioning: tuple[str, ...], confidential: bool
) -> None:
    t = snapshots.load_catalog(cloud).by_name()[name]  # type: ignore[arg-type]
    assert (t.provisioning, t.confidential) == (provisioning, confidential)
    offer = offer_for(cloud, name)
    assert (offer.provisioning, offer.confidential) == (provisioning, confidential)


def test_p6e_gb200_is_only_in_the_dallas_local_zone() -> None:
    t = snapshots.load_catalog("aws").by_name()["p6e-gb200.36xlarge"]
    assert t.zones == ("us-east-1-dfw-2a",)


def test_a_capacity_block_type_is_never_an_on_demand_or_spot_pods() -> None:
    gb200 = {"gpus": 4, "gpu_models": ("gb200",), "arch": "arm64"}
    for provisioning in ("on-demand", "spot"):
        with pytest.raises(NoMatch) as caught:
            _select("aws", provisioning=provisioning, **gb200)
        assert "not sold " + provisioning in str(caught.value)
        assert "used only when the operator names it" in str(caught.value)
    # an operator-named capacity block makes it a candidate
    assert _select("aws", reservation="cr-0123456789abcdef0", **gb200) == "p6e-gb200.36xlarge"


def test_gcp_b200_and_h200_are_spot_or_reserved_never_on_demand() -> None:
    for model in ("b200", "h200"):
        ask = {"gpus": 8, "gpu_models": (model,)}
        with pytest.raises(NoMatch, match="not sold on-demand"):
            _select("gcp", **ask)
        assert _select("gcp", provisioning="spot", **ask).startswith(("a4-", "a3-ultragpu-"))
        assert _select("gcp", reservation="my-reservation", **ask).startswith(
            ("a4-", "a3-ultragpu-")
        )


def test_gcp_gb200_is_reserved_only_never_spot() -> None:
    gb200 = {"gpus": 4, "gpu_models": ("gb200",), "arch": "arm64"}
    for provisioning in ("on-demand", "spot"):
        with pytest.raises(NoMatch, match="not sold " + provisioning):
            _select("gcp", provisioning=provisioning, **gb200)
    assert _select("gcp", reservation="my-reservation", **gb200) == "a4x-highgpu-4g"


def test_a_confidential_size_only_for_a_pod_that_asks() -> None:
    ask = {"gpus": 1, "gpu_models": ("h100-nvl",)}
    ordinary = select(snapshots.load_catalog("azure"), InstanceRequest(**ask))
    assert ordinary.selected.name == "Standard_NC40ads_H100_v5"
    assert all(not c.instance_type.confidential for c in ordinary.candidates)
    why = {r.name: r.reason for r in ordinary.rejections}
    assert "only for a pod that asks for confidential computing" in why["Standard_NCC40ads_H100_v5"]
    assert _select("azure", confidential=True, **ask) == "Standard_NCC40ads_H100_v5"


def _zonal() -> Catalog:
    """A type sold on demand in z-a but only as Spot in z-b (per-zone terms)."""
    gpu = GpuSpec(model="l4", count=1, memory_mib=22888)
    return Catalog(
        cloud="aws",
        region="r",
        types=(
            InstanceType(
                name="g.zonal",
                vcpus=8,
                memory_mib=32768,
                gpu=gpu,
                zones=("z-a", "z-b"),
                price_per_hour=1.0,
                zone_provisioning=(("z-b", ("spot",)),),
            ),
            InstanceType(name="g.dear", vcpus=8, memory_mib=32768, gpu=gpu, zones=("z-a", "z-b"),
                         price_per_hour=2.0),
        ),
    )  # fmt: skip


def test_per_zone_terms_restrict_the_zones_a_candidate_may_use() -> None:
    catalog = _zonal()
    on_demand = select(catalog, InstanceRequest(gpus=1)).selected
    assert (on_demand.name, on_demand.zones) == ("g.zonal", ("z-a",))
    spot = select(catalog, InstanceRequest(gpus=1, provisioning="spot")).selected
    assert (spot.name, spot.zones) == ("g.zonal", ("z-a", "z-b"))
    pinned = select(catalog, InstanceRequest(gpus=1, zone="z-b"))
    assert pinned.selected.name == "g.dear"
    why = {r.name: r.reason for r in pinned.rejections}
    assert why["g.zonal"] == "sold only as spot, not on-demand"


def test_the_selection_says_why_a_type_was_not_chosen() -> None:
    catalog = snapshots.load_catalog("gcp")
    selection = select(catalog, InstanceRequest(gpus=8))
    not_sold = {r.name: r.reason for r in selection.not_sold()}
    assert set(not_sold) >= {"a4-highgpu-8g", "a3-ultragpu-8g"}
    assert "reservation" in not_sold["a4-highgpu-8g"]


def test_select_says_which_types_were_not_chosen_and_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from adaptor.cli.main import main

    ask = ["select", "--provider", "azure", "--gpus", "1", "--gpu-model", "h100-nvl"]
    assert main(ask) == 0
    out = capsys.readouterr().out
    assert out.startswith("selected: Standard_NC40ads_H100_v5")
    assert "not chosen: Standard_NCC40ads_H100_v5: a confidential VM size" in out
    assert main([*ask, "--confidential"]) == 0
    assert capsys.readouterr().out.startswith("selected: Standard_NCC40ads_H100_v5")

    b200 = ["select", "--provider", "gcp", "--gpus", "8", "--gpu-model", "b200"]
    assert main(b200) != 0
    err = capsys.readouterr().err
    assert "not sold on-demand" in err and "a4-highgpu-8g" in err
    assert main([*b200, "--reservation", "my-reservation", "--output", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["selected"] == "a4-highgpu-8g" and data["request"]["reservation"]
