"""A DRA pod whose objects were read and whose selectors were evaluated for an earlier pod is
decided from memory: no API call, no selector evaluation, no second thread hop and none of its
namespace's DRA share (so a burst of pods from one template is never refused for it). Anything
not in memory sends the pod the long way, with nothing counted for the attempt."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

import webhook._admission
from providers.clouds.kube import KubeClient, kubeconfig_config
from providers.core.catalog import Catalog
from tests.webhook.conftest import Running, container, pod, post, review, serve
from tests.webhook.fakekube import FakeKube
from tests.webhook.test_dra import CLASSES, TEMPLATES, exactly, template
from webhook import Admission, KubeResolver, MemoryResolver, Settings
from webhook._devices import DeviceSpace, Outcome
from webhook._metrics import ADMISSIONS
from webhook._resolver import NotInMemory
from webhook._reviews import parse_review

OBJECTS = [*yaml.safe_load_all(CLASSES), *TEMPLATES]


def _claim_pod(*templates: str, namespace: str = "default") -> dict[str, Any]:
    main = container("main")
    main["resources"] = {"claims": [{"name": f"c{i}"} for i in range(len(templates))]}
    claims = [{"name": f"c{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
    p = pod(main, resourceClaims=claims)
    p["metadata"]["namespace"] = namespace
    return p


def _parsed(p: dict[str, Any]) -> Any:
    return parse_review(json.dumps(review(p)).encode())


def _mutated_count() -> float:
    return float(ADMISSIONS.labels("CREATE", "mutated")._value.get())


class CountingRunner:
    """A selector runner that evaluates here and counts what it was asked."""

    def __init__(self) -> None:
        self.expressions: list[str] = []

    def __call__(
        self, space: DeviceSpace, expression: str, deadline: float | None, tenant: str
    ) -> Outcome:
        self.expressions.append(expression)
        return space.evaluate(expression, deadline)


def test_decided_from_memory_once_its_selectors_were_evaluated(catalog: Catalog) -> None:
    runner = CountingRunner()
    admission = Admission(Settings(), lambda: catalog, MemoryResolver(OBJECTS), cel_runner=runner)
    review_ = _parsed(_claim_pod("big-memory", "first-available"))
    counted = _mutated_count()
    assert admission.decide_from_memory(review_) is None  # no selector outcome yet
    assert runner.expressions == [] and _mutated_count() == counted  # nothing ran or counted
    first = admission.decide(review_)["response"]
    evaluated = len(runner.expressions)
    assert first["allowed"] is True and evaluated > 0
    again = admission.decide_from_memory(review_)
    assert again is not None and again["response"] == first  # the same answer
    assert len(runner.expressions) == evaluated  # from the cache, nothing evaluated
    assert _mutated_count() == counted + 2


def test_a_new_selector_or_template_is_not_in_memory(catalog: Catalog) -> None:
    novel = template("novel", [exactly("gpu", "gpu.nvidia.com", "device.driver != 'x'")])
    admission = Admission(Settings(), lambda: catalog, MemoryResolver([*OBJECTS, novel]))
    assert admission.decide(_parsed(_claim_pod("one-gpu")))["response"]["allowed"] is True
    assert admission.decide_from_memory(_parsed(_claim_pod("one-gpu"))) is not None
    assert admission.decide_from_memory(_parsed(_claim_pod("one-gpu", "novel"))) is None
    # a denial earned from memory is the answer, the same as the long way's
    absent = _parsed(_claim_pod("absent"))
    denied = admission.decide_from_memory(absent)
    assert denied is not None and denied["response"]["allowed"] is False
    assert denied["response"]["status"] == admission.decide(absent)["response"]["status"]


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeKube, KubeClient]]:
    with FakeKube() as fake:
        fake.add_yaml(CLASSES)
        fake.add(*TEMPLATES)
        kubeconfig = fake.kubeconfig(tmp_path_factory.mktemp("kube"))
        yield fake, KubeClient(kubeconfig_config({"KUBECONFIG": str(kubeconfig)}))


def test_kube_resolver_from_memory_never_calls_the_api(kube: tuple[FakeKube, KubeClient]) -> None:
    fake, client = kube
    resolver = KubeResolver(ttl_seconds=60, client=client)
    memory = resolver.from_memory()
    before = len(fake.requests)
    with pytest.raises(NotInMemory):
        memory.claim_template("default", "one-gpu")
    assert len(fake.requests) == before  # a miss asks nobody
    read = resolver.claim_template("default", "one-gpu")
    assert len(fake.requests) == before + 1
    assert memory.claim_template("default", "one-gpu") == read  # the same cache
    assert len(fake.requests) == before + 1
    assert memory.from_memory() is memory and resolver.from_memory() is memory
    short = KubeResolver(ttl_seconds=0.05, client=client)
    short.device_class("gpu.nvidia.com")
    time.sleep(0.1)
    with pytest.raises(NotInMemory):  # expired: read again, the long way
        short.from_memory().device_class("gpu.nvidia.com")


@pytest.fixture(scope="module")
def remembering(tls_dir: Path, ca: trustme.CA, catalog: Catalog) -> Iterator[Running]:
    yield from serve(tls_dir, ca, Settings(), catalog, MemoryResolver(OBJECTS))


def test_the_server_takes_the_dra_share_only_for_what_must_wait(
    remembering: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = remembering.server.app.state.selector_gate
    entered: list[str] = []
    enter: Callable[[str], str] = gate.enter

    def counting(namespace: str) -> str:
        entered.append(namespace)
        return enter(namespace)

    monkeypatch.setattr(gate, "enter", counting)
    body = _claim_pod("big-memory", "first-available")
    assert post(remembering, review(body))["allowed"] is True
    assert entered == ["default"]  # selectors evaluated: the selector pool, in the share
    for _ in range(3):
        assert post(remembering, review(body))["allowed"] is True
    assert entered == ["default"]  # from memory: neither the share nor the second pool
    assert gate.in_flight == {}


def _submits(running: Running, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The thread-pool hand-offs of a server from now on, by pool."""
    pools = running.server.app.state.pools
    submitted: list[str] = []
    for name in ("plain", "selectors"):
        pool = getattr(pools, name)

        def submit(*args: Any, _pool: Any = pool, _name: str = name, **kwargs: Any) -> Any:
            submitted.append(_name)
            return type(_pool).submit(_pool, *args, **kwargs)

        monkeypatch.setattr(pool, "submit", submit)
    return submitted


