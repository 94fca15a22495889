# ruff: noqa: E501
"""CreateVM as a tenant can shape it (pod annotations reach it, sandbox ids come from the shim):
every bad value is INVALID_ARGUMENT with its reason, never INTERNAL, and nothing is recorded."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adaptor.ttrpc.gen import hypervisor_pb2 as pb
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


async def test_bad_netns_paths_are_invalid_argument(serve: ServeProcess) -> None:
    """A NUL in the path, or a path outside the CRI's netns directories, is the caller's."""
    for path in ("/run/netns/a\0b", "/proc/self/ns/net", "/run/netns/../../proc/self/ns/net"):
        request = pb.CreateVMRequest(id=SID, annotations=ANNOTATIONS, networkNamespacePath=path)
        answer = await serve.call("CreateVM", request)
        assert answer["code"] == 3, (repr(path), answer, serve.log())
        assert "network namespace" in answer["message"], answer
    assert serve.rows("SELECT id FROM sandboxes") == []


async def test_vm_choices_need_the_nodes_allowlists(serve: ServeProcess) -> None:
    """A pod that reaches CreateVM with a pinned type or its own image (the webhook bypassed, or
    the annotations changed after admission) is refused unless this node allows the choice."""
    pinned = {**ANNOTATIONS, HV + "machine_type": "p5.48xlarge"}
    answer = await serve.create_vm(SID, pinned)
    assert answer["code"] == 3 and HV + "machine_type" in answer["message"]
    assert "--allowed-machine-types: none" in answer["message"]
    imaged = {**ANNOTATIONS, HV + "image": "ami-tenant"}
    answer = await serve.create_vm(SID, imaged)
    assert answer["code"] == 3 and "--allowed-images: none" in answer["message"]
    assert serve.rows("SELECT id FROM sandboxes") == []


async def test_allowed_vm_choices_pass() -> None:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        proc = ServeProcess(
            Path(directory),
            ["--provider", "static", "--static-endpoints", "127.0.0.1:1", "--no-agent-tls",
             "--allowed-machine-types", "p5.48xlarge", "--allowed-images", "ami-approved"],
        )  # fmt: skip
        await proc.start()
        try:
            chosen = {
                **ANNOTATIONS,
                HV + "machine_type": "p5.48xlarge",
                HV + "image": "ami-approved",
            }
            assert (await proc.create_vm(SID, chosen))["code"] == 0, proc.log()
            other = {**ANNOTATIONS, HV + "image": "ami-tenant"}
            assert (await proc.create_vm("8d" * 32, other))["code"] == 3
        finally:
            await proc.kill()
