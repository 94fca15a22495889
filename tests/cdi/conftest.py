"""The Go reference CDI implementation as a long-lived subprocess (built once per session)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ORACLE_SRC = Path(__file__).resolve().parents[1] / "go" / "cdi_oracle" / "main.go"
GOPATH = "/usr/share/gocode"
CDI_LIB = Path(GOPATH, "src/github.com/container-orchestrated-devices/container-device-interface")


class Oracle:
    """Send one request, read one JSON line back."""

    def __init__(self, binary: str) -> None:
        self.proc = subprocess.Popen(
            [binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    def __call__(self, specs: dict[str, str], oci: dict[str, Any], devices: list[str]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        line = json.dumps({"specs": specs, "oci": oci, "devices": devices})
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        assert reply, "oracle exited"
        return json.loads(reply)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Oracle]:
    if shutil.which("go") is None or not CDI_LIB.is_dir():
        pytest.skip("needs golang-go and the Debian CDI library (tests/run installs them)")
    out = tmp_path_factory.mktemp("go") / "cdi_oracle"
    env = dict(os.environ, GO111MODULE="off", GOPATH=GOPATH, GOFLAGS="")
    env.setdefault("GOCACHE", str(Path.home() / ".cache" / "go-build"))
    subprocess.run(
        ["go", "build", "-o", str(out), str(ORACLE_SRC)], check=True, env=env, timeout=300
    )
    oracle = Oracle(str(out))
    yield oracle
    oracle.close()
