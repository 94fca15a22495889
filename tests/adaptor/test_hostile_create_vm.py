# ruff: noqa: E501
"""CreateVM as a tenant can shape it (pod annotations reach it, sandbox ids come from the shim):
every bad value is INVALID_ARGUMENT with its reason, never INTERNAL, and nothing is recorded."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.adaptor.daemon_proc import ANNOTATIONS, ServeProcess

pytestmark = pytest.mark.go

HV = "io.katacontainers.config.hypervisor."
SID = "7c" * 32
CASES = {
    "superscript gpus": {HV + "default_gpus": "²"},
    "non-ASCII vcpus": {HV + "default_vcpus": "٣"},
    "5000-digit memory": {HV + "default_memory": "9" * 5000},
    "superscript MIG count": {HV + "default_gpus": "0", HV + "default_gpu_model": "v1:mig=1g.10gb:²"},
    "superscript rdma": {HV + "default_gpu_model": "v1:rdma=²"},
    "5000-digit gpu memory": {HV + "default_gpu_model": "v1:mem=" + "9" * 5000},
}  # fmt: skip


@pytest.fixture
async def serve() -> AsyncIterator[ServeProcess]:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        proc = ServeProcess(
            Path(directory),
            ["--provider", "static", "--static-endpoints", "127.0.0.1:1", "--no-agent-tls"],
        )
        await proc.start()
        try:
            yield proc
        finally:
            await proc.kill()


async def test_bad_annotations_are_invalid_argument(serve: ServeProcess) -> None:
    for case, changes in CASES.items():
        answer = await serve.create_vm(SID, {**ANNOTATIONS, **changes})
        assert answer["code"] == 3, (case, answer, serve.log())
        key = next(iter(changes)) if len(changes) == 1 else HV + "default_gpu_model"
        assert key in answer["message"], (case, answer["message"])
    assert serve.rows("SELECT id FROM sandboxes") == []


async def test_ids_are_matched_in_full(serve: ServeProcess) -> None:
    for bad in (SID + "\n", "\n" + SID, SID + "/..", "", "a" * 129):
        answer = await serve.create_vm(bad)
        assert answer["code"] == 3, (repr(bad), answer)
    assert serve.rows("SELECT id FROM sandboxes") == []
    assert (await serve.create_vm(SID))["code"] == 0
