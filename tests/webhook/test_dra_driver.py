"""`peerpods webhook --dra-driver`: a peer pod keeps nvidia.com/gpu, its claims and
spec.resourceClaims for the scheduler, is still sized (vCPUs, memory) and stripped of cpu and
memory, gets kata.peerpods.io/vm, and no claim is ever read or evaluated."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from providers.core.catalog import Catalog
from providers.core.contract import DEFAULT_GPUS, DEFAULT_MEMORY, DEFAULT_VCPUS, VM_RESOURCE
from tests.webhook.apiserver_rules import quota_errors, resource_errors, update_errors
from webhook import Settings, WebhookPolicy, mutate_pod
from webhook._reapply import reapply
from webhook._resolver import Resolver

DRA = Settings(dra_driver=True)


class NoLookups:
    """A resolver that fails the test if the webhook reads any DRA object."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the webhook looked up a DRA object ({name}) in --dra-driver mode")


def peer_pod(**spec: Any) -> dict[str, Any]:
    resources = {
        "requests": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {
            "runtimeClassName": "kata-remote",
            "containers": [{"name": "main", "image": "i", "resources": resources}],
            **spec,
        },
    }


def admitted(pod: dict[str, Any], catalog: Catalog | None = None) -> dict[str, Any]:
    resolver: Resolver = NoLookups()
    result = mutate_pod(pod, resolver=resolver, catalog=catalog, settings=DRA, namespace="ml")
    out: dict[str, Any] = jsonpatch.apply_patch(pod, result.patch)
    return out


def test_nvidia_gpu_stays_for_the_scheduler_and_cpu_memory_go_to_the_vm(catalog: Catalog) -> None:
    out = admitted(peer_pod(), catalog)
    resources = out["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"nvidia.com/gpu": "1", VM_RESOURCE: "1"}
    assert resources["requests"] == {"nvidia.com/gpu": "1", VM_RESOURCE: "1"}
    annotations = out["metadata"]["annotations"]
    assert annotations[DEFAULT_VCPUS] == "2" and annotations[DEFAULT_MEMORY] == "4096"
    assert DEFAULT_GPUS not in annotations  # the VM's GPUs come from the allocation
    assert resource_errors(out) == []
    # a namespace quota on requests.nvidia.com/gpu binds (FACTS-K8S: quota sees the mutated pod)
    assert quota_errors(out, {"requests.nvidia.com/gpu": "1"}, {"requests.nvidia.com/gpu": "1"})
    assert not quota_errors(out, {"requests.nvidia.com/gpu": "1"}, {})


def test_claims_are_kept_and_never_evaluated() -> None:
    pod = peer_pod(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "h100"}])
    main = pod["spec"]["containers"][0]["resources"]
    for section in ("limits", "requests"):
        del main[section]["nvidia.com/gpu"]
    main["claims"] = [{"name": "gpu"}]
    out = admitted(pod)  # no catalog, no resolver: the claims are the scheduler's
    assert out["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "h100"}]
    resources = out["spec"]["containers"][0]["resources"]
    assert resources["claims"] == [{"name": "gpu"}]
    assert resources["limits"] == {VM_RESOURCE: "1"}


def test_a_reinvocation_changes_nothing() -> None:
    pod = peer_pod(resourceClaims=[{"name": "gpu", "resourceClaimName": "mine"}])
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    once = admitted(pod)
    again = mutate_pod(copy.deepcopy(once), settings=DRA, namespace="ml")
    assert again.patch == []


def test_a_reapplied_manifest_keeps_what_the_live_pod_kept() -> None:
    manifest = peer_pod(resourceClaims=[{"name": "gpu", "resourceClaimName": "mine"}])
    live = admitted(manifest)

    def sealed(annotations: Any) -> bool:
        return True

    stored = reapply(live, copy.deepcopy(manifest), sealed, keep_scheduled=True)
    assert update_errors(live, stored) == []
    assert stored["spec"]["resourceClaims"] == live["spec"]["resourceClaims"]


def test_mig_stays_on_the_annotation_path(catalog: Catalog) -> None:
    pod = peer_pod()
    main = pod["spec"]["containers"][0]["resources"]
    for section in ("limits", "requests"):
        main[section]["nvidia.com/mig-1g.10gb"] = "1"
        del main[section]["nvidia.com/gpu"]
    out = admitted(pod, catalog)
    limits = out["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/mig-1g.10gb" not in limits
    assert "mig=1g.10gb:1" in out["metadata"]["annotations"].get(
        "io.katacontainers.config.hypervisor.default_gpu_model", ""
    )


def test_the_mode_is_a_flag_with_an_env_twin() -> None:
    assert WebhookPolicy().dra_driver is False
    assert Settings.of(WebhookPolicy(dra_driver=True)).dra_driver is True


def test_the_annotation_path_is_unchanged_without_the_flag(catalog: Catalog) -> None:
    result = mutate_pod(peer_pod(), catalog=catalog, settings=Settings(), namespace="ml")
    out = jsonpatch.apply_patch(peer_pod(), result.patch)
    assert "nvidia.com/gpu" not in out["spec"]["containers"][0]["resources"]["limits"]
