"""`kubectl apply -k config/deploy --dry-run=client`, without kubectl: the kustomization tree is
built the way kustomize builds it (resources in order, image overrides, namespaces) and every
object of the result validates against the Kubernetes schema of the version we target. Any
kustomization field this build does not implement fails the test, so it never silently differs
from kustomize. The built workloads run the peerpods image of this package's version: the webhook
as non-root, the adaptor as root with only added capabilities."""

from __future__ import annotations

import copy
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "config" / "deploy"
K8S_VERSION = "1.34"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = "ghcr.io/peerpods/peerpods"
CUSTOM_KINDS = {("cert-manager.io/v1", "Certificate"), ("cert-manager.io/v1", "Issuer")}
SUPPORTED = {"apiVersion", "kind", "resources", "images", "namespace", "patches", "replacements"}
# What the adaptor's networking may add (docs/networking.md): VXLAN devices, tc and nftables
# rules (NET_ADMIN) made inside each pod's network namespace, which setns(2) enters (SYS_ADMIN).
ADAPTOR_CAPABILITIES = {"NET_ADMIN", "SYS_ADMIN"}


def _set_image(image: str, overrides: list[dict[str, str]]) -> str:
    """kustomize's `images` transformer: a matching name gets its new name and tag."""
    name, tag = image, ""
    if ":" in image.rsplit("/", 1)[-1]:
        name, tag = image.rsplit(":", 1)
    for override in overrides:
        if override["name"] == name:
            name = override.get("newName", name)
            tag = override.get("newTag", tag)
    return f"{name}:{tag}" if tag else name


