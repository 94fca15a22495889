"""A catalog for every Azure and GCP region whose price list sells a GPU type we bundle.

The lists are the clouds' own per-region price lists as skypilot-org/skypilot-catalog stores
them: GCP `catalogs/v8/gcp/vms.csv` @006059e0f18acb1341e22a27751e9f80df6ba92f (machine rows with
zones, GPUs priced on accelerator rows), Azure `catalogs/v6/azure/vms.csv`
@098741e70562f65d7af1cceb81e33b284f742604 (US regions only, no zones). LISTED below is, per
region, what those files name of the recorded region's GPU types (GCP: the GPU machine families,
and `n1+<gpu>` where the region lists N1 machines and that accelerator); westeurope and the other
Azure regions outside the US are not in the list, asia-northeast2 and australia-southeast2 list N1
machines but no GPU. scripts/make_catalogs.py builds these snapshots from a working extract of
those rows; this test holds the bundle to the list.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from providers.core.catalog import Catalog
from providers.core.offers import offer_for
from providers.core.request import InstanceRequest
from providers.core.selection import select
from providers.core.snapshots import CatalogLoader, available_snapshots, load_catalog
from tests.providers.catalog_script import make_catalogs

ROOT = Path(__file__).resolve().parents[2]
RECORDED: dict[str, str] = make_catalogs().RECORDED  # the region each cloud was recorded in

GCP_LISTED = {
    "asia-east1": "a3 g2 n1+p100 n1+t4 n1+v100",
    "asia-east2": "n1+t4",
    "asia-northeast1": "a2 a3 a4 g2 n1+t4",
    "asia-northeast3": "a2 a3 g2 n1+t4",
    "asia-south1": "a3 g2 n1+t4",
    "asia-south2": "a3",
    "asia-southeast1": "a2 a3 a4 g2 n1+p4 n1+t4",
    "asia-southeast2": "n1+t4",
    "australia-southeast1": "a3 n1+p100 n1+p4 n1+t4",
    "europe-central2": "n1+t4",
    "europe-north1": "a3 a4",
    "europe-west1": "a3 g2 n1+p100 n1+t4",
    "europe-west2": "a3 g2 n1+t4",
    "europe-west3": "a3 g2 n1+t4",
    "europe-west4": "a2 a3 a4 g2 n1+p100 n1+p4 n1+t4 n1+v100",
    "europe-west6": "g2",
    "europe-west8": "a3",
    "europe-west9": "a3",
    "me-central2": "g2",
    "me-west1": "a2 n1+t4",
    "northamerica-northeast1": "g2 n1+p4 n1+t4",
    "northamerica-northeast2": "a3 g2",
    "southamerica-east1": "n1+t4",
    "us-central1": "a2 a3 a4 g2 n1+p100 n1+p4 n1+t4 n1+v100",
    "us-east1": "a2 a4 g2 n1+p100 n1+t4 n1+v100",
    "us-east4": "a2 a3 a4 g2 n1+p4 n1+t4",
    "us-east5": "a2 a3",
    "us-south1": "a3 a4",
    "us-west1": "a2 a3 g2 n1+p100 n1+t4 n1+v100",
    "us-west2": "a4 n1+p4 n1+t4",
    "us-west3": "a2 a4 n1+t4",
    "us-west4": "a2 a3 g2 n1+t4",
}
_T4 = "NC16as_T4_v3 NC4as_T4_v3 NC64as_T4_v3 NC8as_T4_v3"
_A100 = "NC24ads_A100_v4 NC48ads_A100_v4 NC96ads_A100_v4"
_A10 = "NV36ads_A10_v5 NV72ads_A10_v5"
_H100 = "NC40ads_H100_v5 NC80adis_H100_v5"
AZURE_LISTED = {
    "centralus": f"{_T4} {_A100}",
    "eastus": f"{_T4} {_A100} {_A10} {_H100} ND96amsr_A100_v4 ND96asr_v4 ND96isr_H100_v5",
    "eastus2": f"{_T4} {_A100} {_A10} {_H100} NCC40ads_H100_v5 ND96amsr_A100_v4 ND96isr_H100_v5",
    "northcentralus": f"{_T4} {_A10}",
    "southcentralus": f"{_T4} {_A100} {_A10} {_H100} ND96amsr_A100_v4 ND96asr_v4",
    "westus": f"{_T4} {_A100} {_A10} ND96isr_H100_v5",
    "westus2": f"{_T4} {_A100} {_A10} ND96asr_v4",
    "westus3": f"{_T4} {_A100} {_A10} {_H100}",
}
LISTED = {"gcp": GCP_LISTED, "azure": AZURE_LISTED}
MADE = [(c, r) for c, regions in LISTED.items() for r in sorted(regions) if r != RECORDED[c]]


def _summary(catalog: Catalog) -> str:
    """What a GCP or Azure catalog bundles with GPUs, in LISTED's words."""
    found: set[str] = set()
    for t in catalog.types:
        if catalog.cloud == "azure" and t.gpu is not None:
            found.add(t.name.removeprefix("Standard_"))
        elif catalog.cloud == "gcp" and t.gpu is not None:
            found.add(t.name.split("-")[0])
        found.update(f"n1+{a.model}" for a in t.attachable_gpus)
    return " ".join(sorted(found))


