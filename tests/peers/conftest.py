"""The real-peers suite: tests against prebuilt binaries of Kata's Go shim, containerd 2.x and
Kubernetes (kube-apiserver, kube-scheduler, kubelet, kubectl, etcd).

The binaries are never part of this repository. `PEERPODS_PEERS_DIR` names a folder that holds
them (each under its upstream name); a test whose binary is missing there is skipped. The default
test command does not collect this folder (tests/conftest.py); run it with
`PEERPODS_PEERS_DIR=/path/to/bin python -m pytest tests/peers`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.peers.kube import KubeCluster


def peers_dir() -> Path | None:
    value = os.environ.get("PEERPODS_PEERS_DIR", "")
    return Path(value) if value else None


def peer_binary(name: str) -> Path:
    """The prebuilt binary `name` from PEERPODS_PEERS_DIR (or PATH for etcd); skips when absent."""
    folder = peers_dir()
    if folder is not None and (folder / name).is_file():
        return folder / name
    found = shutil.which(name)
    if name == "etcd" and found:
        return Path(found)
    pytest.skip(f"{name} not found in PEERPODS_PEERS_DIR ({folder})")


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    """One etcd + kube-apiserver + kube-scheduler for the whole session (skips without them)."""
    for name in ("etcd", "kube-apiserver", "kube-scheduler", "kubectl"):
        peer_binary(name)
    from tests.peers.kube import KubeCluster

    with KubeCluster(scheduler=True) as cluster:
        yield cluster
