"""One namespace flooding hostile DRA selectors cannot deny another namespace's DRA pods.

Each namespace holds a bounded share of the CEL workers and of the DRA admissions in flight; a
request beyond the share is refused at once (429), never queued, and the CEL time limit counts
from the request's arrival. The flood here is 50 concurrent pods of one namespace whose selector
runs until its time limit; the other namespace's pods each bring a selector never seen before,
so each needs a worker. Their latency is a benchmark figure (tests/bench/webhook.py --flood);
this test asserts the outcomes: every benign pod admitted within the API server's own 10 s
webhook timeout, every hostile one denied or refused.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
import yaml

from providers.core.catalog import Catalog
from tests.webhook.conftest import Running, ServerThread, client_context, container, pod, review
from tests.webhook.test_dra import CLASSES, exactly, template
from tests.webhook.test_hostile_selectors import NESTED
from webhook import Admission, MemoryResolver, ServerConfig, Settings
from webhook._celworker import CelWorkers
from webhook._devices import DeviceSpace
from webhook._reviews import parse_review

CEL_TIMEOUT = 3.0
API_SERVER_TIMEOUT = 10.0  # what the API server waits for a webhook's answer
BENIGN = 12


def _namespaced(name: str, namespace: str, expression: str) -> dict[str, Any]:
    body = template(name, [exactly("gpu", "gpu.nvidia.com", expression)])
    body["metadata"]["namespace"] = namespace
    return body


def _benign_selector(i: int) -> str:
    # a new expression each time: no cached result, each one needs a worker
    return f"device.attributes['gpu.nvidia.com'].type == 'gpu' && {i} >= 0"


OBJECTS = [
    *yaml.safe_load_all(CLASSES),
    _namespaced("hostile", "attacker", NESTED),
    *(_namespaced(f"benign-{i}", "tenant", _benign_selector(i)) for i in range(BENIGN + 1)),
    _namespaced("late", "tenant", _benign_selector(1000)),
]


def _claim_pod(namespace: str, template_name: str) -> dict[str, Any]:
    main = container("main")
    main["resources"] = {"claims": [{"name": "c"}]}
    p = pod(main, resourceClaims=[{"name": "c", "resourceClaimTemplateName": template_name}])
    p["metadata"]["namespace"] = namespace
    return p


@pytest.fixture(scope="module")
def fair(tls_dir: Path, ca: trustme.CA, catalog: Catalog) -> Iterator[Running]:
    resolver = MemoryResolver(OBJECTS)
    admission = Admission(Settings(), lambda: catalog, resolver, cel_timeout_seconds=CEL_TIMEOUT)
    config = ServerConfig(
        host="127.0.0.1",
        port=0,
        cert_file=tls_dir / "tls.crt",
        key_file=tls_dir / "tls.key",
        shutdown_seconds=2,
        cel_workers=2,
    )
    with (
        ServerThread(admission, config) as server,
        httpx.Client(verify=client_context(ca), timeout=API_SERVER_TIMEOUT) as client,
    ):
        yield Running(f"https://127.0.0.1:{server.port}", server, client)


def test_a_flooding_namespace_leaves_the_others_their_share(fair: Running, ca: trustme.CA) -> None:
    hostile: list[dict[str, Any]] = []
    lock = threading.Lock()

    def attack() -> None:
        body = review(_claim_pod("attacker", "hostile"), namespace="attacker")
        with httpx.Client(verify=client_context(ca), timeout=60) as client:
            reply = client.post(fair.url + "/mutate", json=body)
        with lock:
            hostile.append(reply.json()["response"])

    attackers = [threading.Thread(target=attack) for _ in range(50)]
    for thread in attackers:
        thread.start()
    benign: list[dict[str, Any]] = []
    try:
        time.sleep(0.3)  # the flood is in: its selectors hold what they may
        for i in range(BENIGN):
            body = review(_claim_pod("tenant", f"benign-{i}"), namespace="tenant")
            # a time-out here is what the API server would see: the pod's creation fails
            reply = fair.client.post(fair.url + "/mutate", json=body)
            benign.append(reply.json()["response"])
    finally:
        for thread in attackers:
            thread.join(60)
    for answer in benign:
        assert answer["allowed"] is True, answer
    assert len(hostile) == 50
    codes = [a["status"]["code"] for a in hostile if not a["allowed"]]
    assert len(codes) == 50, hostile
    # beyond the namespace's share of the selector threads, refused at once rather than
    # queued; within it, one evaluates the selector and the others share its time-out
    share = fair.server.app.state.selector_gate.share
    assert codes.count(429) >= 50 - share, codes
    assert set(codes) <= {400, 429}, codes
    # the flood is over: the attacker's namespace gets its share back
    again = fair.client.post(
        fair.url + "/mutate",
        json=review(_claim_pod("tenant", f"benign-{BENIGN}"), namespace="tenant"),
    )
    assert again.json()["response"]["allowed"] is True
    assert fair.server.app.state.selector_gate.in_flight == {}


def test_the_time_limit_counts_from_arrival(catalog: Catalog) -> None:
    """A request that waited (for a thread, for its body) has that much less time for its
    selectors: one that arrived longer ago than the limit gets no worker at all."""
    workers = CelWorkers(1)
    try:
        admission = Admission(
            Settings(),
            lambda: catalog,
            MemoryResolver(OBJECTS),
            cel_timeout_seconds=CEL_TIMEOUT,
            cel_runner=workers,
        )
        body = review(_claim_pod("tenant", "late"), namespace="tenant")
        parsed = parse_review(json.dumps(body).encode())
        late = admission.decide(parsed, arrived=time.monotonic() - CEL_TIMEOUT)["response"]
        assert late["allowed"] is False and late["status"]["code"] == 503, late
        assert "no CEL worker became free within the 3s limit" in late["status"]["message"]
        on_time = admission.decide(parsed, arrived=time.monotonic())["response"]
        assert on_time["allowed"] is True, on_time
    finally:
        workers.close()


def test_a_tenant_at_its_share_is_refused_not_queued(catalog: Catalog) -> None:
    """Two workers, a share of one: while one tenant's selector runs, its next one is refused
    at once, and another tenant's runs on the other worker."""
    space = DeviceSpace(catalog)
    workers = CelWorkers(2)
    try:
        workers.start(space)
        assert workers.share == 1
        running = threading.Thread(
            target=workers, args=(space, NESTED, time.monotonic() + CEL_TIMEOUT, "attacker")
        )
        running.start()
        deadline = time.monotonic() + 10
        while workers._held.get("attacker") != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        refused = workers(space, "device.driver != ''", time.monotonic() + CEL_TIMEOUT, "attacker")
        assert refused.refused and not refused.accepted and workers.refusals == 1
        served = workers(space, "device.driver != ''", time.monotonic() + CEL_TIMEOUT, "tenant")
        assert not served.refused and served.accepted == {d.id for d in space.devices}
        running.join(CEL_TIMEOUT + 10)
        assert workers._held == {}
    finally:
        workers.close()


SLOW = "[" + ",".join(str(i) for i in range(40)) + "].all(x, x >= 0 && device.driver != '')"


def test_a_burst_of_one_templates_pods_takes_one_worker(catalog: Catalog) -> None:
    """Pods made from one template at once share its selectors' evaluation: one worker runs
    it, the others wait for that result instead of each asking for a worker (and being
    refused beyond the namespace's share)."""
    workers = CelWorkers(2)
    try:
        resolver = MemoryResolver([*OBJECTS, _namespaced("burst", "tenant", SLOW)])
        admission = Admission(
            Settings(), lambda: catalog, resolver, cel_timeout_seconds=30, cel_runner=workers
        )
        body = json.dumps(review(_claim_pod("tenant", "burst"), namespace="tenant")).encode()
        answers: list[dict[str, Any]] = []

        def admit() -> None:
            answers.append(admission.decide(parse_review(body), time.monotonic())["response"])

        burst = [threading.Thread(target=admit) for _ in range(8)]
        for thread in burst:
            thread.start()
        for thread in burst:
            thread.join(60)
        assert len(answers) == 8
        assert all(a["allowed"] for a in answers), [a.get("status") for a in answers]
        assert workers.refusals == 0
    finally:
        workers.close()
