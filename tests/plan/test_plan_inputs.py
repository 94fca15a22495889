"""`peerpods plan` on manifests that are wrong, unusual or denied: one clear line, never a
traceback; and what the plan does with the rest (workloads, several pods, CDI names, no SDKs)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from adaptor.cli.main import main
from adaptor.cli.pod_plan import load_documents, plan_manifest
from adaptor.devices.naming import CdiNaming
from adaptor.settings import CdiNames
from providers.core.errors import InvalidRequest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "config" / "examples"

POD = """\
apiVersion: v1
kind: Pod
metadata: {name: one, namespace: default}
spec:
  runtimeClassName: kata-remote
  containers:
    - name: main
      image: busybox
      resources:
        limits: {cpu: "2", memory: 4Gi, nvidia.com/gpu: 1}
"""


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, text: str, name: str = "pod.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code != 0
    assert "Traceback" not in out + err
    assert err.endswith("\n") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err


BAD_MANIFESTS = {
    "not-yaml": ("kind: Pod\nspec: [unclosed\n", 2, "not valid YAML (line"),
    "empty": ("# nothing\n", 2, "no Kubernetes objects"),
    "scalar": ("just a string\n", 2, "not a Kubernetes object"),
    "no-pod": (
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: x}\n",
        2,
        "no Pod (or workload with a pod template) in the manifest: DeviceClass",
    ),
    "two-pods": (POD + "---\n" + POD.replace("name: one", "name: two"), 2, "--pod"),
    "spec-not-a-map": ("kind: Pod\nmetadata: {name: p}\nspec: [1, 2]\n", 2, "spec is missing"),
    "template-missing": (
        POD.replace(
            "  containers:",
            "  resourceClaims:\n    - {name: g, resourceClaimTemplateName: nope}\n  containers:",
        ),
        1,
        "ResourceClaimTemplate nope not found",
    ),
    "cpu-wrong-type": (POD.replace('cpu: "2"', "cpu: [2]"), 1, "cpu"),
    "gpu-not-a-number": (POD.replace("nvidia.com/gpu: 1", "nvidia.com/gpu: lots"), 1, "gpu"),
    "claim-not-declared": (
        POD.replace("limits:", "claims: [{name: ghost}]\n        limits:"),
        1,
        "ghost",
    ),
    "impossible-gpu": (POD.replace("nvidia.com/gpu: 1", "nvidia.com/gpu: 64"), 1, "denied (403)"),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
@pytest.mark.parametrize("output", ["table", "json"])
def test_bad_manifest_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str, output: str
) -> None:
    text, exit_code, needle = BAD_MANIFESTS[case]
    code, out, err = plan(capsys, write(tmp_path, text), "--output", output)
    one_line_error(code, out, err, needle)
    assert code == exit_code
    if exit_code == 1 and output == "json":  # a denial still prints its report
        assert json.loads(out)["failure"]["stage"] == "admission"
    if exit_code == 2:
        assert out == ""


def test_unreadable_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = plan(capsys, str(tmp_path / "missing.yaml"))
    one_line_error(code, out, err, "No such file", "missing.yaml")
    code, out, err = plan(capsys, str(tmp_path))
    one_line_error(code, out, err, "is a directory")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00kind")
    code, out, err = plan(capsys, str(binary))
    one_line_error(code, out, err, "not UTF-8")


def test_bad_flags_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    manifest = write(tmp_path, POD)
    code, out, err = plan(capsys, manifest, "--region", "mars-1")
    one_line_error(code, out, err, "no catalog snapshot for aws mars-1")
    code, out, err = plan(capsys, manifest, "--cdi-gpu-name", "not a cdi name")
    one_line_error(code, out, err, "CDI naming")
    code, out, err = plan(capsys, manifest, "--limit", "0")
    one_line_error(code, out, err, "--limit")


def test_pod_flag_picks_one_of_several(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    two = POD + "---\n" + POD.replace("name: one", "name: two").replace("gpu: 1", "gpu: 2")
    manifest = write(tmp_path, two)
    code, out, err = plan(capsys, manifest, "--pod", "two", "--output", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["pod"]["name"] == "two" and data["intent"]["gpu"]["gpus"] == 2
    code, out, err = plan(capsys, manifest, "--pod", "three")
    one_line_error(code, out, err, "no pod named 'three'")


def test_a_deployment_pod_template_is_planned(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    deployment = """\
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: web, namespace: shop}
    spec:
      replicas: 2
      selector: {matchLabels: {app: web}}
      template:
        metadata: {labels: {app: web}}
        spec:
          runtimeClassName: kata-remote
          containers:
            - name: infer
              image: triton
              resources: {limits: {cpu: "4", memory: 16Gi, nvidia.com/mig-1g.10gb: 1}}
    """
    code, out, err = plan(capsys, write(tmp_path, deployment), "--output", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["pod"] == {"name": "web", "namespace": "shop"}
    assert [m["profile"] for m in data["mig_layout"]] == ["1g.10gb"]
    assert data["containers"] == [
        {"name": "infer", "init": False, "cdi": [data["mig_layout"][0]["name"]]}
    ]


def test_not_a_peer_pod_is_left_untouched(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifest = write(tmp_path, POD.replace("runtimeClassName: kata-remote", "runtimeClassName: x"))
    code, out, err = plan(capsys, manifest, "--output", "json")
    assert code == 0 and not err
    data = json.loads(out)
    assert data["peer_pod"] is False and data["patch"] == [] and data["selection"] is None
    code, out, err = plan(capsys, manifest)
    assert code == 0 and "not a peer pod" in out


def test_machine_type_pin_needs_allowing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pinned = POD.replace(
        "metadata: {name: one, namespace: default}",
        "metadata:\n  name: one\n  annotations:\n"
        "    io.katacontainers.config.hypervisor.machine_type: g5.xlarge",
    )
    manifest = write(tmp_path, pinned)
    code, out, err = plan(capsys, manifest)
    one_line_error(code, out, err, "g5.xlarge", "not allowed")
    code, out, err = plan(
        capsys, manifest, "--allowed-machine-types", "g5.xlarge", "--output", "json"
    )
    assert code == 0, err
    assert json.loads(out)["selected"] == "g5.xlarge"


def test_efa_count_gives_that_many_rdma_devices(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = (EXAMPLES / "rdma-training-pod.yaml").read_text()
    efa = text.replace("rdma/ib: 1", "vpc.amazonaws.com/efa: 4")
    assert efa != text
    code, out, err = plan(capsys, write(tmp_path, efa), "--output", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["selection"]["candidates"][0]["rdma"] == "efa"
    trainer = {c["name"]: c["cdi"] for c in data["containers"]}["trainer"]
    assert [n for n in trainer if n.startswith("rdma.")] == [
        f"rdma.peerpods.io/hca={i}" for i in range(4)
    ]


def test_devices_the_vm_cannot_hold_stop_the_plan(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # g4dn.metal has one EFA interface; the pod asks for four
    pinned = POD.replace(
        "metadata: {name: one, namespace: default}",
        "metadata:\n  name: one\n  annotations:\n"
        "    io.katacontainers.config.hypervisor.machine_type: g4dn.metal",
    ).replace("nvidia.com/gpu: 1", "nvidia.com/gpu: 8, vpc.amazonaws.com/efa: 4")
    manifest = write(tmp_path, pinned)
    argv = (manifest, "--allowed-machine-types", "g4dn.metal")
    code, out, err = plan(capsys, *argv)
    one_line_error(code, out, err, "RDMA", "g4dn.metal")
    assert code == 1
    code, out, _ = plan(capsys, *argv, "--output", "json")
    data = json.loads(out)
    assert code == 1 and not data["ok"] and "RDMA" in data["failure"]["message"]


def test_cdi_name_templates_follow_the_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = plan(
        capsys,
        str(EXAMPLES / "mig-pod.yaml"),
        "--cdi-mig-name",
        "example.com/mig=gpu{gpu}-mig{mig}",
        "--output",
        "json",
    )
    assert code == 0, err
    data = json.loads(out)
    names = sorted(m["name"] for m in data["mig_layout"])
    assert names == ["example.com/mig=gpu0-mig0", "example.com/mig=gpu0-mig1",
                     "example.com/mig=gpu0-mig2"]  # fmt: skip
    naming, flagged = CdiNaming(), CdiNames()
    assert (naming.gpu, naming.mig, naming.rdma) == (
        flagged.cdi_gpu_name,
        flagged.cdi_mig_name,
        flagged.cdi_rdma_name,
    )


def test_library_entry_point() -> None:
    docs = load_documents((EXAMPLES / "dra-pod.yaml").read_text())
    report = plan_manifest(docs, "azure")
    assert report.ok and report.selection is not None
    assert report.catalog.cloud == "azure"
    assert {c.name: c.cdi for c in report.containers} == {
        "trainer": ("peerpods.io/gpu=gpu0",),
        "profiler": ("peerpods.io/gpu=gpu0",),
    }
    with pytest.raises(InvalidRequest, match="unknown provider"):
        plan_manifest(docs, "ibm")
    # a pod that fits no VM's devices stops at that step with the reason
    denied = plan_manifest(load_documents(POD.replace("gpu: 1", "gpu: 1000")), "aws")
    assert denied.failure is not None and denied.failure.stage == "admission"


def test_stdin_and_no_cloud_sdk_imported(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        from adaptor.cli.main import main
        code = main(["plan", "-", "--output", "json"])
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("boto3", "botocore", "azure")
                       or m.startswith("google.cloud"))
        print("HEAVY", heavy, file=sys.stderr)
        sys.exit(code)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        input=(EXAMPLES / "gpu-pod.yaml").read_text(),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    assert data["containers"][0] == {"name": "cuda", "init": False, "cdi": ["peerpods.io/gpu=gpu0"]}
