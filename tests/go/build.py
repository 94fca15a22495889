"""Build the Go reference peers in tests/go/<name>/ once per test session.

The programs use Debian's Go toolchain and containerd/ttrpc 1.1.1 in GOPATH mode. Outside CI a
machine without Go skips the tests that need them; under CI=true a missing toolchain fails.
Binaries go to a temporary directory (never into the tree) unless PEERPODS_GO_BIN names a
directory of prebuilt ones.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

GO_DIR = Path(__file__).resolve().parent
GOPATH = "/usr/share/gocode"
_REQUIRED = Path(GOPATH, "src/github.com/containerd/ttrpc")

_lock = threading.Lock()
_built: dict[str, Path] = {}
_out_dir: Path | None = None


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Go reference peers unavailable under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _output_dir() -> Path:
    global _out_dir
    if _out_dir is None:
        _out_dir = Path(tempfile.mkdtemp(prefix="peerpods-go-"))
        atexit.register(shutil.rmtree, _out_dir, True)
    return _out_dir


def go_binary(name: str) -> Path:
    """Path of the built program tests/go/<name>/ (built on first use this session)."""
    with _lock:
        if name in _built:
            return _built[name]
        prebuilt = os.environ.get("PEERPODS_GO_BIN")
        if prebuilt and Path(prebuilt, name).is_file():
            _built[name] = Path(prebuilt, name)
            return _built[name]
        source = GO_DIR / name
        if not (source / "main.go").is_file():
            raise FileNotFoundError(f"no Go program {source}/main.go")
        go = shutil.which("go")
        if go is None:
            _missing("the go toolchain is not installed (apt-get install golang-go)")
        if not _REQUIRED.is_dir():
            _missing(f"{_REQUIRED} missing (apt-get install golang-github-containerd-ttrpc-dev)")
        out = _output_dir() / name
        env = dict(os.environ, GO111MODULE="off", GOPATH=GOPATH, CGO_ENABLED="0", GOFLAGS="")
        if "HOME" not in env and "GOCACHE" not in env:
            env["GOCACHE"] = str(_output_dir() / "gocache")
        result = subprocess.run(
            [str(go), "build", "-o", str(out), "."],
            cwd=source,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if result.returncode != 0:
            pytest.fail(f"go build {name} failed:\n{result.stderr}", pytrace=False)
        _built[name] = out
        return out
