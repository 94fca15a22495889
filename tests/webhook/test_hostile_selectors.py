"""Hostile DRA selectors, as a tenant who may create ResourceClaimTemplates would write them,
against the live webhook server with its CEL worker processes.

The issue's requirement is about time, so these tests time the answers, with wide margins: while
hostile selectors run, `/healthz` and ordinary pods answer in under a second, and the hostile pod
is denied, naming its selector, within the wall-clock limit (plus slack for a loaded machine).
"""

from __future__ import annotations

import os
import signal
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
from tests.webhook.conftest import (
    Running,
    ServerThread,
    client_context,
    container,
    pod,
    post,
    review,
)
from tests.webhook.test_dra import CLASSES, exactly, template
from webhook import Admission, MemoryResolver, ServerConfig, Settings
from webhook._cel import COST_LIMIT, CelBudgetExceeded, Meter, compile_selector, evaluate
from webhook._celworker import CelWorkers
from webhook._devices import DeviceSpace

CEL_TIMEOUT = 2.0
SLACK = 4.0  # a loaded 2-core CI machine: killing and replacing a worker is not instant

LIST = "[" + ",".join(str(i) for i in range(60)) + "]"
NESTED = f"{LIST}.all(x, {LIST}.all(y, {LIST}.exists(z, z == x + y + 1000)))"
HUGE = "quantity('1e999999').asInteger() > 0"
PARENS = "(" * 120 + "device.driver == 'gpu.nvidia.com'" + ")" * 120

HOSTILE = [
    template("nested", [exactly("gpu", "gpu.nvidia.com", NESTED)]),
    template("huge", [exactly("gpu", "gpu.nvidia.com", HUGE)]),
    template("parens", [exactly("gpu", "gpu.nvidia.com", PARENS)]),
    template("plain", [exactly("gpu", "gpu.nvidia.com")]),
]


@pytest.fixture(scope="module")
def hostile(tls_dir: Path, ca: trustme.CA, catalog: Catalog) -> Iterator[Running]:
    resolver = MemoryResolver([*yaml.safe_load_all(CLASSES), *HOSTILE])
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
        httpx.Client(verify=client_context(ca), timeout=30) as client,
    ):
        yield Running(f"https://127.0.0.1:{server.port}", server, client)


def claim_pod(template_name: str) -> dict[str, Any]:
    main = container("main")
    main["resources"] = {"claims": [{"name": "c"}]}
    return pod(main, resourceClaims=[{"name": "c", "resourceClaimTemplateName": template_name}])


def _timed(call: Any) -> tuple[float, Any]:
    start = time.monotonic()
    result = call()
    return time.monotonic() - start, result


def test_healthz_and_plain_pods_answer_while_hostile_selectors_run(
    hostile: Running, ca: trustme.CA
) -> None:
    answers: list[tuple[float, dict[str, Any]]] = []

    def attack() -> None:
        with httpx.Client(verify=client_context(ca), timeout=60) as client:
            body = review(claim_pod("nested"))
            start = time.monotonic()
            reply = client.post(hostile.url + "/mutate", json=body)
            answers.append((time.monotonic() - start, reply.json()["response"]))

    attackers = [threading.Thread(target=attack) for _ in range(8)]  # as in the report; 2 workers
    for thread in attackers:
        thread.start()
    try:
        time.sleep(0.3)  # the selectors are running now
        for _ in range(5):
            took, reply = _timed(lambda: hostile.client.get(hostile.url + "/healthz"))
            assert reply.status_code == 200 and took < 1.0, took
            ordinary = pod(container("web", limits={"cpu": "1"}), runtime=None)
            took, answer = _timed(lambda p=ordinary: post(hostile, review(p)))  # type: ignore[misc]
            assert answer["allowed"] is True and took < 1.0, took
            peer = pod(container("gpu", limits={"nvidia.com/gpu": "1"}))
            took, answer = _timed(lambda p=peer: post(hostile, review(p)))  # type: ignore[misc]
            assert answer["allowed"] is True and took < 1.0, took
    finally:
        for thread in attackers:
            thread.join(60)
    assert len(answers) == 8
    assert any(a["status"]["code"] == 400 for _, a in answers)
    for took, answer in answers:
        assert answer["allowed"] is False
        message = answer["status"]["message"]
        if answer["status"]["code"] == 503:  # its turn at a worker never came: retry later
            assert "no CEL worker became free within the 2s limit" in message, message
        elif answer["status"]["code"] == 429:  # the namespace held its share: refused at once
            assert "namespace default" in message and "share" in message, message
        else:
            assert answer["status"]["code"] == 400
            # named by where it stands, never quoted
            assert "selector 1 of claim c request gpu" in message, message
            assert "time limit of 2s" in message and "[0,1,2" not in message, message
        # each waits for a free worker at most until its own deadline
        assert took < CEL_TIMEOUT + SLACK, took
    # the workers are free again: a reasonable claim is admitted
    answer = post(hostile, review(claim_pod("plain")))
    assert answer["allowed"] is True, answer


