"""config/catalog-refresh: a daily `peerpods catalog refresh` into a ReadWriteMany volume, with
arguments the command takes, writing where the volume is mounted; every object validates, and
with kubectl the kustomization renders to exactly the CronJob and the claim."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from adaptor.cli.main import build_parser

CATALOGS = Path(__file__).resolve().parent.parent / "config" / "catalog-refresh"
# the objects this folder adds (mount-catalogs.yaml is a patch of config/deploy's workloads)
DOCS = [d for p in sorted(CATALOGS.glob("*.yaml"))
        if p.name not in ("kustomization.yaml", "mount-catalogs.yaml")
        for d in yaml.safe_load_all(p.read_text()) if d]  # fmt: skip


def test_the_refresh_writes_where_the_shared_volume_is() -> None:
    for doc in DOCS:
        kubernetes_validate.validate(doc, "1.34", strict=True)
    (cronjob,) = [d for d in DOCS if d["kind"] == "CronJob"]
    (pvc,) = [d for d in DOCS if d["kind"] == "PersistentVolumeClaim"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    parsed = build_parser().parse_args(container["args"])  # exits on a flag that does not exist
    assert container["args"][:2] == ["catalog", "refresh"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = volumes[mounts[parsed.out]]["persistentVolumeClaim"]["claimName"]
    assert claim == pvc["metadata"]["name"]
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders kustomizations here")
def test_the_kustomization_renders() -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(CATALOGS)], capture_output=True, text=True, timeout=120
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds.count("CronJob") == 1 and kinds.count("PersistentVolumeClaim") == 1
    assert {"Deployment", "DaemonSet"} <= set(kinds)  # config/deploy, with the catalogs mounted
    assert {d["metadata"].get("namespace", "peerpods-system") for d in docs} == {"peerpods-system"}
    assert {d["metadata"]["namespace"] for d in docs if d["kind"] == "CronJob"} == {
        "peerpods-system"
    }
