"""Debian's real containerd on a private root, state and socket (nothing of the host's own
containerd is touched), and its CRI plugin's configuration as the CRI API reports it (the
verbose Status reply a kubelet or `crictl info` reads)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

CRI_STATUS = "/runtime.v1.RuntimeService/Status"


def available() -> bool:
    return shutil.which("containerd") is not None and shutil.which("ctr") is not None


def unpacked_dir() -> Path:
    """Where tests/debian-containerd unpacks Debian's containerd 1.7 and 2.x."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return Path(os.environ.get("PEERPODS_CONTAINERD_DIR", default / "peerpods-tests/containerd"))


def binaries() -> dict[str, Path]:
    """containerd binaries by series ("1.6": the node's own, bookworm's; "1.7", "2": unpacked)."""
    found: dict[str, Path] = {}
    own = shutil.which("containerd")
    if own:
        version = subprocess.run([own, "--version"], capture_output=True, text=True).stdout
        match = re.search(r" v?(\d+)\.(\d+)\.\d+", version)
        if match:
            major, minor = match.groups()
            found[major if major != "1" else f"1.{minor}"] = Path(own)
    for series in ("1.7", "2"):
        binary = unpacked_dir() / series / "usr/bin/containerd"
        if binary.is_file():
            found.setdefault(series, binary)
    return found


def dump(binary: Path, config: Path) -> dict[str, Any]:
    """`containerd --config F config dump`: the configuration containerd would run with."""
    done = subprocess.run(
        [str(binary), "--config", str(config), "config", "dump"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return tomllib.loads(done.stdout)


def default_config(base: Path, binary: Path | str = "containerd") -> str:
    """`containerd config default`, moved under `base` (root, state, sockets) and on the native
    snapshotter, which works on any filesystem."""
    text = subprocess.run(
        [str(binary), "config", "default"], capture_output=True, text=True, check=True
    ).stdout
    return private(text, base)


def private(text: str, base: Path) -> str:
    """Either version's file (version 3 quotes with '), moved under `base`."""
    text = re.sub(r"""(?m)^root = ["'].*["']$""", f'root = "{base}/root"', text)
    text = re.sub(r"""(?m)^state = ["'].*["']$""", f'state = "{base}/state"', text)
    text = re.sub(r"""["']/run/containerd/containerd.sock["']""", f'"{base}/c.sock"', text)
    return re.sub(r"""snapshotter = ["']overlayfs["']""", 'snapshotter = "native"', text)


def _fields(data: bytes) -> Iterator[tuple[int, bytes | int]]:
    """Protobuf wire fields (varints and length-delimited ones: all a Status reply holds)."""

    def varint(at: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value, at

    at = 0
    while at < len(data):
        tag, at = varint(at)
        if tag & 7 == 0:
            value, at = varint(at)
            yield tag >> 3, value
        elif tag & 7 == 2:
            size, at = varint(at)
            yield tag >> 3, data[at : at + size]
            at += size
        else:
            raise AssertionError(f"wire type {tag & 7} not expected in a Status reply")


class Containerd:
    def __init__(self, config: Path, base: Path, binary: str = "containerd") -> None:
        self.binary = shutil.which(binary) or binary
        self.config = config
        self.base = base
        self.socket = base / "c.sock"
        self.log = base / "containerd.log"

    def plugins(self) -> str:
        return subprocess.run(
            ["ctr", "--address", str(self.socket), "plugins", "ls"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout  # fmt: skip

    def cri_config(self) -> dict[str, Any]:
        """The CRI plugin's configuration from its Status(verbose) reply."""
        deadline = time.monotonic() + 20
        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            status = channel.unary_unary(CRI_STATUS)
            while True:
                try:
                    reply = status(b"\x08\x01", timeout=10)  # StatusRequest{verbose: true}
                    break
                except grpc.RpcError:
                    # the socket is there a moment before every service answers on it
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        info = {}
        for number, value in _fields(reply):
            if number == 2 and isinstance(value, bytes):  # map<string, string> info
                entry = dict(_fields(value))
                info[bytes(entry[1]).decode()] = bytes(entry[2]).decode()  # type: ignore[arg-type]
        config: dict[str, Any] = json.loads(info["config"])
        return config


@contextmanager
def running(config: Path, base: Path) -> Iterator[Containerd]:
    """containerd with `config`, until the block ends; its log is kept for failures."""
    daemon = Containerd(config, base)
    with daemon.log.open("wb") as log:
        process = subprocess.Popen(
            ["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 30
            while not daemon.socket.exists():
                assert process.poll() is None, daemon.log.read_text()
                assert time.monotonic() < deadline, daemon.log.read_text()
                time.sleep(0.05)
            yield daemon
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
