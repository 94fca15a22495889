"""What a tenant may not do to its peer pod, through the live webhook: change the contract
annotations after admission (UPDATE), or choose its pod VM image or initdata unless the operator
allows it (per namespace, or an allowed image)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import trustme

from providers.core.catalog import Catalog
from providers.core.contract import CC_INIT_DATA, DEFAULT_GPUS, DEVICES, IMAGE
from tests.webhook.conftest import Running, container, patch_of, pod, post, review, serve
from webhook import Settings, VmChoices

ALLOWED_IMAGE = "ami-0approved"


@pytest.fixture(scope="module")
def running(tls_dir: Path, ca: trustme.CA, catalog: Catalog) -> Iterator[Running]:
    choices = VmChoices(namespaces=frozenset({"trusted"}), images=frozenset({ALLOWED_IMAGE}))
    yield from serve(tls_dir, ca, Settings(), catalog, vm_choices=choices)


def _update(old: dict[str, Any], new: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    body = review(new, namespace, operation="UPDATE")
    body["request"]["oldObject"] = old
    return body


def _admitted(running: Running, p: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    p["metadata"]["namespace"] = namespace
    answer = post(running, review(p, namespace))
    assert answer["allowed"] is True, answer
    return jsonpatch.apply_patch(p, patch_of(answer))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (DEFAULT_GPUS, "8"),  # more GPUs than admitted
        (DEVICES, None),  # the device plan dropped
        ("cdi.k8s.io/grab", "nvidia.com/gpu=all"),  # devices by annotation
        ("io.katacontainers.config.hypervisor.machine_type", "p5.48xlarge"),
        (IMAGE, "ami-mine"),
    ],
)
def test_contract_annotations_cannot_change_after_admission(
    running: Running, key: str, value: str | None
) -> None:
    admitted = _admitted(running, pod(container("c", limits={"nvidia.com/gpu": "1"})))
    changed = copy.deepcopy(admitted)
    annotations = changed["metadata"]["annotations"]
    if value is None:
        annotations.pop(key)
    else:
        annotations[key] = value
    answer = post(running, _update(admitted, changed))
    if value is None or key.startswith("cdi.k8s.io/"):
        # what a re-apply does (server-side apply drops the keys the webhook added; a manifest
        # may carry CDI annotations the webhook removed): put back as admitted, not denied
        assert answer["allowed"] is True
        stored = jsonpatch.apply_patch(changed, patch_of(answer))
        assert stored["metadata"]["annotations"] == admitted["metadata"]["annotations"]
        return
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    assert key in answer["status"]["message"]


def test_other_updates_pass_untouched(running: Running) -> None:
    admitted = _admitted(running, pod(container("c", limits={"nvidia.com/gpu": "1"})))
    changed = copy.deepcopy(admitted)
    changed["metadata"]["annotations"]["example.com/owner"] = "team-a"
    changed["metadata"]["labels"] = {"app": "x"}
    answer = post(running, _update(admitted, changed))
    assert answer["allowed"] is True and patch_of(answer) == []
    # a pod that is not a peer pod is none of the webhook's business
    plain = pod(container("c"), runtime=None)
    other = copy.deepcopy(plain)
    other["metadata"]["annotations"] = {DEFAULT_GPUS: "8"}
    assert post(running, _update(plain, other))["allowed"] is True


def _vm_choice_pod(image: str) -> dict[str, Any]:
    p = pod(container("c", limits={"cpu": "1"}))
    p["metadata"]["annotations"] = {IMAGE: image, CC_INIT_DATA: "H4sIAAAAAAAA/wMAAAAAAAAAAAA="}
    return p


def test_vm_image_and_initdata_removed_unless_allowed(running: Running) -> None:
    stripped = _admitted(running, _vm_choice_pod("ami-mine"), "tenant")
    annotations = stripped["metadata"]["annotations"]
    assert IMAGE not in annotations and CC_INIT_DATA not in annotations
    again_pod = _vm_choice_pod("ami-mine")
    again_pod["metadata"]["namespace"] = "tenant"
    answer = post(running, review(again_pod, "tenant"))
    assert any(IMAGE in w and "operator policy" in w for w in answer["warnings"])
    # an allowed image is kept; initdata still needs the namespace
    kept = _admitted(running, _vm_choice_pod(ALLOWED_IMAGE), "tenant")["metadata"]["annotations"]
    assert kept[IMAGE] == ALLOWED_IMAGE and CC_INIT_DATA not in kept
    # a trusted namespace may choose both
    trusted = _admitted(running, _vm_choice_pod("ami-mine"), "trusted")["metadata"]["annotations"]
    assert trusted[IMAGE] == "ami-mine" and CC_INIT_DATA in trusted
    # and the result is a fixed point: a second pass changes nothing
    again = post(running, review(stripped, "tenant"))
    assert again["allowed"] is True and patch_of(again) == []
