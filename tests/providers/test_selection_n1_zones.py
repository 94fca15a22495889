"""GCP N1 with attachable GPUs: only in the zones that have the GPU, named for the provider."""

from __future__ import annotations

import pytest

from adaptor.planning.placement import Placement
from providers.core.base import Accelerator, Instance
from providers.core.catalog import AttachableGpu, Catalog, InstanceType
from providers.core.contract import GpuIntent, VMIntent
from providers.core.errors import NoMatch
from providers.core.request import InstanceRequest
from providers.core.selection import select
from providers.core.snapshots import load_snapshot

P100 = AttachableGpu(model="p100", memory_mib=16384, counts=(1, 2, 4), zones=("z-c", "z-f"))
T4 = AttachableGpu(model="t4", memory_mib=16384, counts=(1, 2, 4))


def catalog(*types: InstanceType) -> Catalog:
    return Catalog(cloud="gcp", region="z", types=types)


def n1(name: str, zones: tuple[str, ...], *gpus: AttachableGpu, vcpus: int = 4) -> InstanceType:
    return InstanceType(
        name=name, vcpus=vcpus, memory_mib=15360, attachable_gpus=gpus, zones=zones, family="n1"
    )


def test_candidate_carries_the_zones_that_have_its_gpu() -> None:
    c = catalog(n1("n1-standard-4", ("z-a", "z-b", "z-c", "z-f"), P100, T4))
    found = select(c, InstanceRequest(gpus=2, gpu_models=("p100",))).selected
    assert (found.gpu_model, found.attach_gpus, found.zones) == ("p100", 2, ("z-c", "z-f"))
    anywhere = select(c, InstanceRequest(gpus=1, gpu_models=("t4",))).selected
    assert (anywhere.gpu_model, anywhere.zones) == ("t4", ())


def test_a_zone_in_the_request_filters() -> None:
    c = catalog(n1("n1-standard-4", ("z-a", "z-c", "z-f"), P100))
    there = select(c, InstanceRequest(gpus=1, gpu_models=("p100",), zone="z-f")).selected
    assert there.zones == ("z-f",)
    with pytest.raises(NoMatch, match="offered in zone z-a"):
        select(c, InstanceRequest(gpus=1, gpu_models=("p100",), zone="z-a")).selected  # noqa: B018


def test_gpu_zones_outside_the_types_zones_never_match() -> None:
    c = catalog(
        n1("n1-standard-4", ("z-a", "z-b"), P100),
        n1("n1-standard-8", ("z-c",), P100, vcpus=8),
    )
    selection = select(c, InstanceRequest(gpus=1, gpu_models=("p100",)))
    assert [(x.name, x.zones) for x in selection.candidates] == [("n1-standard-8", ("z-c",))]
    assert [r.reason for r in selection.rejections] == [
        "p100 cannot be attached in any zone offering n1-standard-4"
    ]


def test_an_other_gpu_of_the_same_type_serves_where_the_first_is_missing() -> None:
    c = catalog(n1("n1-standard-4", ("z-a", "z-c"), P100, T4))
    found = select(c, InstanceRequest(gpus=1, gpu_models=("p100", "t4"), zone="z-a")).selected
    assert (found.gpu_model, found.zones) == ("t4", ())


@pytest.fixture(scope="module")
def gcp() -> Catalog:
    return load_snapshot("gcp", "us-central1", None)


def intent(gpus: int, *models: str) -> VMIntent:
    return VMIntent(pod_name="p", pod_namespace="ns", gpu=GpuIntent(gpus=gpus, models=models))


def test_placement_types_n1_candidates_with_their_attached_gpus(gcp: Catalog) -> None:
    placement = Placement(catalog=gcp)
    candidates = placement.candidates(intent(2, "p100"))
    assert candidates and all(c.accelerator == Accelerator("p100", 2) for c in candidates)
    first = candidates[0]
    assert first.instance_type in gcp.by_name()
    assert gcp.by_name()[first.instance_type].attachable_gpus
    assert first.zones  # P100 attaches in some zones only
    bundled = placement.candidates(intent(1, "l4"))
    assert bundled and all(c.accelerator is None for c in bundled)  # G2 carries its L4 itself


def test_placement_keeps_to_the_providers_zones(gcp: Catalog) -> None:
    no_p100 = Placement(catalog=gcp, zones=("us-central1-a", "us-central1-b"))
    with pytest.raises(NoMatch, match="us-central1-a, us-central1-b"):
        no_p100.candidates(intent(1, "p100"))
    assert no_p100.candidates(intent(1, "t4"))  # T4 attaches in every zone
    with_p100 = Placement(catalog=gcp, zones=("us-central1-a", "us-central1-f"))
    assert with_p100.candidates(intent(1, "p100"))


async def test_device_plans_of_n1_candidates_and_vms(gcp: Catalog) -> None:
    placement = Placement(catalog=gcp)
    plan = await placement.plan(intent(2, "t4"), "sb")
    assert list(plan.devices_by_model()) == ["t4"]
    # The VM reports its machine type alone; its plan still has the two attached GPUs.
    machine = plan.candidates[0].instance_type
    vm = Instance(id="z/vm", name="vm", addresses=("127.0.0.1",), instance_type=machine)
    devices = plan.devices_for(vm)
    assert len(devices.gpus) == 2
    assert devices.to_json() == plan.devices_by_model()["t4"].to_json()