def test_huge_quantity_is_a_runtime_error_as_in_kubernetes(hostile: Running) -> None:
    """1e999999 is capped at 2^63-1 as Kubernetes' resource.Quantity caps it (cheap), but it
    is no int64: Kubernetes' quantity library fails `asInteger()` on it, and a selector that
    fails fails the claim's allocation (k8s.io/apiserver pkg/cel/library/quantity.go)."""
    took, answer = _timed(lambda: post(hostile, review(claim_pod("huge"))))
    assert answer["allowed"] is False, answer
    assert answer["status"]["code"] == 400
    message = answer["status"]["message"]
    assert "selector 1 of" in message and "CEL runtime error" in message, message
    assert "does not fit an int64" in message, message
    assert took < CEL_TIMEOUT + SLACK, took


def test_deeply_nested_selector_is_a_denial(hostile: Running) -> None:
    answer = post(hostile, review(claim_pod("parens")))
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 400
    assert "nested too deeply" in answer["status"]["message"]


def test_cost_budget_is_metered_per_device(catalog: Catalog) -> None:
    """The same budget Kubernetes applies, counted in evaluation steps: a selector that
    spends more is stopped with a denial that names the limit."""
    space = DeviceSpace(catalog)
    program = compile_selector(NESTED)
    with pytest.raises(CelBudgetExceeded, match="exceeds the CEL cost limit of 20000"):
        evaluate(program, space.devices[0].activation, Meter(limit=20_000))
    cheap = compile_selector("device.attributes['gpu.nvidia.com'].type == 'gpu'")
    meter = Meter()
    assert evaluate(cheap, space.devices[0].activation, meter) is True
    assert 0 < meter.used < 100 < COST_LIMIT


def test_a_stuck_worker_is_killed_and_replaced(catalog: Catalog) -> None:
    """A worker that cannot answer (stopped here with SIGSTOP, as a builtin call that never
    returns would leave it) is killed at the deadline and restarted before anyone uses it again;
    the next selector gets the fresh one."""
    space = DeviceSpace(catalog)
    workers = CelWorkers(1)
    try:
        first = workers(space, "device.attributes['gpu.nvidia.com'].type == 'gpu'", None)
        assert first.accepted and not first.timed_out
        worker = workers._all[0]
        pid = worker.process.pid
        os.kill(pid, signal.SIGSTOP)
        stuck = workers(space, "device.driver == 'gpu.nvidia.com'", time.monotonic() + 0.5)
        assert stuck.timed_out and workers.kills == 1
        again = workers(space, "device.driver == 'gpu.nvidia.com'", time.monotonic() + 30)
        assert again.accepted == first.accepted | {d.id for d in space.devices if d.kind == "mig"}
        assert worker.process is not None and worker.process.pid != pid
    finally:
        workers.close()
