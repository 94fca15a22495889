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


# config/deploy/dra is the DRA-driver mode's own kustomization, applied beside (docs/dra.md)
DOCUMENTS = _kustomized(DEPLOY) + _kustomized(DEPLOY / "dra")


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
    # the node's capacity is advertised by the adaptor itself (tests/node/test_advertise.py)
    (adaptor,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert "PEERPODS_NODE_NAME" in {e["name"] for e in adaptor["env"]}


def test_daemonset_has_what_pod_networking_needs_and_no_more() -> None:
    daemonset = next(d for _, d in DOCUMENTS if d["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    adaptor = next(c for c in pod["containers"] if c["name"] == "adaptor")
    security = adaptor["securityContext"]
    assert security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_ADMIN"]}
    mounts = {m["mountPath"]: m for m in adaptor["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in ("/run/netns", "/var/run/netns"):
        assert mounts[path]["mountPropagation"] == "HostToContainer"
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path


def _flag_env_names(command: str) -> set[str]:
    import argparse

    from adaptor.cli.flags import env_name
    from adaptor.cli.main import build_parser

    parser = build_parser()
    for word in command.split():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return {
        env_name(option)
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--")
    }


def test_every_peerpods_setting_in_the_manifests_is_a_real_flag() -> None:
    from adaptor.cli.region import AWS_REGION, AZURE_REGION, GCP_ZONES

    known = {"serve": _flag_env_names("serve"), "webhook": _flag_env_names("webhook")}
    # the webhook reads serve's own region settings for its catalog's region (adaptor.cli.region)
    known["webhook"] |= {AWS_REGION, AZURE_REGION, GCP_ZONES} & known["serve"]
    known["dra publish"] = _flag_env_names("dra publish")
    for path, doc in DOCUMENTS:
        command = "webhook" if "webhook" in path.parts else "serve"
        command = "dra publish" if "dra" in path.parts else command
        names: list[str] = []
        if doc["kind"] == "ConfigMap":
            names += list(doc["data"])
        for workload in (d for d in [doc] if d["kind"] in ("DaemonSet", "Deployment")):
            for c in workload["spec"]["template"]["spec"]["containers"]:
                names += [e["name"] for e in c.get("env", [])]
        for name in names:
            if name.startswith("PEERPODS_") and not (
                doc["kind"] == "ConfigMap" and name in known["webhook"]
            ):
                assert name in known[command], f"{path.name}: {name} is not a {command} flag"