def _pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
        return [doc["spec"]["template"]["spec"]]
    if doc["kind"] == "CronJob":
        return [doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    if doc["kind"] == "Pod":
        return [doc["spec"]]
    return []


def build(directory: Path) -> list[dict[str, Any]]:
    """What `kustomize build directory` prints, for the fields our kustomizations use."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(kustomization) - SUPPORTED
    assert not unsupported, f"{directory}: kustomization fields not built here: {unsupported}"
    documents: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        assert path.exists(), f"{directory}/kustomization.yaml names missing {entry}"
        if path.is_dir():
            documents += build(path)
        else:
            documents += [copy.deepcopy(d) for d in yaml.safe_load_all(path.read_text()) if d]
    for patch in kustomization.get("patches", []):
        documents = _patched(directory, patch, documents)
    for doc in documents:
        if "namespace" in kustomization and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = kustomization["namespace"]
        for spec in _pod_specs(doc):
            for container in spec.get("initContainers", []) + spec.get("containers", []):
                container["image"] = _set_image(container["image"], kustomization.get("images", []))
    for replacement in kustomization.get("replacements", []):
        _replace(directory, replacement, documents)
    return documents


def _field(doc: Any, path: str, value: Any = None) -> Any:
    """kustomize's fieldPath (`a.b.[name=x].c`): the value there, or set it when `value` is
    given; a path that does not resolve fails."""
    *parents, last = path.split(".")
    node = doc
    for part in [*parents, last] if value is None else parents:
        if part.startswith("[") and part.endswith("]"):
            key, _, wanted = part[1:-1].partition("=")
            (node,) = [item for item in node if item.get(key) == wanted]
        else:
            node = node[part]
    if value is not None:
        node[last] = value
    return node


def _replace(directory: Path, replacement: dict[str, Any], documents: list[dict[str, Any]]) -> None:
    """kustomize's `replacements` for the form ours use: one source object's field copied to
    fields of target objects named by kind and name; any other form fails."""
    source, targets = replacement["source"], replacement["targets"]
    assert set(replacement) == {"source", "targets"}, f"{directory}: {replacement}"
    assert set(source) == {"kind", "name", "fieldPath"}, f"{directory}: {source}"

    def one(kind: str, name: str) -> dict[str, Any]:
        (found,) = [d for d in documents if (d["kind"], d["metadata"]["name"]) == (kind, name)]
        return found

    value = _field(one(source["kind"], source["name"]), source["fieldPath"])
    for target in targets:
        assert set(target) == {"select", "fieldPaths"} and set(target["select"]) == {"kind", "name"}
        doc = one(target["select"]["kind"], target["select"]["name"])
        for path in target["fieldPaths"]:
            _field(doc, path, value)


def _patched(
    directory: Path, patch: dict[str, Any], documents: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """kustomize's `patches` for the form ours use: a JSON 6902 patch (a file of operations)
    on the objects named by kind and name; any other form fails."""
    assert set(patch) == {"path", "target"}, f"{directory}: patch form not built here: {patch}"
    assert set(patch["target"]) == {"kind", "name"}, patch["target"]
    operations = yaml.safe_load((directory / patch["path"]).read_text())
    assert isinstance(operations, list), f"{patch['path']}: not a JSON 6902 patch"
    target = patch["target"]
    hits = 0
    result = []
    for doc in documents:
        if doc["kind"] == target["kind"] and doc["metadata"]["name"] == target["name"]:
            doc = jsonpatch.apply_patch(doc, operations)
            hits += 1
        result.append(doc)
    assert hits == 1, f"{directory}: patch target {target} matched {hits} objects"
    return result


CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "RuntimeClass",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
BUILT = build(DEPLOY)


def _workload(kind: str) -> dict[str, Any]:
    """The adaptor's DaemonSet or the webhook's Deployment (the node installer is its own)."""
    (found,) = [
        d for d in BUILT if d["kind"] == kind and d["metadata"]["name"] != "peerpods-node-installer"
    ]
    return found


@pytest.mark.parametrize("doc", BUILT, ids=[f"{d['kind']}/{d['metadata']['name']}" for d in BUILT])
def test_built_object_validates(doc: dict[str, Any]) -> None:
    if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
        assert doc["metadata"]["name"] and doc["spec"]
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_namespaced_objects_have_a_namespace() -> None:
    for doc in BUILT:
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"].get("namespace") == "peerpods-system", doc["metadata"]


def test_workloads_run_this_versions_image() -> None:
    for kind in ("DaemonSet", "Deployment"):
        for container in _workload(kind)["spec"]["template"]["spec"]["containers"]:
            assert container["image"] == f"{IMAGE}:{VERSION}", (kind, container["image"])


def test_image_override_is_applied() -> None:
    overrides = [{"name": IMAGE, "newName": "registry.example.com/peerpods", "newTag": "9"}]
    assert _set_image(f"{IMAGE}:0.1.0", overrides) == "registry.example.com/peerpods:9"
    assert _set_image("registry.k8s.io/kubectl:v1.34.0", overrides) == (
        "registry.k8s.io/kubectl:v1.34.0"
    )


def test_webhook_runs_as_non_root_with_no_capabilities() -> None:
    spec = _workload("Deployment")["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_adaptor_adds_only_what_its_networking_needs() -> None:
    spec = _workload("DaemonSet")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    context = container["securityContext"]
    assert not context.get("privileged") and context["allowPrivilegeEscalation"] is False
    assert spec["securityContext"]["runAsUser"] == 0  # the image's user is 65532
    assert context["capabilities"]["drop"] == ["ALL"]
    assert set(context["capabilities"]["add"]) <= ADAPTOR_CAPABILITIES, context["capabilities"]


CATALOG_REFRESH = ROOT / "config" / "catalog-refresh"
REFRESHED = build(CATALOG_REFRESH)
REGION_KEYS = ("PEERPODS_AWS_REGION", "PEERPODS_AZURE_REGION", "PEERPODS_GCP_ZONES")


def _in(built: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in built if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _claims(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """mountPath -> (claim name, read-only) for the container's volumes that are claims."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    found = {}
    for mount in container.get("volumeMounts", []):
        claim = volumes[mount["name"]].get("persistentVolumeClaim")
        if claim:
            found[mount["mountPath"]] = (claim["claimName"], bool(mount.get("readOnly")))
    return found


@pytest.mark.parametrize(
    "doc", REFRESHED, ids=[f"{d['kind']}/{d['metadata']['name']}" for d in REFRESHED]
)
def test_the_catalog_refresh_overlay_validates(doc: dict[str, Any]) -> None:
    if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    if doc["kind"] not in CLUSTER_SCOPED:
        assert doc["metadata"]["namespace"] == "peerpods-system"


def test_the_catalogs_are_mounted_where_the_webhook_and_the_adaptors_read_them() -> None:
    cronjob = _in(REFRESHED, "CronJob", "peerpods-catalog-refresh")
    job_pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (refresh,) = job_pod["containers"]
    out = refresh["args"][refresh["args"].index("--out") + 1]
    written, read_only = _claims(job_pod, refresh)[out]
    assert not read_only
    for kind, name in (("Deployment", "peerpods-webhook"), ("DaemonSet", "peerpods-adaptor")):
        pod = _in(REFRESHED, kind, name)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        directory = env["PEERPODS_CATALOG_DIR"]
        assert _claims(pod, container)[directory] == (written, True), (kind, directory)
    # config/deploy alone mounts nothing it may lack (no claim without the refresh job)
    for kind in ("Deployment", "DaemonSet"):
        pod = _workload(kind)["spec"]["template"]["spec"]
        assert not _claims(pod, pod["containers"][0])


def test_the_webhook_and_the_refresh_take_the_adaptors_provider_and_region() -> None:
    config = _in(BUILT, "ConfigMap", "peerpods-adaptor")
    webhook = _workload("Deployment")["spec"]["template"]["spec"]["containers"][0]
    cronjob = _in(REFRESHED, "CronJob", "peerpods-catalog-refresh")
    (refresh,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    for container in (webhook, refresh):
        refs = {
            e["name"]: e["valueFrom"]["configMapKeyRef"]
            for e in container["env"]
            if "configMapKeyRef" in e.get("valueFrom", {})
        }
        for key in ("PEERPODS_PROVIDER", *REGION_KEYS):
            assert refs[key]["name"] == config["metadata"]["name"] and refs[key]["key"] == key
        assert "PEERPODS_REGION" not in refs  # never the AWS key under another provider's name
    assert "PEERPODS_AWS_REGION" in config["data"]


def test_the_refresh_job_runs_the_image_config_deploy_names(tmp_path: Path) -> None:
    """`kustomize edit set image` in config/deploy (docs/install.md) reaches the CronJob too; an
    `images` entry of config/catalog-refresh's own left it on the default image."""
    shutil.copytree(ROOT / "config", tmp_path / "config")
    deploy = tmp_path / "config" / "deploy" / "kustomization.yaml"
    kustomization = yaml.safe_load(deploy.read_text())
    mine = "registry.example.com/team/peerpods"
    kustomization["images"] = [{"name": IMAGE, "newName": mine, "newTag": "v9"}]
    deploy.write_text(yaml.safe_dump(kustomization))
    built = build(tmp_path / "config" / "catalog-refresh")
    cronjob = _in(built, "CronJob", "peerpods-catalog-refresh")
    (refresh,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    webhook = _in(built, "Deployment", "peerpods-webhook")["spec"]["template"]["spec"]
    assert refresh["image"] == webhook["containers"][0]["image"] == f"{mine}:v9"
    assert (
        _in(REFRESHED, "CronJob", "peerpods-catalog-refresh")["spec"]["jobTemplate"]["spec"][
            "template"
        ]["spec"]["containers"][0]["image"]
        == f"{IMAGE}:{VERSION}"
    )
    if shutil.which("kubectl"):  # kustomize itself, where installed, agrees
        done = subprocess.run(
            ["kubectl", "kustomize", str(tmp_path / "config" / "catalog-refresh")],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        images = {line.split("image:", 1)[1].strip() for line in done.stdout.splitlines()
                  if line.strip().startswith("image:")}  # fmt: skip
        assert images == {f"{mine}:v9"}, images


def test_the_webhook_is_ready_only_with_its_catalog_and_never_killed_for_it() -> None:
    webhook = _workload("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert webhook["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert webhook["livenessProbe"]["httpGet"]["path"] == "/healthz"
    adaptor = _workload("DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert adaptor["readinessProbe"]["httpGet"]["path"] == "/readyz"


DRA_DRIVER = build(ROOT / "config" / "dra-driver")


@pytest.mark.parametrize(
    "doc", DRA_DRIVER, ids=[f"{d['kind']}/{d['metadata']['name']}" for d in DRA_DRIVER]
)
def test_the_dra_driver_overlay_validates(doc: dict[str, Any]) -> None:
    if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS or doc["kind"] == "DeviceClass":
        return  # DeviceClass (resource.k8s.io/v1) is checked in tests/dra against 1.36's schema
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_dra_driver_overlay_serves_the_kubelet_plugin_where_the_kubelet_looks() -> None:
    """The adaptor's kubelet plugin finds the kubelet's registry, its own folder and containerd's
    CDI folder on the host, at the paths its settings default to; the webhook keeps GPUs for the
    scheduler; and the DeviceClasses and the publisher come with them."""
    from adaptor.dra.settings import DraPluginSettings

    defaults = DraPluginSettings()
    pod = _in(DRA_DRIVER, "DaemonSet", "peerpods-adaptor")["spec"]["template"]["spec"]
    adaptor = pod["containers"][0]
    assert {"name": "PEERPODS_DRA_PLUGIN", "value": "true"} in adaptor["env"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    host_paths = {
        m["mountPath"]: volumes[m["name"]]["hostPath"]["path"]
        for m in adaptor["volumeMounts"]
        if "hostPath" in volumes[m["name"]]
    }
    for folder in (defaults.dra_registry_dir, defaults.dra_plugin_dir, defaults.dra_cdi_dir):
        assert host_paths.get(str(folder)) == str(folder), folder
    webhook = _in(DRA_DRIVER, "Deployment", "peerpods-webhook")["spec"]["template"]["spec"]
    assert {"name": "PEERPODS_DRA_DRIVER", "value": "true"} in webhook["containers"][0]["env"]
    classes = {d["metadata"]["name"] for d in DRA_DRIVER if d["kind"] == "DeviceClass"}
    assert "nvidia-gpu.gpu.peerpods.io" in classes
    # config/deploy alone stays on the annotation path
    plain = _workload("DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert all(e["name"] != "PEERPODS_DRA_PLUGIN" for e in plain["env"])
