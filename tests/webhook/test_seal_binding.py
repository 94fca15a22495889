"""The contract seal is bound to what the pod asks for: another pod of the namespace carrying a
copied seal keeps the sealed contract only if it asks for exactly the same; any other request
shape is translated again from its own resources."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from providers.core import contract
from webhook import Settings, mutate_pod

KEY = b"k" * 32
SETTINGS = Settings(seal_key=KEY)


def pod(*containers: dict[str, Any], name: str = "a") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"runtimeClassName": "kata-remote", "containers": list(containers)},
    }


def container(name: str, **limits: str) -> dict[str, Any]:
    return {"name": name, "image": "x", "resources": {"limits": dict(limits)}}


def admitted() -> dict[str, Any]:
    """Pod A as the webhook left it: eight GPUs in its contract, sealed."""
    a = pod(container("train", **{"nvidia.com/gpu": "8", "cpu": "8", "ephemeral-storage": "1Gi"}))
    result = mutate_pod(a, settings=SETTINGS, namespace="team")
    assert result.pod["metadata"]["annotations"][contract.DEFAULT_GPUS] == "8"
    return result.pod


def carrying_as_seal(spec_of: dict[str, Any]) -> dict[str, Any]:
    """Pod B: its own spec, A's sealed annotations copied onto it."""
    b = copy.deepcopy(spec_of)
    b["metadata"]["name"] = "b"
    b["metadata"]["annotations"] = dict(admitted()["metadata"]["annotations"])
    return b


VM = {contract.VM_RESOURCE: "1"}
OTHER_SHAPES = {
    "another container name": pod(container("sneak", **VM)),
    "a second container": pod(container("train", **VM), container("side")),
    "other storage": pod(container("train", **VM, **{"ephemeral-storage": "9Gi"})),
    "an init container": pod(container("train", **VM)),
}
OTHER_SHAPES["an init container"]["spec"]["initContainers"] = [container("setup")]


@pytest.mark.parametrize("case", sorted(OTHER_SHAPES))
def test_a_copied_seal_on_other_requests_is_derived_again(case: str) -> None:
    b = carrying_as_seal(OTHER_SHAPES[case])
    result = mutate_pod(b, settings=SETTINGS, namespace="team")
    annotations = result.pod["metadata"]["annotations"]
    assert contract.DEFAULT_GPUS not in annotations, case
    assert result.intent is not None and result.intent.gpu.gpus == 0
    assert annotations.get(contract.SEAL) != admitted()["metadata"]["annotations"][contract.SEAL]
    # what B got is sealed for B: a reinvocation on it is a fixed point
    assert mutate_pod(result.pod, settings=SETTINGS, namespace="team").patch == []


def test_the_sealed_pod_itself_stays_a_fixed_point_across_reserialised_quantities() -> None:
    a = admitted()
    assert mutate_pod(a, settings=SETTINGS, namespace="team").patch == []
    # the API server may write 1Gi as 1024Mi (or back) between two calls on one pod
    again = copy.deepcopy(a)
    again["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] = "1024Mi"
    assert mutate_pod(again, settings=SETTINGS, namespace="team").patch == []


def test_a_pod_asking_for_exactly_the_same_may_carry_the_seal() -> None:
    """Same namespace, same request shape as the mutated pod: it gains nothing it could not
    ask for itself, and is taken as mutated (the seal binds requests, not names)."""
    b = carrying_as_seal(admitted())
    result = mutate_pod(b, settings=SETTINGS, namespace="team")
    assert result.patch == []


def test_a_v1_seal_is_never_a_fixed_point_at_creation() -> None:
    a = admitted()
    annotations = a["metadata"]["annotations"]
    annotations[contract.SEAL] = contract._seal_v1(KEY, "team", annotations)
    assert contract.sealed(KEY, "team", annotations)  # updates of older pods still know it
    result = mutate_pod(a, settings=SETTINGS, namespace="team")
    assert result.patch and contract.DEFAULT_GPUS not in result.pod["metadata"]["annotations"]
