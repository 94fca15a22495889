"""Structured logs carry the sandbox context; metrics render in Prometheus text format."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from adaptor.runtime import logs, metrics
from providers.core.errors import NoMatch


def test_json_log_lines_carry_sandbox_and_pod() -> None:
    record = logging.LogRecord(
        "peerpods.test", logging.INFO, __file__, 1, "VM %s ready", ("i-1",), None
    )
    formatter = logs.JsonFormatter()
    with logs.sandbox_context("sb-1", "ml/trainer-0"):
        inside = json.loads(formatter.format(record))
    outside = json.loads(formatter.format(record))
    assert inside["message"] == "VM i-1 ready"
    assert (inside["sandbox_id"], inside["pod"]) == ("sb-1", "ml/trainer-0")
    assert "sandbox_id" not in outside


def test_metrics_parse_with_prometheus_parser() -> None:
    metrics.set_sandbox_counts({"running": 2, "failed": 1})
    metrics.PROXY_CALLS.labels(method="grpc.AgentService/CreateContainer", code="0").inc()
    families = {
        f.name: f
        for f in text_string_to_metric_families(generate_latest(metrics.REGISTRY).decode())
    }
    states = {s.labels["state"]: s.value for s in families["peerpods_sandboxes"].samples}
    assert states["running"] == 2 and states["failed"] == 1 and states["created"] == 0
    calls = [s for s in families["peerpods_proxy_calls"].samples if s.name.endswith("_total")]
    assert any(s.labels["method"].endswith("CreateContainer") and s.value >= 1 for s in calls)


@pytest.mark.parametrize(
    ("request_fields", "stage"),
    [
        ({"mig": {"9g.99gb": 1}}, "mig"),
        ({"gpus": 1, "gpu_models": ("h100",), "gpu_memory_mib": 10**7}, "memory"),
        ({"gpus": 64}, "too_large"),
        ({"gpus": 1, "deny": ("*",)}, "policy"),
    ],
)
def test_a_failed_selection_carries_its_stage(request_fields: dict[str, Any], stage: str) -> None:
    """Metrics label a failed selection by the stage that ruled the types out, not its text."""
    from providers.core.request import InstanceRequest
    from providers.core.selection import select
    from providers.core.snapshots import load_catalog

    with pytest.raises(NoMatch) as caught:
        select(load_catalog("aws"), InstanceRequest(**request_fields)).selected  # noqa: B018
    assert caught.value.stage == stage, str(caught.value)
