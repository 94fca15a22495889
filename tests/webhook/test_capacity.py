"""The capacity type a pod gets: its annotation, the webhook's default, the namespace policy."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import trustme

from providers.core.capacity import CapacityType
from providers.core.catalog import Catalog
from providers.core.contract import (
    DEFAULT_GPU_MODEL,
    SANDBOX_NAME,
    SANDBOX_NAMESPACE,
    VMIntent,
    parse_vm_annotations,
)
from providers.core.errors import AnnotationError, InvalidRequest
from tests.webhook.conftest import (
    Running,
    admit_via,
    container,
    patch_of,
    pod,
    post,
    review,
    serve,
)
from webhook import (
    CAPACITY_ANNOTATION,
    CapacityPolicy,
    Settings,
    mutate_pod,
    parse_namespace_policy,
)

SPOT, OD, EITHER = CapacityType.SPOT, CapacityType.ON_DEMAND, CapacityType.SPOT_OR_ON_DEMAND
POLICY = CapacityPolicy(
    OD, parse_namespace_policy("ml=spot-or-on-demand|spot, batch=spot, *=on-demand")
)


def ask(value: str | None) -> dict[str, str]:
    return {} if value is None else {CAPACITY_ANNOTATION: value}


def test_default_is_on_demand_and_any_type_when_no_policy() -> None:
    policy = CapacityPolicy()
    assert policy.resolve("default", ask(None)) is OD
    assert [policy.resolve("x", ask(v.value)) for v in CapacityType] == list(CapacityType)
    assert policy.resolve("x", ask(" Spot ")) is SPOT
    assert CapacityPolicy(EITHER).resolve("x", ask(None)) is EITHER


def test_namespace_policy_limits_what_a_pod_may_ask_for() -> None:
    assert POLICY.resolve("ml", ask("spot")) is SPOT
    assert POLICY.resolve("ml", ask(None)) is EITHER  # on-demand not allowed: its first type
    assert POLICY.resolve("batch", ask(None)) is SPOT
    assert POLICY.resolve("web", ask(None)) is OD  # "*"
    assert POLICY.resolve("web", ask("on-demand")) is OD
    with pytest.raises(AnnotationError) as info:
        POLICY.resolve("web", ask("spot"))
    assert str(info.value) == (
        f"annotation {CAPACITY_ANNOTATION}: namespace web may not ask for spot capacity "
        "(allowed there: on-demand)"
    )
    with pytest.raises(AnnotationError, match="allowed there: spot-or-on-demand, spot"):
        POLICY.resolve("ml", ask("on-demand"))


@pytest.mark.parametrize("value", ["preemptible", "", "SPOT!", "spot,on-demand", "x" * 500])
def test_a_value_that_is_not_a_capacity_type_is_denied_naming_the_key(value: str) -> None:
    with pytest.raises(AnnotationError) as info:
        CapacityPolicy().resolve("default", ask(value))
    message = str(info.value)
    assert message.startswith(f"annotation {CAPACITY_ANNOTATION}: ")
    assert "want one of on-demand, spot, spot-or-on-demand" in message and len(message) < 200


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("ml", "is not NAMESPACE=TYPE|TYPE"),
        ("ml=", "is not NAMESPACE=TYPE|TYPE"),
        ("=spot", "is not NAMESPACE=TYPE|TYPE"),
        ("ml=cheap", "'cheap' is not a capacity type"),
        ("ml=spot,ml=on-demand", "namespace ml twice"),
    ],
)
def test_bad_namespace_policy_flag(text: str, error: str) -> None:
    with pytest.raises(InvalidRequest, match=error):
        parse_namespace_policy(text)
    assert parse_namespace_policy("") == {}


# --- through the live webhook ------------------------------------------------------------------


@pytest.fixture(scope="module")
def spot_webhook(tls_dir: Path, ca: trustme.CA, catalog: Catalog) -> Iterator[Running]:
    yield from serve(tls_dir, ca, Settings(capacity=POLICY), catalog)


def gpu_pod(namespace: str, capacity: str | None = None, **annotations: str) -> dict[str, Any]:
    notes = dict(annotations)
    if capacity is not None:
        notes[CAPACITY_ANNOTATION] = capacity
    main = container("main", {"nvidia.com/gpu": 1, "cpu": "2", "memory": "8Gi"})
    p = pod(main, annotations=notes)
    p["metadata"]["namespace"] = namespace
    return p


def createvm_intent(mutated: dict[str, Any], namespace: str) -> VMIntent:
    """What the adaptor reads at CreateVM from the annotations Kata forwards."""
    annotations = dict(mutated["metadata"]["annotations"])
    return parse_vm_annotations({**annotations, SANDBOX_NAME: "p", SANDBOX_NAMESPACE: namespace})


@pytest.mark.parametrize(
    ("namespace", "asked", "written", "gets"),
    [
        ("ml", "spot", "v1:cap=spot", SPOT),
        ("ml", None, "v1:cap=spot-or-on-demand", EITHER),
        ("batch", None, "v1:cap=spot", SPOT),
        ("web", None, None, OD),
        ("web", "on-demand", None, OD),
    ],
)
def test_capacity_reaches_createvm_through_the_contract(
    spot_webhook: Running,
    namespace: str,
    asked: str | None,
    written: str | None,
    gets: CapacityType,
) -> None:
    _, mutated = admit_via(spot_webhook, gpu_pod(namespace, asked), namespace)
    assert mutated["metadata"]["annotations"].get(DEFAULT_GPU_MODEL) == written
    intent = createvm_intent(mutated, namespace)
    assert intent.capacity_type is gets
    assert intent.to_request().provisioning == ("spot" if gets.wants_spot else "on-demand")


@pytest.mark.parametrize(
    ("namespace", "asked", "message"),
    [
        ("web", "spot", "namespace web may not ask for spot capacity (allowed there: on-demand)"),
        ("ml", "on-demand", "allowed there: spot-or-on-demand, spot"),
        ("ml", "preemptible", "'preemptible' is not a capacity type"),
    ],
)
def test_denied_clearly(spot_webhook: Running, namespace: str, asked: str, message: str) -> None:
    response = post(spot_webhook, review(gpu_pod(namespace, asked), namespace))
    assert response["allowed"] is False and response["status"]["code"] == 400
    assert response["status"]["message"].startswith(f"annotation {CAPACITY_ANNOTATION}: ")
    assert message in response["status"]["message"]


def test_a_user_written_contract_value_never_bypasses_the_policy(spot_webhook: Running) -> None:
    # A fresh pod carrying the contract value itself: the webhook re-derives it.
    fresh = gpu_pod("web", **{DEFAULT_GPU_MODEL: "v1:cap=spot"})
    _, mutated = admit_via(spot_webhook, fresh, "web")
    assert DEFAULT_GPU_MODEL not in mutated["metadata"]["annotations"]
    # A pod that looks mutated already (the VM resource, no resources left to translate).
    shaped = copy.deepcopy(mutated)
    shaped["metadata"]["annotations"][DEFAULT_GPU_MODEL] = "v1:cap=spot"
    response = post(spot_webhook, review(shaped, "web"))
    assert response["allowed"] is True
    fixed = jsonpatch.apply_patch(shaped, patch_of(response))
    assert DEFAULT_GPU_MODEL not in fixed["metadata"]["annotations"]
    assert createvm_intent(fixed, "web").capacity_type is OD
    # ... and where Spot is allowed, the value it gets is the policy's, and no user-written
    # model survives: the contract is derived from the pod's resources (none left here).
    shaped["metadata"]["namespace"] = "ml"
    shaped["metadata"]["annotations"][DEFAULT_GPU_MODEL] = "v1:m=h100-80gb;cap=spot"
    response = post(spot_webhook, review(shaped, "ml"))
    assert response["allowed"] is True
    fixed = jsonpatch.apply_patch(shaped, patch_of(response))
    assert fixed["metadata"]["annotations"][DEFAULT_GPU_MODEL] == "v1:cap=spot-or-on-demand"


def test_default_from_the_flag_and_plain_on_demand_pods_unchanged() -> None:
    settings = Settings(capacity=CapacityPolicy(EITHER))
    result = mutate_pod(gpu_pod("default"), settings=settings)
    annotations = result.pod["metadata"]["annotations"]
    assert annotations[DEFAULT_GPU_MODEL] == "v1:cap=spot-or-on-demand"
    assert result.intent is not None and result.intent.capacity_type is EITHER
    plain = mutate_pod(gpu_pod("default"))
    assert DEFAULT_GPU_MODEL not in plain.pod["metadata"]["annotations"]