@pytest.mark.parametrize("cloud", sorted(LISTED))
def test_every_region_whose_list_sells_gpus_is_bundled(cloud: str) -> None:
    assert set(available_snapshots(cloud)) == set(LISTED[cloud])
    maker = make_catalogs()
    made = {"gcp": maker.GCP_SOURCE_REGIONS, "azure": maker.AZURE_SOURCE_REGIONS}[cloud]
    assert {RECORDED[cloud], *made} == set(LISTED[cloud])
    assert "westeurope" not in available_snapshots("azure")  # not in the list: no Azure EU row


@pytest.mark.parametrize(("cloud", "region"), MADE)
def test_a_region_bundles_what_its_list_names_there(cloud: str, region: str) -> None:
    catalog = load_catalog(cloud, region)
    assert (catalog.cloud, catalog.region) == (cloud, region)
    assert _summary(catalog) == " ".join(sorted(LISTED[cloud][region].split()))
    assert catalog.source.startswith("snapshot: skypilot-org/skypilot-catalog catalogs/v")
    recorded = load_catalog(cloud, RECORDED[cloud]).by_name()
    for t in catalog.types:
        kept = recorded[t.name]  # shapes and GPU memory are the recorded region's
        assert (t.vcpus, t.memory_mib, t.gpu, t.arch, t.rdma) == (
            kept.vcpus,
            kept.memory_mib,
            kept.gpu,
            kept.arch,
            kept.rdma,
        )
        offer = offer_for(cloud, t.name)  # sold the way the cloud sells it everywhere
        assert (t.provisioning, t.confidential) == (offer.provisioning, offer.confidential)
        if cloud == "azure":
            assert t.zones == ()  # the list has no zones
        else:
            assert t.zones and all(z.startswith(f"{region}-") for z in t.zones)
            for a in t.attachable_gpus:
                assert set(a.zones) <= set(t.zones)


def test_a_list_figure_of_another_sku_is_not_taken() -> None:
    # the list prices one A100 in europe-west4 at $1.61365 against $2.93391 in us-central1 (the
    # Cloud Billing Catalog's): not the A2 list price, so a2-highgpu-1g is named as not sourced
    west4 = load_catalog("gcp", "europe-west4").by_name()
    assert west4["a2-highgpu-1g"].price_per_hour is None
    assert west4["g2-standard-4"].price_per_hour == pytest.approx(0.15429 + 0.58804, abs=1e-5)
    assert west4["n1-standard-4"].attachable_gpus[0].price_per_hour is not None
    with (ROOT / "providers/snapshots/prices/unpriced.csv").open(newline="") as handle:
        gaps = {(r["cloud"], r["region"], r["instance_type"]): r for r in csv.DictReader(handle)}
    gap = gaps[("gcp", "europe-west4", "a2-highgpu-1g")]
    assert gap["missing"] == "on-demand spot"
    assert "0.55x its us-central1 one" in gap["why"]


@pytest.mark.parametrize(
    ("cloud", "region", "model", "name", "price"),
    [
        ("gcp", "europe-west4", "l4", "g2-standard-4", 0.74233),
        ("gcp", "asia-east2", "t4", "n1-standard-1", 0.06646 + 0.44),
        ("azure", "westus2", "a100", "Standard_NC24ads_A100_v4", 3.673),
        ("azure", "northcentralus", "a10", "Standard_NV36ads_A10_v5", 3.84),
    ],
)
def test_select_picks_from_a_list_made_region_offline(
    cloud: str, region: str, model: str, name: str, price: float
) -> None:
    # the webhook and `serve` read their catalog through a CatalogLoader, as this does
    catalog = CatalogLoader().load(cloud, region)
    chosen = select(catalog, InstanceRequest(gpus=1, gpu_models=(model,))).selected
    assert (chosen.name, chosen.price_estimated) == (name, False)
    assert chosen.price_per_hour == pytest.approx(price)