def test_a_small_pod_decided_from_memory_takes_no_thread(
    remembering: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu_pod = pod(container("train", {"nvidia.com/gpu": 1}))
    dra_pod = _claim_pod("big-memory")
    for body in (gpu_pod, dra_pod):  # the catalog and the selectors' outcomes are in memory
        assert post(remembering, review(body))["allowed"] is True
    submitted = _submits(remembering, monkeypatch)
    for body in (gpu_pod, dra_pod):
        assert post(remembering, review(body))["allowed"] is True
    assert submitted == []  # both decided on the event loop
    limit = remembering.server.config.limits.inline_request_bytes
    large = pod(container("train", {"nvidia.com/gpu": 1}))
    large["metadata"]["labels"] = {f"l{i}": "x" * 50 for i in range(limit // 50)}
    assert post(remembering, review(large))["allowed"] is True
    assert submitted == ["plain"]  # a large one: decided in the pool


def test_a_catalog_is_used_from_memory_only_while_recent(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []

    def source() -> Catalog:
        asked.append(1)
        return catalog

    admission = Admission(Settings(), source)
    gpu_review = _parsed(pod(container("train", {"nvidia.com/gpu": 1})))
    assert admission.decide_from_memory(gpu_review) is None  # never asked yet
    assert asked == []
    assert admission.decide(gpu_review)["response"]["allowed"] is True
    assert len(asked) == 1
    assert admission.decide_from_memory(gpu_review) is not None
    assert len(asked) == 1  # the source not asked again
    monkeypatch.setattr(webhook._admission, "CATALOG_RECHECK_SECONDS", 0.0)
    time.sleep(0.01)
    assert admission.decide_from_memory(gpu_review) is None  # too old: the long way asks


def test_a_namespace_holding_its_share_is_refused_before_any_work(
    remembering: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its slow pods hold the whole share (a flood of selectors that run to the time limit):
    its next DRA pod is refused at once, as before, even one that memory could decide; another
    namespace's is decided from memory."""
    body = _claim_pod("big-memory")
    assert post(remembering, review(body))["allowed"] is True  # in memory from now on
    gate = remembering.server.app.state.selector_gate
    monkeypatch.setattr(gate, "in_flight", {"default": gate.share})
    refused = post(remembering, review(body))
    assert refused["allowed"] is False and refused["status"]["code"] == 429
    # another namespace's pod is decided (here: its template does not exist there), not refused
    other = post(remembering, review(_claim_pod("big-memory", namespace="o"), namespace="o"))
    assert other["allowed"] is False and other["status"]["code"] == 400
    monkeypatch.setattr(gate, "in_flight", {"o": gate.share})
    assert post(remembering, review(body))["allowed"] is True
