"""`peerpods serve` refuses to start, with one line and exit 2, when its cloud provider could not
create a single VM as configured (no pod VM image, no region, no project); and the shipped
ConfigMap, used as it is, gets that refusal instead of a daemon that fails every pod later."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config" / "deploy" / "adaptor" / "config.yaml"
AMI = "ami-0a1b2c3d4e5f60718"


def serve(root: Path, args: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PEERPODS_", "AWS_"))}
    clean.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_EC2_METADATA_DISABLED": "true",
            # no instance metadata service is asked for the network (tests reach no cloud)
            "PEERPODS_INSTANCE_METADATA": "false",
            "AWS_CONFIG_FILE": str(root / "none"),
            # no Application Default Credentials, and no metadata server to ask for them
            "GOOGLE_APPLICATION_CREDENTIALS": "",
            "CLOUDSDK_CONFIG": str(root / "none"),
            "NO_GCE_CHECK": "true",
            "PYTHONPATH": str(ROOT),
        }
    )
    clean.update(env or {})
    dirs = [
        f"--socket={root}/hypervisor.sock",
        f"--pods-dir={root}/pods",
        f"--state-dir={root}/state",
        "--status-address=",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "adaptor.cli.main", "serve", *dirs, *args],
        cwd=root,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--provider", "aws", "--aws-region", "us-east-1"],
            "aws provider: no pod VM image (set --aws-image-id or --pod-vm-image",
        ),
        (["--provider", "aws", "--pod-vm-image", AMI], "aws provider: no --aws-region"),
        (
            ["--provider", "gcp", "--gcp-project", "p", "--gcp-zones", "us-central1-a"],
            "gcp provider: no pod VM image (set --gcp-image or --pod-vm-image",
        ),
        (["--provider", "gcp", "--pod-vm-image", "img"], "--gcp-project and --gcp-zones"),
        (
            ["--provider", "gcp", "--gcp-project", "p", "--gcp-zones", "z", "--pod-vm-image", "i"],
            "gcp provider: no credentials",
        ),
        (
            ["--provider", "azure", "--azure-region", "eastus"],
            "azure provider: no pod VM image (set --azure-image-id or --pod-vm-image",
        ),
        (["--provider", "azure", "--pod-vm-image", "img"], "no --azure-subscription-id"),
    ],
    ids=[
        "aws-image",
        "aws-region",
        "gcp-image",
        "gcp-project",
        "gcp-credentials",
        "azure-image",
        "azure-settings",
    ],
)
def test_serve_refuses_a_provider_that_cannot_create_a_vm(
    root: Path, args: list[str], expected: str
) -> None:
    pytest.importorskip("boto3")
    code, stderr = serve(root, args)
    assert code == 2, stderr
    assert stderr.count("\n") == 1, stderr
    assert stderr.startswith("peerpods serve: ") and expected in stderr, stderr
    # nothing was written: no socket, no state directory
    assert sorted(p.name for p in root.iterdir()) == []


def test_the_shipped_config_map_is_refused_until_an_image_is_set(root: Path) -> None:
    pytest.importorskip("boto3")
    data = yaml.safe_load(CONFIG.read_text().split("\n---\n")[0])["data"]
    env = {k: str(v) for k, v in data.items() if k.startswith("PEERPODS_")}
    assert env["PEERPODS_POD_VM_IMAGE"] == "", "the shipped config names no image of ours"
    # The shipped config leaves the region to the node: AWS_DEFAULT_REGION stands in for it here.
    code, stderr = serve(root, [], {**env, "AWS_DEFAULT_REGION": "us-east-1"})
    assert code == 2, stderr
    assert "no pod VM image" in stderr and stderr.count("\n") == 1, stderr
    # and the ConfigMap says so in the comment above the key an operator edits
    lines = CONFIG.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "PEERPODS_POD_VM_IMAGE:" in line)
    above = []
    while lines[at - 1 - len(above)].strip().startswith("#"):
        above.append(lines[at - 1 - len(above)])
    assert any("REQUIRED" in line for line in above), lines[at - 3 : at]
