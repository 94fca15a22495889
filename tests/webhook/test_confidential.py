"""A pod asks for confidential computing; only then may a confidential VM size serve it.

Source: Azure NCCadsH100v5 sizes (https://learn.microsoft.com/azure/virtual-machines/sizes/
gpu-accelerated/nccadsh100v5-series): confidential VMs whose H100 NVL runs in confidential mode;
an ordinary pod must not land there, and a pod that asks must land nowhere else. The request
rides in `default_gpu_model` (`cc`), the one value Kata forwards that the webhook writes.
"""

from __future__ import annotations

from typing import Any

import pytest

from adaptor.cli.pod_plan import plan_manifest
from providers.core.contract import GpuIntent, decode_gpu_model, encode_gpu_model
from webhook._mutate import CONFIDENTIAL_ANNOTATION


def _pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {
            "runtimeClassName": "kata-remote",
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {
                "nvidia.com/gpu": "1"}}}],
        },
    }  # fmt: skip


def test_the_contract_carries_the_ask() -> None:
    intent = GpuIntent(gpus=1, models=("h100-nvl",), confidential=True)
    encoded = encode_gpu_model(intent)
    assert encoded == "v1:m=h100-nvl;cc"
    assert decode_gpu_model(encoded, 1) == intent
    assert not decode_gpu_model("v1:m=h100-nvl", 1).confidential


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [({}, "Standard_NC"), ({CONFIDENTIAL_ANNOTATION: "true"}, "Standard_NCC40ads_H100_v5")],
)
def test_only_a_pod_that_asks_gets_a_confidential_size(
    annotations: dict[str, str], expected: str
) -> None:
    report = plan_manifest([_pod(annotations)], "azure")
    assert report.ok, report.failure
    assert report.selection is not None
    chosen = report.selection.selected
    assert chosen.name.startswith(expected)
    assert chosen.instance_type.confidential is bool(annotations)
    assert all(c.instance_type.confidential is bool(annotations)
               for c in report.selection.candidates)  # fmt: skip


def test_a_confidential_pod_on_a_cloud_without_such_a_size_is_refused_saying_why() -> None:
    report = plan_manifest([_pod({CONFIDENTIAL_ANNOTATION: "true"})], "aws")
    assert not report.ok and report.failure is not None
    assert "confidential" in report.failure.message


def test_a_bad_value_is_a_clear_denial() -> None:
    report = plan_manifest([_pod({CONFIDENTIAL_ANNOTATION: "yes please"})], "azure")
    assert not report.ok and report.failure is not None
    assert "peerpods.io/confidential: want true or false" in report.failure.message
