"""config/monitoring renders and every object checks out: the core objects against the
Kubernetes schema, the Prometheus Operator objects against what the operator requires of them;
the monitors select what config/deploy runs and scrape ports that exist; every metric the alerts
and the dashboard use is one the code exports; every alert says where docs/monitoring.md explains
it. With kubectl (kustomize built in), the rendered output is checked too."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from adaptor.node.settings import ServeSettings
from adaptor.runtime import metrics as adaptor_metrics
from webhook import _metrics as webhook_metrics

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "config" / "monitoring"
DEPLOY = ROOT / "config" / "deploy"
DOCS = (ROOT / "docs" / "monitoring.md").read_text()
KUSTOMIZATION = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
OBJECTS = [
    d for name in KUSTOMIZATION["resources"]
    for d in yaml.safe_load_all((MONITORING / name).read_text()) if d
]  # fmt: skip
DASHBOARD = json.loads((MONITORING / "dashboard.json").read_text())
OPERATOR = "monitoring.coreos.com/v1"


def _deployed() -> list[dict[str, Any]]:
    return [d for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml"
            for d in yaml.safe_load_all(p.read_text()) if d]  # fmt: skip


def _names() -> set[str]:
    """Every sample name the code can export."""
    names: set[str] = set()
    for registry in (adaptor_metrics.REGISTRY, webhook_metrics.REGISTRY):
        for family in registry.collect():
            names.add(family.name)
            suffixes = ("_total",) if family.type == "counter" else ()
            if family.type == "histogram":
                suffixes = ("_bucket", "_count", "_sum")
            names.update(family.name + s for s in suffixes)
    return names


def _exprs() -> list[str]:
    exprs = [r["expr"] for d in OBJECTS if d["kind"] == "PrometheusRule"
             for g in d["spec"]["groups"] for r in g["rules"]]  # fmt: skip
    exprs += [t["expr"] for p in DASHBOARD["panels"] for t in p["targets"]]
    return exprs


@pytest.mark.parametrize(
    "doc", OBJECTS, ids=[f"{d['kind']}/{d['metadata']['name']}" for d in OBJECTS]
)
def test_each_object_validates(doc: dict[str, Any]) -> None:
    if doc["apiVersion"] == OPERATOR:
        assert doc["kind"] in ("ServiceMonitor", "PodMonitor", "PrometheusRule")
        assert doc["metadata"]["name"] and doc["spec"]
        return
    kubernetes_validate.validate(doc, "1.34", strict=True)


def test_the_monitors_select_what_is_deployed_and_scrape_named_ports() -> None:
    deployed = _deployed()
    service = next(d for d in OBJECTS if d["kind"] == "Service")
    monitor = next(d for d in OBJECTS if d["kind"] == "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    webhook = next(d for d in deployed if d["kind"] == "Deployment")
    pod_labels = webhook["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = {
        p["name"] for c in webhook["spec"]["template"]["spec"]["containers"] for p in c["ports"]
    }
    assert service["spec"]["ports"][0]["targetPort"] in ports
    podmonitor = next(d for d in OBJECTS if d["kind"] == "PodMonitor")
    adaptor = next(d for d in deployed if d["kind"] == "DaemonSet"
                   and d["metadata"]["name"] == "peerpods-adaptor")  # fmt: skip
    labels = adaptor["spec"]["template"]["metadata"]["labels"]
    assert podmonitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # no declared port (on the host network it would be a host port, which the surge pod of an
    # upgrade cannot share with the old pod): the PodMonitor scrapes the metrics-only listener
    # by number, on every address of the node, while the status API stays on loopback
    assert not [c for c in adaptor["spec"]["template"]["spec"]["containers"] if c.get("ports")]
    config = next(
        d
        for d in deployed
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "peerpods-adaptor"
    )["data"]
    host, _, port = config["PEERPODS_METRICS_ADDRESS"].rpartition(":")
    assert host == "0.0.0.0" and podmonitor["spec"]["podMetricsEndpoints"][0]["targetPort"] == int(
        port
    )
    assert config["PEERPODS_STATUS_ADDRESS"].startswith("127.0.0.1:")
    assert "metrics_address" in ServeSettings.model_fields


def test_the_webhook_scrape_verifies_its_certificate_and_is_admitted() -> None:
    deployed = _deployed()
    monitor = next(d for d in OBJECTS if d["kind"] == "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    tls = endpoint["tlsConfig"]
    assert "insecureSkipVerify" not in tls
    ca_certificate = next(
        d for d in deployed if d["kind"] == "Certificate" and d["spec"].get("isCA")
    )
    assert tls["ca"]["secret"]["name"] == ca_certificate["spec"]["secretName"]
    serving = next(d for d in deployed if d["kind"] == "Certificate" and not d["spec"].get("isCA"))
    assert tls["serverName"] in serving["spec"]["dnsNames"]
    policy = next(
        d
        for d in deployed
        if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "peerpods-webhook"
    )
    scrapes = [
        rule
        for rule in policy["spec"]["ingress"]
        for peer in rule["from"]
        if peer.get("namespaceSelector", {}).get("matchLabels")
        == {"kubernetes.io/metadata.name": "monitoring"}
    ]
    assert scrapes and scrapes[0]["ports"] == [{"protocol": "TCP", "port": 8443}]


def test_every_metric_used_is_exported() -> None:
    known = _names()
    used = {name for expr in _exprs() for name in re.findall(r"\bpeerpods_[a-z_]+", expr)}
    assert used, "no metric used"
    assert used <= known, sorted(used - known)
    # every metric the code exports shows on the dashboard
    family = {n for n in known if not n.endswith(("_bucket", "_count", "_sum", "_total"))}
    shown = {re.sub(r"_(bucket|count|sum|total)$", "", n) for n in used}
    assert family - {"peerpods_selection_failures"} <= shown, sorted(family - shown)


def test_every_alert_is_explained() -> None:
    rules = [r for d in OBJECTS if d["kind"] == "PrometheusRule"
             for g in d["spec"]["groups"] for r in g["rules"]]  # fmt: skip
    assert len(rules) >= 8
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        anchor = rule["alert"].lower()
        assert f"docs/monitoring.md#{anchor}" in rule["annotations"]["description"]
        assert f"### {rule['alert']}\n" in DOCS
        assert rule["expr"].count("(") == rule["expr"].count(")")


def test_the_dashboard_is_grafana_json() -> None:
    assert DASHBOARD["uid"] == "peerpods" and DASHBOARD["schemaVersion"] >= 36
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for panel in DASHBOARD["panels"]:
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
        assert panel["datasource"]["uid"] == "${datasource}"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders kustomizations here")
@pytest.mark.parametrize("directory", [MONITORING, DEPLOY], ids=["monitoring", "deploy"])
def test_kustomize_renders_and_every_object_validates(directory: Path) -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    kinds = {d["kind"] for d in docs}
    if directory == MONITORING:
        assert {"ConfigMap", "Service", "ServiceMonitor", "PodMonitor", "PrometheusRule"} <= kinds
        (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
        assert json.loads(config_map["data"]["peerpods-dashboard.json"]) == DASHBOARD
    else:
        assert {"PodDisruptionBudget", "DaemonSet", "Deployment", "Service"} <= kinds
        assert not any(d["kind"] == "Secret" for d in docs), "a re-apply would wipe hand-made keys"
    for doc in docs:
        assert doc["metadata"].get("namespace", "peerpods-system") == "peerpods-system"
        if doc["apiVersion"] in (OPERATOR, "cert-manager.io/v1"):
            continue
        kubernetes_validate.validate(doc, "1.34", strict=True)
