"""The kubelet plugin: registration and v1.DRAPlugin over real gRPC on unix sockets, prepare
(claim read from the API, UID and driver checked, per-claim CDI spec, checkpoint) idempotent
and surviving a restart, unprepare of an unknown claim a success."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from adaptor.cdi import load_spec
from adaptor.dra import Checkpoint, ClaimError, ClaimRef, DeviceState, devices_in_env
from adaptor.dra.server import PluginServer
from adaptor.ttrpc.gen import dra_pb2, pluginregistration_pb2
from providers.core.snapshots import CatalogLoader
from providers.dra import build_pool
from providers.dra.publisher import publish
from tests.dra.fake_kube import FakeKube

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def allocated_claim(
    name: str = "gpu", uid: str = "c-1", driver: str = "gpu.peerpods.io", pod: str = "pod-1"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": driver, "pool": "aws-us-east-1",
                         "device": "nvidia-h100-80gb-hbm3-0"},
                        {"request": "gpu", "driver": driver, "pool": "aws-us-east-1",
                         "device": "nvidia-h100-80gb-hbm3-1"},
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": pod}],
        },
    }  # fmt: skip


def state(kube: FakeKube, root: Path) -> DeviceState:
    return DeviceState(
        kube.client.get, Checkpoint(root / "plugin" / "checkpoint.json"), root / "cdi"
    )


@pytest.fixture
def published(kube: FakeKube) -> FakeKube:
    publish(kube.client, build_pool(CatalogLoader(None).load("aws", "us-east-1"), {"h100-80gb": 2}))
    kube.store.put(CLAIMS, allocated_claim())
    return kube


def test_prepare_writes_a_cdi_spec_of_environment_edits_and_records_the_claim(
    published: FakeKube, tmp_path: Path
) -> None:
    prepared = state(published, tmp_path).prepare(ClaimRef("ml", "gpu", "c-1"))
    assert prepared.cdi_ids == (
        "k8s.gpu.peerpods.io/claim=c-1-0",
        "k8s.gpu.peerpods.io/claim=c-1-1",
    )
    assert prepared.pod_uids == ("pod-1",)
    assert [d.model for d in prepared.devices] == ["h100-80gb", "h100-80gb"]
    [spec_file] = (tmp_path / "cdi").iterdir()
    spec = load_spec(str(spec_file))
    env = [e for d in spec.devices for e in d.edits.env]
    assert all(not d.edits.device_nodes and not d.edits.mounts for d in spec.devices)
    assert devices_in_env(env) == [
        ("aws-us-east-1", "nvidia-h100-80gb-hbm3-0"),
        ("aws-us-east-1", "nvidia-h100-80gb-hbm3-1"),
    ]
    assert Checkpoint(tmp_path / "plugin" / "checkpoint.json").for_pod("pod-1")[0].uid == "c-1"


def test_prepare_twice_and_after_a_restart_answers_the_same(
    published: FakeKube, tmp_path: Path
) -> None:
    first = state(published, tmp_path).prepare(ClaimRef("ml", "gpu", "c-1"))
    published.store.objects[CLAIMS].clear()  # the answer now comes from the checkpoint alone
    again = state(published, tmp_path).prepare(ClaimRef("ml", "gpu", "c-1"))
    assert again == first


def test_unprepare_after_a_restart_and_of_an_unknown_claim(
    published: FakeKube, tmp_path: Path
) -> None:
    state(published, tmp_path).prepare(ClaimRef("ml", "gpu", "c-1"))
    restarted = state(published, tmp_path)
    restarted.unprepare(ClaimRef("ml", "gpu", "c-1"))
    assert list((tmp_path / "cdi").iterdir()) == []
    assert restarted.checkpoint.get("c-1") is None
    restarted.unprepare(ClaimRef("ml", "never", "c-404"))  # succeeds


@pytest.mark.parametrize(
    ("claim", "ref", "reason"),
    [
        (allocated_claim(uid="c-2"), ClaimRef("ml", "gpu", "c-1"), "has UID c-2"),
        (allocated_claim(driver="gpu.nvidia.com"), ClaimRef("ml", "gpu", "c-1"), "no devices of"),
        (None, ClaimRef("ml", "gpu", "c-1"), "reading claim"),
    ],
)
def test_a_claim_that_is_not_ours_is_an_error_and_nothing_is_written(
    kube: FakeKube, tmp_path: Path, claim: dict[str, Any] | None, ref: ClaimRef, reason: str
) -> None:
    publish(kube.client, build_pool(CatalogLoader(None).load("aws", "us-east-1"), {"h100-80gb": 2}))
    if claim is not None:
        kube.store.put(CLAIMS, claim)
    with pytest.raises(ClaimError, match=reason):
        state(kube, tmp_path).prepare(ref)
    assert not (tmp_path / "cdi").exists() or list((tmp_path / "cdi").iterdir()) == []
    assert not (tmp_path / "plugin" / "checkpoint.json").exists()


def test_the_kubelet_sees_registration_and_calls_prepare_over_grpc(
    published: FakeKube, short_dir: Path
) -> None:
    async def main() -> None:
        server = PluginServer(state(published, short_dir), short_dir / "registry", short_dir / "p")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"unix://{server.registration_socket}") as ch:
                info = await ch.unary_unary(
                    "/pluginregistration.Registration/GetInfo",
                    request_serializer=pluginregistration_pb2.InfoRequest.SerializeToString,
                    response_deserializer=pluginregistration_pb2.PluginInfo.FromString,
                )(pluginregistration_pb2.InfoRequest())
                assert (info.type, info.name) == ("DRAPlugin", "gpu.peerpods.io")
                assert list(info.supported_versions) == ["v1.DRAPlugin"]
                assert info.endpoint == str(short_dir / "p" / "dra.sock")
                await ch.unary_unary(
                    "/pluginregistration.Registration/NotifyRegistrationStatus",
                    request_serializer=pluginregistration_pb2.RegistrationStatus.SerializeToString,
                    response_deserializer=pluginregistration_pb2.RegistrationStatusResponse.FromString,
                )(pluginregistration_pb2.RegistrationStatus(plugin_registered=True))
                assert server.registered.is_set()
            async with grpc.aio.insecure_channel(f"unix://{info.endpoint}") as ch:
                for service in ("k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", "v1.DRAPlugin"):
                    answer = await ch.unary_unary(
                        f"/{service}/NodePrepareResources",
                        request_serializer=dra_pb2.NodePrepareResourcesRequest.SerializeToString,
                        response_deserializer=dra_pb2.NodePrepareResourcesResponse.FromString,
                    )(
                        dra_pb2.NodePrepareResourcesRequest(
                            claims=[
                                dra_pb2.Claim(namespace="ml", name="gpu", uid="c-1"),
                                dra_pb2.Claim(namespace="ml", name="gone", uid="c-9"),
                            ]
                        )
                    )
                    ours = answer.claims["c-1"]
                    assert ours.error == ""
                    assert [d.cdi_device_ids[0] for d in ours.devices] == [
                        "k8s.gpu.peerpods.io/claim=c-1-0",
                        "k8s.gpu.peerpods.io/claim=c-1-1",
                    ]
                    assert [d.request_names[0] for d in ours.devices] == ["gpu", "gpu"]
                    assert ours.devices[0].pool_name == "aws-us-east-1"
                    assert "reading claim" in answer.claims["c-9"].error
                gone = await ch.unary_unary(
                    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
                    request_serializer=dra_pb2.NodeUnprepareResourcesRequest.SerializeToString,
                    response_deserializer=dra_pb2.NodeUnprepareResourcesResponse.FromString,
                )(dra_pb2.NodeUnprepareResourcesRequest(claims=[dra_pb2.Claim(uid="c-1")]))
                assert gone.claims["c-1"].error == ""
        finally:
            await server.stop()
        assert not server.registration_socket.exists()

    asyncio.run(main())
    record = json.loads((short_dir / "plugin" / "checkpoint.json").read_text())
    assert record["claims"] == []  # unprepared


def test_a_subrequests_device_names_its_main_request_too() -> None:
    from adaptor.dra.server import _request_names

    assert _request_names("gpu") == ["gpu"]
    assert _request_names("gpu/h100") == ["gpu/h100", "gpu"]
    assert _request_names("") == []


def test_the_checkpoint_is_private_and_a_foreign_file_is_refused(tmp_path: Path) -> None:
    import os

    from adaptor.dra import CheckpointError, PreparedClaim

    checkpoint = Checkpoint(tmp_path / "plugin" / "checkpoint.json")
    checkpoint.put(PreparedClaim("u", "ns", "c", ("pod-uid",), (), (), ("pod",)))
    assert os.stat(checkpoint.path).st_mode & 0o777 == 0o600
    assert os.stat(checkpoint.path.parent).st_mode & 0o777 == 0o700
    assert [c.uid for c in checkpoint.for_pod_name("ns", "pod")] == ["u"]
    assert checkpoint.for_pod_name("other", "pod") == []
    checkpoint.path.write_text('{"version": 99}')
    with pytest.raises(CheckpointError):
        checkpoint.get("u")
