"""The webhook's Prometheus metrics, on its own registry (served at GET /metrics).

peerpods_webhook_admissions_total{operation, result}   reviews decided: result is "allowed"
                                                       (no patch), "mutated" or "denied"
peerpods_webhook_denials_total{operation, code}        denials by their HTTP-like code (400:
                                                       the pod as written, 403: no type or
                                                       a contract change, 429, 503: the API)
peerpods_webhook_admission_seconds{operation}          from a review's arrival to its answer
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry()

ADMISSIONS = Counter(
    "peerpods_webhook_admissions_total",
    "Admission reviews decided, by operation and result",
    ["operation", "result"],
    registry=REGISTRY,
)
DENIALS = Counter(
    "peerpods_webhook_denials_total",
    "Admission reviews denied, by operation and status code",
    ["operation", "code"],
    registry=REGISTRY,
)
LATENCY = Histogram(
    "peerpods_webhook_admission_seconds",
    "Seconds from a review's arrival to its answer",
    ["operation"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)


def observe(operation: str, answer: dict[str, Any], seconds: float) -> None:
    """Count one answered review."""
    operation = operation if operation in ("CREATE", "UPDATE") else "OTHER"
    response = answer.get("response") or {}
    if not response.get("allowed", False):
        result = "denied"
        code = str((response.get("status") or {}).get("code", 403))
        DENIALS.labels(operation, code).inc()
    else:
        result = "mutated" if response.get("patch") else "allowed"
    ADMISSIONS.labels(operation, result).inc()
    LATENCY.labels(operation).observe(max(seconds, 0.0))
