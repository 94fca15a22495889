"""Fixtures the daemon tests share: a short scratch directory and a Go pod VM forwarder."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.go.peers import GoServer, echo_server


@pytest.fixture
def root() -> Iterator[Path]:
    # Short paths: a unix socket path must fit in 108 bytes.
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        yield Path(directory)


@pytest.fixture
async def pod_vm() -> AsyncIterator[GoServer]:
    async with echo_server() as server:
        yield server
