"""The checked-in generated code is what scripts/gen_protos.py makes from the .proto files."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "adaptor" / "ttrpc" / "gen"

# protoc stamps its own version into the output; a newer grpcio-tools must not fail the check
_VERSION_STAMP = re.compile(
    r"# Protobuf Python Version: .*\n|_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)\n"
)


def _normalise(text: str) -> str:
    return _VERSION_STAMP.sub("", text)


def test_generated_code_matches_protos(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    script = runpy.run_path(str(ROOT / "scripts" / "gen_protos.py"))
    script["generate"](tmp_path)
    fresh = sorted(p.name for p in tmp_path.iterdir())
    checked_in = sorted(p.name for p in GEN.iterdir() if p.is_file())
    assert fresh == checked_in
    for name in fresh:
        assert _normalise((tmp_path / name).read_text()) == _normalise((GEN / name).read_text()), (
            f"{name} is stale: run python scripts/gen_protos.py"
        )


def test_generated_modules_import_as_a_package() -> None:
    from adaptor.ttrpc.gen import agent_pb2, health_pb2, hypervisor_pb2, ttrpc_pb2

    assert ttrpc_pb2.Request.DESCRIPTOR.full_name == "ttrpc.Request"
    assert hypervisor_pb2.CreateVMRequest.DESCRIPTOR.full_name == "hypervisor.CreateVMRequest"
    assert health_pb2.CheckRequest.DESCRIPTOR.full_name == "grpc.CheckRequest"
    assert agent_pb2.CreateContainerRequest.DESCRIPTOR.full_name == "grpc.CreateContainerRequest"


def test_partial_agent_schema_keeps_unknown_fields() -> None:
    from adaptor.ttrpc.gen import agent_pb2

    # Process.Terminal (1) and Linux.Sysctl-like field 3 are not modelled; Device has id=1 data
    request = agent_pb2.CreateContainerRequest(container_id="c1")
    request.OCI.Annotations["io.kubernetes.cri.container-name"] = "main"
    request.OCI.Linux.Devices.add(Path="/dev/x", Type="c", Major=1, Minor=2)
    encoded = request.SerializeToString()
    unknown = b"\x22\x04\x0a\x02d1" + b"\x32\x06\x12\x02\x08\x01\x42\x00" + b"\xf8\x01\x07"
    blob = encoded + unknown
    decoded = agent_pb2.CreateContainerRequest.FromString(blob)
    decoded.OCI.Annotations["cdi.k8s.io/x"] = "nvidia.com/gpu=0"
    again = agent_pb2.CreateContainerRequest.FromString(decoded.SerializeToString())
    assert again.OCI.Annotations["cdi.k8s.io/x"] == "nvidia.com/gpu=0"
    assert again.OCI.Linux.Devices[0].Path == "/dev/x"
    # the unmodelled bits re-encode byte for byte
    reencoded = again.SerializeToString()
    assert b"\x0a\x02d1" in reencoded and b"\x08\x01" in reencoded and b"\xf8\x01\x07" in reencoded