def test_an_a100_in_europe_west4_is_chosen_by_estimate_when_the_list_has_no_price() -> None:
    catalog = CatalogLoader().snapshot("gcp", "europe-west4")
    chosen = select(catalog, InstanceRequest(gpus=1, gpu_models=("a100",))).selected
    assert (chosen.name, chosen.price_estimated) == ("a2-highgpu-1g", True)


def test_the_maker_takes_a_list_figure_only_where_its_recorded_one_is_ours() -> None:
    maker = make_catalogs()
    row = maker.SourceRow

    def rows(a100_here: float, l4_check: float) -> dict[tuple[str, str], object]:
        return {
            ("g2-standard-4", "us-central1"): row(("a",), 0.14679, 0.05874),
            ("gpu:L4*1", "us-central1"): row(("a",), l4_check, 0.2231),
            ("g2-standard-4", "xx-west1"): row(("a", "b"), 0.2, 0.1),
            ("gpu:L4*1", "xx-west1"): row(("a", "b"), 0.6, 0.3),
            ("a2-highgpu-1g", "us-central1"): row(("a",), 0.73948, 0.36975),
            ("gpu:A100*1", "us-central1"): row(("a",), 2.93391, 1.0),
            ("a2-highgpu-1g", "xx-west1"): row(("b",), 1.0, 0.5),
            ("gpu:A100*1", "xx-west1"): row(("b",), a100_here, 1.2),
        }

    made = maker.regional("gcp", "xx-west1", rows(a100_here=3.2, l4_check=0.56004))
    types = made.catalog.by_name()
    assert set(types) == {"g2-standard-4", "a2-highgpu-1g"}
    assert types["g2-standard-4"].zones == ("xx-west1-a", "xx-west1-b")
    assert (types["g2-standard-4"].price_per_hour, types["g2-standard-4"].spot_price_per_hour) == (
        0.8,
        0.4,
    )
    # on demand: host + GPU within range of us-central1's; Spot: the list's us-central1 A100
    # Spot (1.0) does not make the bundled a2-highgpu-1g Spot price, so none is taken
    a2 = types["a2-highgpu-1g"]
    assert (a2.price_per_hour, a2.spot_price_per_hour) == (4.2, None)
    assert [(n, m) for n, m, _ in made.gaps] == [("a2-highgpu-1g", "spot")]
    assert made.catalog.gpu_prices == {"a100-40gb": 3.2, "l4": 0.6}

    # an A100 at half its us-central1 figure is another SKU; an L4 whose us-central1 figure is
    # not ours is not taken anywhere
    made = maker.regional("gcp", "xx-west1", rows(a100_here=1.5, l4_check=0.7))
    types = made.catalog.by_name()
    assert types["a2-highgpu-1g"].price_per_hour is None
    assert types["g2-standard-4"].price_per_hour is None
    why = {n: w for n, _, w in made.gaps}
    assert "0.51x its us-central1 one" in why["a2-highgpu-1g"]
    assert "is not the bundled us-central1 one" in why["g2-standard-4"]


def test_the_maker_takes_no_azure_spot_price_that_repeats_the_on_demand_one() -> None:
    maker = make_catalogs()
    row = maker.SourceRow
    rows = {
        ("Standard_NC40ads_H100_v5", "eastus"): row((), 6.98, 6.98),
        ("Standard_NC40ads_H100_v5", "xxus"): row((), 8.38, 8.38),
        ("Standard_NC4as_T4_v3", "eastus"): row((), 0.526, 0.062699),
        ("Standard_NC4as_T4_v3", "xxus"): row((), 0.631, 0.06941),
    }
    made = maker.regional("azure", "xxus", rows)
    types = made.catalog.by_name()
    assert (types["Standard_NC4as_T4_v3"].price_per_hour, types["Standard_NC4as_T4_v3"].zones) == (
        0.631,
        (),
    )
    assert (
        types["Standard_NC40ads_H100_v5"].price_per_hour,
        types["Standard_NC40ads_H100_v5"].spot_price_per_hour,
    ) == (8.38, None)
    assert [(n, m) for n, m, _ in made.gaps] == [("Standard_NC40ads_H100_v5", "spot")]
