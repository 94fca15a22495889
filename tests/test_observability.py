"""Structured logs carry the sandbox context; metrics render in Prometheus text format."""

from __future__ import annotations

import json
import logging

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from adaptor.runtime import logs, metrics


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
    assert metrics.selection_reason_category("no type offers MIG profile 9g.99gb") == "mig"
