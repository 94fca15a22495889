"""`peerpods plan --dra-driver POD.yaml`: the devices the allocator gives the pod's claims (its
own, and the extended-resource claim of nvidia.com/gpu) from the published pools, and the VM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from adaptor.cli.main import main
from providers.core.snapshots import CatalogLoader
from providers.dra import build_pool

MANIFESTS = Path(__file__).parent / "manifests"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in __import__("os").environ if k.startswith("PEERPODS_")]:
        monkeypatch.delenv(key)


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main(["plan", "--dra-driver", "--output", "json", *argv])
    return code, json.loads(capsys.readouterr().out)


def gpu_pod(count: int, cpu: str = "2") -> dict[str, Any]:
    limits = {"cpu": cpu, "memory": "8Gi", "nvidia.com/gpu": str(count)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "runtimeClassName": "kata-remote",
            "containers": [{"name": "c", "image": "i", "resources": {"limits": limits}}],
        },
    }


def test_an_h100_claim_of_40gi_or_more_names_the_model_and_its_vm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, report = plan(capsys, str(MANIFESTS / "h100-40gi.yaml"))
    assert code == 0
    [device] = report["allocated"]
    assert device["model"] == "h100-80gb" and device["memory_mib"] >= 40 * 1024
    assert device["device"] == "nvidia-h100-80gb-hbm3-0"
    assert report["selected"] == "p5.4xlarge" and report["gpu_models"] == ["h100-80gb"]
    assert (report["vcpus"], report["memory_mib"]) == (4, 16384)


def test_nvidia_gpu_is_the_schedulers_extended_resource_claim(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(gpu_pod(2)))
    code, report = plan(capsys, str(manifest))
    assert code == 0
    assert [a["request"] for a in report["allocated"]] == ["container-0-request-0"] * 2
    assert {a["model"] for a in report["allocated"]} == {"t4"}  # the cheapest GPU first
    assert report["gpus"] == 2 and report["selected"].startswith("g4dn.")


def test_the_manifests_own_slices_win_over_the_catalogs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    catalog = CatalogLoader(None).load("aws", "us-east-1")
    only_l40s = build_pool(catalog, {m: 0 for m in ("t4", "l4", "a10g")}).slices(1)
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump_all([*only_l40s, gpu_pod(1)]))
    code, report = plan(capsys, str(manifest))
    assert code == 0 and report["allocated"][0]["model"] == "l40s"


def test_a_pod_the_pools_cannot_serve_exits_1_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        ["plan", "--dra-driver", "--dra-gpu-limit", "h100=0", str(MANIFESTS / "h100-40gi.yaml")]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert "no published device fits request 'gpu'" in captured.err
