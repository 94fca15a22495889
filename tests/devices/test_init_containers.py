"""Init containers' devices are reused: the device plan follows Kubernetes' container lifecycle.

Expected answers come from Kubernetes' documented semantics ("Init Containers" and "Sidecar
Containers"): init containers run to completion one after another before any app container
starts, so a pod needs max(each init container, app containers + sidecars) devices and a later
container may get the devices an earlier init container used; restartable init containers
(`restartPolicy: Always`) keep running alongside everything after them and never share; a DRA
claim is allocated to the pod for its whole life. Checked through `peerpods plan`'s code path
(webhook, CreateVM annotations, selection, device plan) on the three bundled clouds.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from adaptor.cli.pod_plan import PlanReport, plan_manifest
from providers.core.contract import ContainerPlan, DeviceUnit
from providers.core.mig import pack
from providers.core.selection import rdma_devices
from providers.core.snapshots import load_catalog
from webhook._cel import compile_selector

Doc = dict[str, Any]
CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {
        "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]
    },
}
CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "shared", "namespace": "default"},
    "spec": {
        "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
    },
}


def container(name: str, limits: dict[str, int], sidecar: bool = False, **extra: Any) -> Doc:
    out: Doc = {"name": name, "image": "x", **extra}
    if limits:
        out["resources"] = {"limits": {k: str(v) for k, v in limits.items()}}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def pod(init: list[Doc], app: list[Doc], claims: bool = False) -> Doc:
    spec: Doc = {"runtimeClassName": "kata-remote", "initContainers": init, "containers": app}
    if claims:
        spec["resourceClaims"] = [{"name": "shared", "resourceClaimName": "shared"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


def planned(provider: str, documents: list[Doc]) -> PlanReport:
    report = plan_manifest(documents, provider)
    assert report.ok, report.failure
    return report


def cdi(report: PlanReport) -> dict[str, tuple[str, ...]]:
    return {c.name: c.cdi for c in report.containers}


GPU = "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("provider", "one_gpu_type"),
    # the cheapest (AWS: on-demand list price) or smallest 1-GPU type of each bundled catalog
    [("aws", "g4dn.xlarge"), ("azure", "Standard_NC4as_T4_v3"), ("gcp", None)],
)
def test_model_download_init_container_reuses_the_gpu(
    provider: str, one_gpu_type: str | None
) -> None:
    report = planned(
        provider,
        [pod([container("fetch", {GPU: 1})], [container("serve", {GPU: 1})])],
    )
    assert report.intent is not None and report.intent.gpu.gpus == 1
    assert report.selection is not None
    if one_gpu_type is not None:
        assert report.selection.selected.name == one_gpu_type
    assert report.selection.selected.gpus == 1
    assert cdi(report) == {"fetch": ("peerpods.io/gpu=gpu0",), "serve": ("peerpods.io/gpu=gpu0",)}


@pytest.mark.parametrize("provider", ["aws", "azure", "gcp"])
def test_sidecars_keep_their_own_gpu(provider: str) -> None:
    # sidecar (1) + init after it (1) at once; then sidecar (1) + app (1): 2 GPUs, not 3
    report = planned(
        provider,
        [
            pod(
                [container("mesh", {GPU: 1}, sidecar=True), container("warm", {GPU: 1})],
                [container("serve", {GPU: 1})],
            )
        ],
    )
    assert report.intent is not None and report.intent.gpu.gpus == 2
    got = cdi(report)
    assert got["mesh"] == ("peerpods.io/gpu=gpu0",)
    assert got["warm"] == got["serve"] == ("peerpods.io/gpu=gpu1",)


@pytest.mark.parametrize("provider", ["aws", "azure", "gcp"])
def test_mig_devices_of_an_init_container_are_reused(provider: str) -> None:
    # two 3g.40gb fill one A100 80GB / H100 80GB: init and app each use both, in turn
    mig = "nvidia.com/mig-3g.40gb"
    report = planned(provider, [pod([container("prep", {mig: 2})], [container("run", {mig: 2})])])
    assert report.intent is not None and report.intent.gpu.mig == {"3g.40gb": 2}
    assert report.devices is not None and len({m.gpu for m in report.devices.mig}) == 1
    got = cdi(report)
    assert got["prep"] == got["run"] and len(got["run"]) == 2


def test_rdma_of_an_init_container_is_reused_on_azure() -> None:
    # an InfiniBand size gives the pod VM one HCA; init and app use it in turn
    report = planned(
        "azure",
        [
            pod(
                [container("nccl-check", {GPU: 8, "rdma/ib": 1})],
                [container("train", {GPU: 8, "rdma/ib": 1})],
            )
        ],
    )
    assert report.devices is not None and len(report.devices.rdma) == 1
    got = cdi(report)
    assert got["nccl-check"] == got["train"]


@pytest.mark.parametrize("provider", ["aws", "azure", "gcp"])
def test_a_claim_is_held_for_the_pod_and_not_reused(provider: str) -> None:
    # the init container's claim stays allocated: the app's own GPU is another one
    report = planned(
        provider,
        [
            pod(
                [container("fetch", {}, resources={"claims": [{"name": "shared"}]})],
                [container("serve", {GPU: 1})],
                claims=True,
            ),
            CLASS,
            CLAIM,
        ],
    )
    assert report.intent is not None and report.intent.gpu.gpus == 2
    got = cdi(report)
    assert got["fetch"] != got["serve"]


def test_plans_without_phases_read_as_before() -> None:
    # an older webhook's plan: every container runs at once, nothing reused
    plan = ContainerPlan(
        units=(DeviceUnit(id="a", kind="gpu"), DeviceUnit(id="b", kind="gpu")),
        containers={"fetch": ("a",), "serve": ("b",)},
    )
    assert plan.gpu_intent().gpus == 2
    assert '"init"' not in plan.encode() and "lifetime" not in plan.encode()
    assert ContainerPlan.decode(plan.encode()) == plan


# --- property: random pods --------------------------------------------------------------------

_PROFILES = ("1g.10gb", "3g.40gb")


@st.composite
def _containers(draw: st.DrawFn, prefix: str, init: bool) -> list[tuple[Doc, bool]]:
    out: list[tuple[Doc, bool]] = []
    for i in range(draw(st.integers(1 if not init else 0, 3))):
        limits: dict[str, int] = {}
        if draw(st.booleans()):
            limits[GPU] = draw(st.integers(1, 2))
        for profile in _PROFILES:
            if draw(st.integers(0, 3)) == 0:
                limits[f"nvidia.com/mig-{profile}"] = draw(st.integers(1, 2))
        if draw(st.integers(0, 4)) == 0:
            limits["rdma/ib"] = 1
        claim = draw(st.integers(0, 3)) == 0
        sidecar = init and draw(st.booleans())
        extra = {"resources": {"claims": [{"name": "shared"}]}} if claim else {}
        doc = container(f"{prefix}{i}", limits, sidecar=sidecar)
        if claim:
            doc.setdefault("resources", {}).update(extra["resources"])
        out.append((doc, claim))
    return out


def _steps(init: list[Doc], app: list[Doc]) -> dict[str, tuple[int, int]]:
    """When each container runs (Kubernetes): init i at step i, sidecars on to the end."""
    end = len(init)
    out = {
        c["name"]: (i, end if c.get("restartPolicy") == "Always" else i) for i, c in enumerate(init)
    }
    out.update({c["name"]: (end, end) for c in app})
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["aws", "azure", "gcp"]),
    _containers("i", init=True),
    _containers("a", init=False),
)
def test_random_pods_never_oversubscribe_or_share(
    provider: str, init_drawn: list[tuple[Doc, bool]], app_drawn: list[tuple[Doc, bool]]
) -> None:
    init = [c for c, _ in init_drawn]
    app = [c for c, _ in app_drawn]
    claimants = {c["name"] for c, claim in [*init_drawn, *app_drawn] if claim}
    documents = [pod(init, app, claims=bool(claimants)), CLASS, CLAIM]
    report = plan_manifest(documents, provider, catalog=_CATALOGS[provider])
    assume(report.ok)  # some draws ask more than any type has
    assert report.devices is not None and report.selection is not None
    chosen = report.selection.selected.instance_type
    devices = report.devices
    # never more than the chosen type has
    candidate = report.selection.selected
    has = candidate.gpus  # bundled, or attached at create (GCP N1)
    mig_gpus = len({m.gpu for m in devices.mig})
    assert len(devices.gpus) + mig_gpus <= has
    if devices.mig:
        wanted: dict[str, int] = {}
        for m in devices.mig:
            wanted[m.profile] = wanted.get(m.profile, 0) + 1
        assert candidate.gpu_model is not None
        assert pack(candidate.gpu_model, wanted, has - len(devices.gpus)) is not None
    assert len(devices.rdma) <= rdma_devices(chosen)
    got = cdi(report)
    claim_devices = {d for name in claimants for d in got[name]}
    # each container gets what it asked for
    for c in [*init, *app]:
        limits = {k: int(v) for k, v in (c.get("resources") or {}).get("limits", {}).items()}
        own = limits.get(GPU, 0) + sum(
            n for k, n in limits.items() if k.startswith("nvidia.com/mig-")
        )
        own += limits.get("rdma/ib", 0)
        assert len(got[c["name"]]) == own + (1 if c["name"] in claimants else 0)
    # containers running at the same time share a device only through the shared claim
    steps = _steps(init, app)
    names = list(steps)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            (a0, a1), (b0, b1) = steps[a], steps[b]
            if a1 < b0 or b1 < a0:
                continue
            common = set(got[a]) & set(got[b])
            if common:
                assert a in claimants and b in claimants
                assert common <= claim_devices


_CATALOGS = {
    "aws": load_catalog("aws", "us-east-1"),
    "azure": load_catalog("azure", "eastus"),
    "gcp": load_catalog("gcp", "us-central1"),
}
compile_selector("true")  # the CEL engine raises the recursion limit once, before Hypothesis runs
