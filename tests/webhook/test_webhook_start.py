"""`peerpods webhook` at start: it says where it serves, every line it (and uvicorn) writes is in
the chosen log format, and TLS files that do not make a pair are named for what they are, not
OpenSSL's "[SSL] PEM lib"."""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trustme

from providers.core.errors import PeerpodsError
from webhook import TlsFiles

ROOT = Path(__file__).resolve().parents[2]


def _pair(ca: trustme.CA, directory: Path, name: str) -> tuple[Path, Path]:
    issued = ca.issue_cert("peerpods-webhook.peerpods-system.svc")
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    return cert, key


def test_tls_mix_ups_are_named(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key = _pair(ca, tmp_path, "a")
    other_cert, other_key = _pair(ca, tmp_path, "b")
    with pytest.raises(PeerpodsError, match="holds a certificate, not a private key"):
        TlsFiles(cert, cert)
    with pytest.raises(PeerpodsError, match="holds no PEM certificate"):
        TlsFiles(key, key)
    with pytest.raises(PeerpodsError, match="do not go together"):
        TlsFiles(cert, other_key)
    assert TlsFiles(other_cert, other_key).context is not None


def test_the_webhook_says_where_it_serves_in_json_only(tmp_path: Path) -> None:
    cert, key = _pair(trustme.CA(), tmp_path, "w")
    seal = tmp_path / "seal"
    seal.mkdir()
    (seal / "current").write_text("k" * 40)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERPODS_")}
    env["PYTHONPATH"] = str(ROOT)
    process = subprocess.Popen(
        [sys.executable, "-m", "adaptor.cli.main", "--log-format", "json", "webhook",
         "--host", "127.0.0.1", "--port", str(port), "--tls-cert-file", str(cert),
         "--tls-key-file", str(key), "--seal-key-dir", str(seal), "--cel-workers", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
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
        # a request uvicorn itself complains about: its warning must be JSON too
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        with socket.create_connection(("127.0.0.1", port)) as raw, context.wrap_socket(raw) as tls:
            tls.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            tls.recv(1024)
        time.sleep(0.5)
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    lines += err.splitlines()
    records = [json.loads(line) for line in lines if line.strip()]  # every line is JSON
    serving = next(r for r in records if "webhook serving" in r["message"])
    assert f"https://127.0.0.1:{port}" in serving["message"]
    assert any("Invalid HTTP request" in r["message"] for r in records), records
