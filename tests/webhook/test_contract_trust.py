"""The webhook never keeps contract values a user wrote: only a pod it sealed itself is taken as
already mutated (docs/annotations.md); anything else has its contract keys derived again from
its resources and claims."""

from __future__ import annotations

import copy
from typing import Any

from providers.core import contract
from webhook import Settings, mutate_pod

KEY = b"k" * 32


def pod(annotations: dict[str, str], limits: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team", "annotations": annotations},
        "spec": {
            "runtimeClassName": "kata-remote",
            "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}],
        },
    }


def test_user_written_gpus_with_our_resource_get_no_gpus() -> None:
    forged = pod(
        {contract.DEFAULT_GPUS: "8", contract.DEFAULT_GPU_MODEL: "v1:m=h100"},
        {contract.VM_RESOURCE: "1"},
    )
    result = mutate_pod(forged, settings=Settings(seal_key=KEY), namespace="team")
    assert result.patch, "a forged contract is never a fixed point"
    annotations = result.pod["metadata"]["annotations"]
    assert contract.DEFAULT_GPUS not in annotations
    assert contract.DEFAULT_GPU_MODEL not in annotations
    assert result.intent is not None and result.intent.gpu.gpus == 0
    names = {contract.SANDBOX_NAME: "p", contract.SANDBOX_NAMESPACE: "team"}
    assert contract.parse_vm_annotations({**annotations, **names}).gpu.gpus == 0


def test_a_copied_seal_does_not_cover_changed_values() -> None:
    settings = Settings(seal_key=KEY)
    admitted = mutate_pod(
        pod({}, {"nvidia.com/gpu": "1", "cpu": "2"}), settings=settings, namespace="team"
    )
    copied = copy.deepcopy(admitted.pod)
    copied["metadata"]["annotations"][contract.DEFAULT_GPUS] = "8"
    result = mutate_pod(copied, settings=settings, namespace="team")
    assert contract.DEFAULT_GPUS not in result.pod["metadata"]["annotations"]
    # the same sealed pod in another namespace is not ours either
    elsewhere = mutate_pod(admitted.pod, settings=settings, namespace="other")
    assert elsewhere.patch


def test_our_own_pod_is_a_fixed_point_and_keeps_its_contract() -> None:
    settings = Settings(seal_key=KEY)
    first = mutate_pod(
        pod({}, {"nvidia.com/gpu": "2", "cpu": "4"}), settings=settings, namespace="team"
    )
    annotations = first.pod["metadata"]["annotations"]
    assert annotations[contract.DEFAULT_GPUS] == "2" and contract.SEAL in annotations
    again = mutate_pod(first.pod, settings=settings, namespace="team")
    assert again.patch == []
    # another webhook key (another cluster's webhook): not recognised, derived again
    stranger = mutate_pod(first.pod, settings=Settings(seal_key=b"x" * 32), namespace="team")
    assert contract.DEFAULT_GPUS not in stranger.pod["metadata"]["annotations"]


def test_values_the_adaptor_would_refuse_are_denied_at_admission() -> None:
    import pytest

    from providers.core.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="default_vcpus"):
        mutate_pod(pod({}, {"cpu": "99999999"}), settings=Settings(seal_key=KEY), namespace="team")
