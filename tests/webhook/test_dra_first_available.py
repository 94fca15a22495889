"""DRA `firstAvailable` falls through to the next subrequest when the pod cannot run on any type
the first one matches, as Kubernetes moves on to the next subrequest it can allocate.

Sources: the Kubernetes DRA docs (https://kubernetes.io/docs/concepts/scheduling-eviction/
dynamic-resource-allocation/, "prioritized list": "the scheduler ... will try the subrequests in
the order they are listed, and use the first one that can be satisfied"); the bundled GCP
catalog per GCP's accelerator-optimized machine docs (A4X: GB200 with Arm Grace CPUs, arm64
only) and Azure's ND GB200 v6 (Grace, arm64); the pod VM image here is x86_64.
"""

from __future__ import annotations

from typing import Any

import pytest

from adaptor.cli.pod_plan import plan_manifest
from tests.webhook.test_dra_choice import CLASSES

Doc = dict[str, Any]


def first_available(*subrequests: tuple[str, str]) -> list[Doc]:
    subs = [
        {
            "name": name,
            "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": expression}}],
        }
        for name, expression in subrequests
    ]
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "r", "firstAvailable": subs}]}}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "runtimeClassName": "kata-remote",
            "resourceClaims": [{"name": "c", "resourceClaimTemplateName": "t"}],
            "containers": [
                {"name": "main", "image": "x", "resources": {"claims": [{"name": "c"}]}}
            ],
        },
    }
    return [*CLASSES, template, pod]


def product(name: str) -> str:
    return f"device.attributes['gpu.nvidia.com'].productName == '{name}'"


@pytest.mark.parametrize("provider", ["gcp", "azure"])
def test_an_arm64_only_first_subrequest_falls_through(provider: str) -> None:
    """GB200 exists only on arm64 types (GCP a4x, Azure ND GB200 v6): an x86_64 pod VM gets the
    second subrequest's H100, with a warning saying why."""
    report = plan_manifest(
        first_available(("gb200", product("NVIDIA GB200")), ("h100", "device.attributes["
                        "'gpu.nvidia.com'].productName.matches('H100')")),
        provider,
    )  # fmt: skip
    assert report.ok, report.failure
    assert report.selection is not None
    chosen = report.selection.selected
    assert chosen.gpu_model in ("h100-80gb", "h100-nvl"), chosen.name
    assert chosen.instance_type.arch == "x86_64"
    assert any("h100 serves it" in w and "firstAvailable" in w for w in report.warnings), (
        report.warnings
    )


def test_the_first_subrequest_wins_when_it_can_be_served_even_if_dearer() -> None:
    """Order, not price, decides between subrequests: H100 first is taken though L4 is cheaper."""
    report = plan_manifest(
        first_available(("h100", product("NVIDIA H100 80GB HBM3")), ("l4", product("NVIDIA L4"))),
        "gcp",
    )
    assert report.ok, report.failure
    assert report.selection is not None
    assert report.selection.selected.gpu_model == "h100-80gb"
    assert not any("firstAvailable" in w for w in report.warnings)


def test_no_subrequest_the_pod_can_run_on_is_a_denial() -> None:
    report = plan_manifest(first_available(("gb200", product("NVIDIA GB200"))), "gcp")
    assert not report.ok
    assert report.failure is not None


def test_a_first_subrequest_not_sold_as_the_pod_buys_falls_through() -> None:
    """GCP sells B200 (A4) only through reservations, Flex-start and Spot: an on-demand pod's
    first subrequest for it falls through to the A100; a Spot pod keeps the B200."""
    docs = first_available(("b200", product("NVIDIA B200")), ("a100", "device.attributes["
                           "'gpu.nvidia.com'].productName.matches('A100')"))  # fmt: skip
    report = plan_manifest(docs, "gcp")
    assert report.ok, report.failure
    assert report.selection is not None
    assert report.selection.selected.gpu_model in ("a100-40gb", "a100-80gb")
    assert any("a100 serves it" in w for w in report.warnings), report.warnings
    docs[-1]["metadata"]["annotations"] = {"peerpods.io/capacity-type": "spot"}
    spot = plan_manifest(docs, "gcp", capacity=_spot_allowed())
    assert spot.ok, spot.failure
    assert spot.selection is not None and spot.selection.selected.gpu_model == "b200"


def _spot_allowed() -> Any:
    from providers.core.capacity import CapacityType
    from webhook._capacity import CapacityPolicy

    return CapacityPolicy(allowed={"*": tuple(CapacityType)})
