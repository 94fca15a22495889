"""The pure layers: resource arithmetic, JSON Pointer escaping, the CEL extensions, and
`mutate_pod` with an in-memory resolver (what `peerpods plan` calls)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from providers.core.catalog import Catalog
from providers.core.contract import DEVICES, ContainerPlan
from providers.core.errors import InvalidRequest
from webhook import MemoryResolver, Settings, diff, mutate_pod, pod_resources
from webhook._cel import CelError, compile_selector, evaluate
from webhook._devices import DeviceSpace
from webhook._resources import effective

EXAMPLES = Path(__file__).resolve().parents[2] / "config" / "examples"


def _c(cpu: int, sidecar: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "x", "resources": {"requests": {"cpu": str(cpu)}}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


@given(
    st.lists(st.tuples(st.integers(0, 16), st.booleans()), max_size=5),
    st.lists(st.integers(0, 16), min_size=1, max_size=5),
)
def test_effective_matches_kubernetes_formula(init: list[tuple[int, bool]], app: list[int]) -> None:
    inits = [_c(n, s) for n, s in init]
    apps = [_c(n) for n in app]
    got = effective(inits, apps, lambda c: Decimal(c["resources"]["requests"]["cpu"]))
    # reference: each init container needs itself plus sidecars started before it
    peak, sidecars = 0, 0
    for n, is_sidecar in init:
        if is_sidecar:
            sidecars += n
        peak = max(peak, sidecars if is_sidecar else sidecars + n)
    assert got == max(peak, sidecars + sum(app))


def test_limits_preferred_to_requests() -> None:
    pod = {
        "spec": {
            "containers": [
                {
                    "name": "a",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {"cpu": "2500m", "memory": "2Gi"},
                    },
                }
            ]
        }
    }
    assert pod_resources(pod).vcpus == 3 and pod_resources(pod).memory_mib == 2048  # fmt: skip


def test_json_pointer_escaping_round_trips() -> None:
    old = {"metadata": {"annotations": {"a/b": "1", "c~d": "2"}}}
    new = {"metadata": {"annotations": {"x/y~z": "3"}}}
    ops = diff(old, new)
    assert {"op": "add", "path": "/metadata/annotations/x~1y~0z", "value": "3"} in ops
    assert jsonpatch.apply_patch(old, ops) == new
    assert diff(new, new) == []


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("quantity('40Gi').compareTo(quantity('40960Mi')) == 0", True),
        ("quantity('1.5').isGreaterThan(quantity('1500m'))", False),
        ("quantity('2Gi').add(quantity('1Gi')) == quantity('3Gi')", True),
        ("quantity('2Gi').sub(1).isLessThan(quantity('2Gi'))", True),
        ("quantity('10').asInteger() == 10", True),
        ("isQuantity('12Ki') && !isQuantity('twelve')", True),
        ("semver('9.0.0').isGreaterThan(semver('8.9.0'))", True),
        ("semver('8.6.0').major() == 8 && semver('8.6.0').minor() == 6", True),
        ("'NVIDIA H100 80GB HBM3'.matches('H100|H200')", True),
    ],
)
def test_kubernetes_cel_extensions(expression: str, expected: bool) -> None:
    assert evaluate(compile_selector(expression), {}) is expected


def test_cel_errors_are_clear() -> None:
    with pytest.raises(CelError, match="invalid CEL expression"):
        compile_selector("device.(")
    with pytest.raises(CelError):
        evaluate(compile_selector("quantity('nope').sign() == 1"), {})
    with pytest.raises(CelError, match="not a bool"):
        evaluate(compile_selector("1 + 1"), {})


def test_virtual_devices_follow_the_catalog(catalog: Catalog) -> None:
    space = DeviceSpace(catalog)
    assert space.models == {"a10g", "l4", "a100-40gb", "h100-80gb"}
    migs = {d.profile for d in space.devices if d.kind == "mig" and d.model == "h100-80gb"}
    assert {"1g.10gb", "3g.40gb", "7g.80gb"} <= migs
    assert not any(d.kind == "mig" and d.model in ("a10g", "l4") for d in space.devices)
    with pytest.raises(InvalidRequest, match="driverVersion"):
        space.match([("s", "device.attributes['gpu.nvidia.com'].driverVersion.major() >= 550")])
    # a presence test sees a post-boot attribute as absent
    match, _ = space.match([("s", "!('uuid' in device.attributes['gpu.nvidia.com'])")])
    assert len(match.devices) == len(space.devices)


def test_mutate_pod_with_in_memory_objects(catalog: Catalog) -> None:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "dra-pod.yaml").read_text()) if d]
    pod = next(d for d in docs if d["kind"] == "Pod")
    settings = Settings()  # its seal key: the reinvocation below is recognised under it
    result = mutate_pod(pod, resolver=MemoryResolver(docs), catalog=catalog, settings=settings)
    assert result.intent is not None and result.intent.gpu.models == ("h100-80gb",)
    assert result.intent.vcpus == 16 and result.intent.memory_mib == 64 * 1024
    assert jsonpatch.apply_patch(pod, result.patch) == result.pod
    plan = ContainerPlan.decode(result.pod["metadata"]["annotations"][DEVICES])
    assert plan == result.plan
    assert plan.containers == {"trainer": ("claim-shared-gpu-gpu",),
                               "profiler": ("claim-shared-gpu-gpu",)}  # fmt: skip
    again = mutate_pod(result.pod, resolver=MemoryResolver(), catalog=catalog, settings=settings)
    assert again.patch == [] and again.intent == result.intent
    stranger = mutate_pod(result.pod, resolver=MemoryResolver(docs), catalog=catalog)
    assert stranger.patch != []  # another Settings' own key does not recognise the seal


def test_warn_mode_admits_impossible_requests(catalog: Catalog) -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"runtimeClassName": "kata-remote", "containers": [
        {"name": "a", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 64}}}]}}  # fmt: skip
    result = mutate_pod(pod, catalog=catalog, settings=Settings(impossible="warn"))
    assert result.changed and any("64" in w or "GPU" in w for w in result.warnings)
