"""Pods a tenant can send that once made the webhook answer HTTP 500 (or admit what can never
start): every one is now a review answer, a denial with a 4xx code and a reason, through the
live server. Mutating admission sees objects before the API server validates them, so
malformed shapes are reachable too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from providers.core.catalog import Catalog
from tests.webhook.conftest import Running, container, patch_of, pod, post, review, serve
from tests.webhook.test_dra import CLASSES, exactly, template
from webhook import MemoryResolver, Settings

VM = {"kata.peerpods.io/vm": "1"}
LONG = "r" * 63


def _claim_pod() -> dict[str, Any]:
    main = {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "x" * 63}]}}
    return pod(main, resourceClaims=[{"name": "x" * 63, "resourceClaimTemplateName": "long"}])


DENIED: dict[str, tuple[dict[str, Any], str]] = {
    "rdma a+b 64 each": (pod(container("c", limits={"rdma/a": "64", "rdma/b": "64"})),
                         "128 RDMA devices in all"),
    "5000-digit gpu count": (pod(container("c", limits={"nvidia.com/gpu": "9" * 5000})),
                             "5000-digit device count"),
    "5000-digit rdma count": (pod(container("c", limits={"rdma/ib": "9" * 5000})),
                              "5000-digit device count"),
    "non-ASCII digit": (pod(container("c", limits={"nvidia.com/gpu": "٣"})),
                        "expected a whole number of devices"),
    "superscript two": (pod(container("c", limits={"nvidia.com/gpu": "²"})),
                        "expected a whole number of devices"),
    "resources not a map": (pod({"name": "c", "resources": [1]}), "resources is not a map"),
    "container name too long for a unit id": (
        pod(container("c" * 300, limits={"nvidia.com/gpu": "1"})), "at most 128 characters"),
    "63-char claim + 63-char request": (_claim_pod(), "too long together"),
    "100+ nested parentheses": (
        pod({"name": "c", "image": "b", "resources": {"claims": [{"name": "p"}]}},
            resourceClaims=[{"name": "p", "resourceClaimTemplateName": "parens"}]),
        "nested too deeply"),
}  # fmt: skip

# Contract values a user wrote are never read (tests/webhook/test_contract_trust.py): however
# malformed, they are removed and the pod gets what its resources ask for.
STRIPPED: dict[str, dict[str, Any]] = {
    "5000-digit vcpus annotation": pod(
        container("c", limits=VM),
        annotations={"io.katacontainers.config.hypervisor.default_vcpus": "9" * 5000},
    ),
    "superscript in an annotation": pod(
        container("c", limits=VM),
        annotations={"io.katacontainers.config.hypervisor.default_gpus": "²"},
    ),
}


@pytest.fixture(scope="module")
def running(tls_dir: Path, ca: trustme.CA, catalog: Catalog) -> Iterator[Running]:
    objects = [
        *yaml.safe_load_all(CLASSES),
        template("long", [exactly(LONG)]),
        template("parens", [exactly("gpu", "gpu.nvidia.com", "(" * 120 + "true" + ")" * 120)]),
    ]
    yield from serve(tls_dir, ca, Settings(), catalog, MemoryResolver(objects))


@pytest.mark.parametrize("case", sorted(DENIED))
def test_denied_with_a_reason(running: Running, case: str) -> None:
    p, reason = DENIED[case]
    answer = post(running, review(p))  # asserts HTTP 200
    assert answer["allowed"] is False
    assert 400 <= answer["status"]["code"] < 500, answer
    assert reason in answer["status"]["message"], answer["status"]["message"]
    assert "Traceback" not in answer["status"]["message"]


@pytest.mark.parametrize("case", sorted(STRIPPED))
def test_user_written_contract_values_are_removed(running: Running, case: str) -> None:
    answer = post(running, review(STRIPPED[case]))
    assert answer["allowed"] is True, answer
    removed = {op["path"] for op in patch_of(answer) if op["op"] == "remove"}
    assert any("hypervisor.default_" in path for path in removed), removed


@pytest.mark.parametrize(
    "quantity", ["1e999999", "1e99999999999Ki", "9" * 5000, "0.000000000000000000001"]
)
def test_extreme_quantities_are_capped_as_kubernetes_caps_them(
    running: Running, quantity: str
) -> None:
    answer = post(running, review(pod(container("c", limits={"cpu": quantity}))))
    assert answer["allowed"] is True or 400 <= answer["status"]["code"] < 500, answer


@pytest.mark.parametrize("runtime_class", [["kata-remote"], {"a": 1}, 7])
def test_a_runtime_class_that_is_not_a_string_is_not_a_peer_pod(
    running: Running, runtime_class: Any
) -> None:
    p = pod(container("c", limits={"nvidia.com/gpu": "1"}), runtime=None)
    p["spec"]["runtimeClassName"] = runtime_class
    p["spec"]["resourceClaims"] = [{"name": "x", "resourceClaimTemplateName": "long"}]
    answer = post(running, review(p))  # HTTP 200, not 500
    assert answer["allowed"] is True and "patch" not in answer
