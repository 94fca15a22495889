"""The layout the adaptor sends: every name CreateContainer may carry, whichever candidate the VM
turns out to be."""

from __future__ import annotations

from adaptor.planning.placement import Placement
from adaptor.podvm.layout import Layout, LayoutDocument, parse_document
from providers.core import contract
from providers.core.base import Instance
from providers.core.snapshots import load_snapshot


def intent_for(model_field: str, gpus: int = 1) -> contract.VMIntent:
    return contract.parse_vm_annotations(
        {
            contract.SANDBOX_NAME: "p",
            contract.SANDBOX_NAMESPACE: "default",
            contract.DEFAULT_GPUS: str(gpus),
            contract.DEFAULT_GPU_MODEL: model_field,
        }
    )


async def test_the_layout_names_every_rdma_device_any_candidate_of_the_model_has() -> None:
    placement = Placement(catalog=load_snapshot("aws", "us-east-1"))
    planned = await placement.plan(intent_for("v1:m=h100;rdma=1"), "sb")
    names = [c.instance_type for c in planned.candidates]
    assert names[:2] == ["p5.4xlarge", "p5.48xlarge"]  # 1 EFA device, then 32
    sent = LayoutDocument.from_plans(planned.devices_by_model().values())
    (layout,) = sent.layouts
    for name in names:  # a capacity fallback may land on either
        stored = planned.devices_for(Instance("i", "vm", ("10.0.0.1",), name))
        assert set(stored.default) <= set(layout.names()), name


async def test_a_plan_becomes_a_layout_and_back() -> None:
    placement = Placement(catalog=load_snapshot("aws", "us-east-1"))
    planned = await placement.plan(intent_for("v1:mig=1g.10gb:2,3g.40gb:1", gpus=1), "sb")
    first = planned.candidates[0].instance_type
    plan = planned.devices_for(Instance("i", "vm", ("10.0.0.1",), first))
    layout = Layout.from_plan(plan)
    assert layout.names() == [*plan.gpus, *(m.name for m in plan.mig), *plan.rdma]
    doc = LayoutDocument(layouts=(layout,))
    assert parse_document(doc.to_dict(), "apf.json") == doc
