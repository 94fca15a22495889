"""GET /metrics on the webhook: every decided review is counted by operation and result, denials
by code, and the time from arrival to answer observed (the alerts in config/monitoring use these
names)."""

from __future__ import annotations

import re

from tests.webhook.conftest import Running, container, pod, post, review


def _value(text: str, name: str, labels: str) -> float:
    found = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _metrics(webhook: Running) -> str:
    reply = webhook.client.get(webhook.url + "/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    return reply.text


def test_reviews_are_counted_by_result_and_denials_by_code(webhook: Running) -> None:
    before = _metrics(webhook)
    assert post(webhook, review(pod(container("c", limits={"nvidia.com/gpu": "1"}))))["allowed"]
    plain = pod(container("c"), runtime=None)
    assert "patch" not in post(webhook, review(plain))
    huge = pod(container("c", limits={"hugepages-2Mi": "1Gi", "cpu": "1"}))
    assert post(webhook, review(huge))["allowed"] is False
    after = _metrics(webhook)
    admissions = "peerpods_webhook_admissions_total"
    for labels, added in (
        ('operation="CREATE",result="mutated"', 1),
        ('operation="CREATE",result="allowed"', 1),
        ('operation="CREATE",result="denied"', 1),
    ):
        assert _value(after, admissions, labels) - _value(before, admissions, labels) == added
    denied = 'code="400",operation="CREATE"'
    assert (
        _value(after, "peerpods_webhook_denials_total", denied)
        - _value(before, "peerpods_webhook_denials_total", denied)
        == 1
    )
    count = "peerpods_webhook_admission_seconds_count"
    assert (
        _value(after, count, 'operation="CREATE"') - _value(before, count, 'operation="CREATE"')
        == 3
    )
