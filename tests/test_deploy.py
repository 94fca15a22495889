"""Deploy manifests: every document validates against the Kubernetes schema, the kustomization
tree references files that exist, and no object is defined twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "config" / "deploy"
K8S_VERSION = "1.34"
# Custom resources the Kubernetes schema does not know; checked structurally below.
CUSTOM_KINDS = {("cert-manager.io/v1", "Certificate"), ("cert-manager.io/v1", "Issuer")}


def _kustomized(directory: Path) -> list[tuple[Path, dict[str, Any]]]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    documents: list[tuple[Path, dict[str, Any]]] = []
    for entry in kustomization["resources"]:
        path = directory / entry
        assert path.exists(), f"{directory}/kustomization.yaml names missing {entry}"
        if path.is_dir():
            documents.extend(_kustomized(path))
        else:
            documents.extend((path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc)
    return documents


DOCUMENTS = _kustomized(DEPLOY)


def test_every_manifest_file_is_part_of_the_kustomization() -> None:
    listed = {path for path, _ in DOCUMENTS}
    on_disk = {p for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml"}
    assert on_disk <= listed, f"not referenced by any kustomization: {sorted(on_disk - listed)}"


def test_no_object_defined_twice() -> None:
    seen: dict[tuple[str, str, str], Path] = {}
    for path, doc in DOCUMENTS:
        key = (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
        assert key not in seen, f"{key} defined in {seen.get(key)} and {path}"
        seen[key] = path


@pytest.mark.parametrize(
    "doc",
    [doc for _, doc in DOCUMENTS],
    ids=[f"{p.relative_to(DEPLOY)}:{d['kind']}/{d['metadata']['name']}" for p, d in DOCUMENTS],
)
def test_manifest_validates(doc: dict[str, Any]) -> None:
    if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
        assert doc["metadata"]["name"] and doc["spec"]
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_daemonset_serves_the_kata_socket_directory() -> None:
    daemonset = next(d for _, d in DOCUMENTS if d["kind"] == "DaemonSet")
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["run-peerpod"]["hostPath"]["path"] == "/run/peerpod"
    init = daemonset["spec"]["template"]["spec"]["initContainers"][0]
    assert "kata.peerpods.io~1vm" in " ".join(init["command"])
