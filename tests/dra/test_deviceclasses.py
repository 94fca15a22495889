"""config/deploy/dra: every object validates for 1.36, and the DeviceClasses' selectors, run by
the CEL engine against the devices the publisher makes, pick exactly what they promise, and
never fail on a device that lacks an attribute they read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from providers.core.snapshots import CatalogLoader
from providers.dra import build_pool
from webhook._allocate import cel_device
from webhook._cel import compile_selector, evaluate

DRA = Path(__file__).resolve().parents[2] / "config" / "deploy" / "dra"


def documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((DRA / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((DRA / name).read_text()) if d]
    return docs


def classes() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in documents() if d["kind"] == "DeviceClass"}


def published() -> list[dict[str, Any]]:
    pool = build_pool(CatalogLoader(None).load("aws", "us-east-1"), {"l4": 2, "h100-80gb": 2})
    return [d for s in pool.slices(1) for d in s["spec"].get("devices", [])]


def matches(device_class: dict[str, Any], driver: str, device: dict[str, Any]) -> bool:
    activation = cel_device(driver, device)
    return all(
        evaluate(compile_selector(s["cel"]["expression"]), activation)
        for s in device_class["spec"]["selectors"]
    )


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_object_validates_for_1_36(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, "1.36.0", strict=True)


def test_one_class_maps_nvidia_gpu_and_the_claims_class_maps_none() -> None:
    found = classes()
    mapped = [n for n, c in found.items() if c["spec"].get("extendedResourceName")]
    assert [found[n]["spec"]["extendedResourceName"] for n in mapped] == ["nvidia.com/gpu"]
    assert "extendedResourceName" not in found["gpu.peerpods.io"]["spec"]


def test_the_whole_gpu_classes_take_exactly_the_exclusive_devices() -> None:
    devices = published()
    for name in ("gpu.peerpods.io", "nvidia-gpu.gpu.peerpods.io"):
        picked = [d["name"] for d in devices if matches(classes()[name], "gpu.peerpods.io", d)]
        assert picked == [d["name"] for d in devices if not d.get("allowMultipleAllocations")]


def test_the_fraction_class_takes_exactly_the_shared_devices() -> None:
    devices = published()
    picked = [
        d["name"]
        for d in devices
        if matches(classes()["fraction.gpu.peerpods.io"], "gpu.peerpods.io", d)
    ]
    assert picked == [d["name"] for d in devices if d.get("allowMultipleAllocations")]
    assert picked  # the l4 shares of g6f


@pytest.mark.parametrize(
    "name", ["gpu.peerpods.io", "nvidia-gpu.gpu.peerpods.io", "fraction.gpu.peerpods.io"]
)
def test_a_device_missing_attributes_is_no_match_never_an_error(name: str) -> None:
    bare = {"name": "gpu-0", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}}}
    assert not matches(classes()[name], "gpu.peerpods.io", bare)
    other = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}
    assert not matches(classes()[name], "gpu.nvidia.com", other)
    # a device of ours without `type` but with `shared`
    no_type = {"name": "x", "attributes": {"shared": {"bool": False}}}
    assert not matches(classes()[name], "gpu.peerpods.io", no_type)


def test_the_shipped_classes_are_the_ones_plan_uses() -> None:
    from providers.dra.classes import device_classes

    assert classes() == device_classes()
