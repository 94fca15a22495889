"""`peerpods webhook` in a region with no catalog yet (Azure outside the US before the refresh
job's first run): it serves, alive (/healthz) and not ready (/readyz, naming the missing file),
instead of exiting and crash-looping; it turns ready by itself once the catalog file appears.
The region comes from the adaptors' own setting for the provider (PEERPODS_AZURE_REGION), as
the Deployment passes it."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import trustme

from adaptor.cli.region import catalog_region
from providers.core.snapshots import load_snapshot

ROOT = Path(__file__).resolve().parents[2]


def test_catalog_region_follows_the_providers_own_setting() -> None:
    env = {
        "PEERPODS_AWS_REGION": "eu-west-1",
        "PEERPODS_AZURE_REGION": "westeurope",
        "PEERPODS_GCP_ZONES": "europe-west4-b,europe-west4-c",
    }
    assert catalog_region("aws", "", env) == "eu-west-1"
    assert catalog_region("azure", "", env) == "westeurope"
    assert catalog_region("gcp", "", env) == "europe-west4"
    assert catalog_region("azure", " northeurope ", env) == "northeurope"  # --region wins
    assert catalog_region("azure", "", {}) == ""  # the cloud's default then


def _start(tmp_path: Path, catalogs: Path) -> tuple[subprocess.Popen[str], int]:
    issued = trustme.CA().issue_cert("peerpods-webhook.peerpods-system.svc")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    seal = tmp_path / "seal"
    seal.mkdir()
    (seal / "current").write_text("k" * 40)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERPODS_")}
    env.update(
        PYTHONPATH=str(ROOT),
        PEERPODS_PROVIDER="azure",
        PEERPODS_AZURE_REGION="westeurope",
        PEERPODS_CATALOG_DIR=str(catalogs),
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "adaptor.cli.main", "--log-format", "text", "webhook",
         "--host", "127.0.0.1", "--port", str(port), "--tls-cert-file", str(cert),
         "--tls-key-file", str(key), "--seal-key-dir", str(seal), "--cel-workers", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    return process, port


def test_a_region_without_a_catalog_starts_not_ready_and_turns_ready(tmp_path: Path) -> None:
    catalogs = tmp_path / "catalogs"
    catalogs.mkdir()
    process, port = _start(tmp_path, catalogs)
    lines: list[str] = []
    try:
        assert process.stderr is not None
        watch = selectors.DefaultSelector()
        watch.register(process.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + 60
        while not any("webhook serving" in line for line in lines):
            assert time.monotonic() < deadline, lines
            assert process.poll() is None, [*lines, process.stderr.read()]
            if watch.select(timeout=0.5):
                lines.append(process.stderr.readline())
        assert any("not ready until its catalog loads" in line for line in lines), lines
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=False) as client:
            assert client.get("/healthz").status_code == 200
            waiting = client.get("/readyz")
            assert waiting.status_code == 503
            assert "no catalog snapshot for azure westeurope" in waiting.json()["reason"]
            # the refresh job writes the region's catalog: ready without a restart
            eastus = load_snapshot("azure", "eastus")
            written = eastus.model_copy(update={"region": "westeurope"})
            (catalogs / "azure-westeurope.json").write_text(written.model_dump_json())
            deadline = time.monotonic() + 30
            while (ready := client.get("/readyz")).status_code != 200:
                assert time.monotonic() < deadline, ready.text
                time.sleep(0.2)
            assert ready.json() == {"status": "ready"}
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
