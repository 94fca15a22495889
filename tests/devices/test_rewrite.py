"""The CreateContainer rewrite: devices per container, foreign CDI annotations removed, every
other field (declared or not) kept; refusals are INVALID_ARGUMENT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptor.cdi import Registry
from adaptor.devices import CdiNaming, DevicePlan, RewriteError, make_hook, plan_devices
from adaptor.devices.rewrite import rewrite_create_container
from adaptor.ttrpc import Code, TtrpcError
from adaptor.ttrpc.gen import agent_pb2
from providers.core.contract import ContainerPlan, DeviceUnit, GpuIntent
from tests.devices.requests import create_container, raw_field, user_field

PLAN = ContainerPlan(
    units=(
        DeviceUnit(id="g", kind="gpu", count=2),
        DeviceUnit(id="m", kind="mig", profile="1g.10gb"),
    ),
    containers={"train": ("g",), "infer": ("m",), "sidecar": ()},
)
STORED = plan_devices(None, GpuIntent(gpus=2, mig={"1g.10gb": 1}), (4, "a100-80gb"))
# the same plan for a pod VM image whose only CDI spec is nvidia-ctk's (names as it writes them)
CTK_NAMES = CdiNaming(gpu="nvidia.com/gpu={index}", mig="nvidia.com/gpu={gpu}:{mig}")
STORED_CTK = plan_devices(None, GpuIntent(gpus=2, mig={"1g.10gb": 1}), (4, "a100-80gb"), CTK_NAMES)


def annotations_after(payload: bytes) -> dict[str, str]:
    req = agent_pb2.CreateContainerRequest()
    req.ParseFromString(payload)
    return dict(req.OCI.Annotations)


def test_each_container_gets_its_devices_and_user_cdi_annotations_go() -> None:
    user = {"cdi.k8s.io/x": "nvidia.com/gpu=all", "cdi.k8s.io/peerpods_train": "evil.com/x=y"}
    for name, want in (
        ("train", "peerpods.io/gpu=gpu0,peerpods.io/gpu=gpu1"),
        ("infer", "peerpods.io/gpu=gpu2-mig0"),
        ("sidecar", None),
    ):
        req = create_container(name, plan_json=PLAN.encode(), extra_annotations=user)
        out = annotations_after(rewrite_create_container(req.SerializeToString(), STORED))
        cdi = {k: v for k, v in out.items() if k.startswith("cdi.k8s.io/")}
        assert cdi == ({f"cdi.k8s.io/peerpods_{name}": want} if want else {})
        assert out["io.katacontainers.peerpods.devices"] == PLAN.encode()


def test_without_a_container_plan_every_app_container_gets_the_inventory() -> None:
    for name in ("a", "b"):
        req = create_container(name)
        out = annotations_after(rewrite_create_container(req.SerializeToString(), STORED))
        assert out[f"cdi.k8s.io/peerpods_{name}"] == (
            "peerpods.io/gpu=gpu0,peerpods.io/gpu=gpu1,peerpods.io/gpu=gpu2-mig0"
        )


def test_sandbox_container_gets_nothing_and_untouched_requests_pass_byte_for_byte() -> None:
    payload = create_container("pause", sandbox=True).SerializeToString()
    assert rewrite_create_container(payload, STORED) is payload
    plain = create_container("app").SerializeToString() + raw_field(40, b"future")
    assert rewrite_create_container(plain, None) is plain
    assert rewrite_create_container(plain, plan_devices(None, GpuIntent(), (0, ""))) is plain


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\x0a\x05ab", "cannot decode CreateContainerRequest"),
        (b"\x32\xff\xff\xff\xff\x0f", "cannot decode CreateContainerRequest"),
        (create_container("x", plan_json="{not json").SerializeToString(), "devices"),
        (
            create_container(
                "x",
                plan_json=json.dumps(
                    {
                        "v": 1,
                        "units": [{"id": "g", "kind": "gpu", "count": 9}],
                        "containers": {"x": ["g"]},
                    }
                ),
            ).SerializeToString(),
            "needs 9 whole GPUs",
        ),
    ],
)
def test_refusals_are_invalid_argument(payload: bytes, message: str) -> None:
    hook = make_hook(STORED)
    with pytest.raises(TtrpcError, match=message) as info:
        hook(payload)
    assert info.value.code == Code.INVALID_ARGUMENT


def test_gpu_pod_container_without_a_name_is_refused() -> None:
    req = create_container("x")
    del req.OCI.Annotations["io.kubernetes.cri.container-name"]
    with pytest.raises(RewriteError, match="container-name"):
        rewrite_create_container(req.SerializeToString(), STORED)


SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}],
        "hooks": [
            {
                "hookName": "createContainer",
                "path": "/usr/bin/nvidia-cdi-hook",
                "args": ["nvidia-cdi-hook", "update-ldcache"],
            }
        ],
        "mounts": [
            {
                "hostPath": "/usr/lib/libcuda.so.1",
                "containerPath": "/usr/lib/libcuda.so.1",
                "options": ["ro", "nosuid", "nodev", "bind"],
            }
        ],
    },
    "devices": [
        {
            "name": str(i),
            "containerEdits": {
                "deviceNodes": [{"path": f"/dev/nvidia{i}", "type": "c", "major": 195, "minor": i}]
            },
        }
        for i in range(2)
    ]
    + [
        {
            "name": "2:0",
            "containerEdits": {
                "deviceNodes": [
                    {"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": 2},
                    {
                        "path": "/dev/nvidia-caps/nvidia-cap30",
                        "type": "c",
                        "major": 508,
                        "minor": 30,
                    },
                ]
            },
        }
    ],
}


def test_edits_mode_applies_the_spec_into_the_oci_spec(tmp_path: Path) -> None:
    (tmp_path / "nvidia.json").write_text(json.dumps(SPEC))
    registry = Registry([str(tmp_path)])
    req = create_container(
        "train", plan_json=PLAN.encode(), extra_annotations={"cdi.k8s.io/x": "nvidia.com/gpu=0"}
    )
    payload = req.SerializeToString() + raw_field(6, raw_field(2, user_field(1000, 1000)))
    out = agent_pb2.CreateContainerRequest()
    out.ParseFromString(
        rewrite_create_container(payload, STORED_CTK, mode="edits", registry=registry)
    )
    assert not [k for k in out.OCI.Annotations if k.startswith("cdi.k8s.io/")]
    assert [d.Path for d in out.OCI.Linux.Devices] == [
        "/dev/nvidiactl",
        "/dev/nvidia0",
        "/dev/nvidia1",
    ]
    assert {(d.UID, d.GID) for d in out.OCI.Linux.Devices} == {(1000, 1000)}
    assert [(r.Type, r.Major, r.Minor, r.Access) for r in out.OCI.Linux.Resources.Devices] == [
        ("c", 195, 255, "rwm"),
        ("c", 195, 0, "rwm"),
        ("c", 195, 1, "rwm"),
    ]
    assert "NVIDIA_VISIBLE_DEVICES=void" in out.OCI.Process.Env
    assert out.OCI.Hooks.CreateContainer[0].Path == "/usr/bin/nvidia-cdi-hook"
    assert out.OCI.Mounts[-1].destination == "/usr/lib/libcuda.so.1"  # deeper paths sort last


def test_edits_mode_refuses_specs_needing_a_guest_stat(tmp_path: Path) -> None:
    spec = dict(
        SPEC,
        devices=[{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia-uvm"}]}}],
    )
    (tmp_path / "nvidia.json").write_text(json.dumps(spec))
    hook = make_hook(
        plan_devices(None, GpuIntent(gpus=1), (1, "l4"), CTK_NAMES),
        "edits",
        Registry([str(tmp_path)]),
    )
    with pytest.raises(TtrpcError, match=r"nvidia-uvm.*stat") as info:
        hook(create_container("main").SerializeToString())
    assert info.value.code == Code.INVALID_ARGUMENT


# --- properties --------------------------------------------------------------------------------

names = st.sampled_from(["train", "infer", "sidecar", "other"])
annotation_keys = st.one_of(
    st.sampled_from(
        [
            "cdi.k8s.io/x",
            "cdi.k8s.io/peerpods_train",
            "io.kubernetes.cri.foo",
            "example.com/a",
            "cdi.k8s.io/nvidia_0",
        ]
    ),
    st.text("abcxyz./-_", min_size=1, max_size=12),
)
unknown_top = st.lists(st.tuples(st.integers(12, 60), st.binary(max_size=12)), max_size=3)
unknown_spec = st.lists(st.tuples(st.integers(9, 30), st.binary(max_size=12)), max_size=3)
unknown_process = st.lists(
    st.tuples(st.sampled_from([1, 2, 3, 7, 8, 9, 10]), st.binary(max_size=8)), max_size=3
)


def _raw(fields: list[tuple[int, bytes]]) -> bytes:
    return b"".join(raw_field(n, data) for n, data in fields)


def _without_annotations(payload: bytes) -> bytes:
    req = agent_pb2.CreateContainerRequest()
    req.ParseFromString(payload)
    req.OCI.Annotations.clear()
    return bytes(req.SerializeToString(deterministic=True))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    name=names,
    sandbox=st.booleans(),
    use_plan=st.booleans(),
    extra=st.dictionaries(annotation_keys, st.text(max_size=20), max_size=5),
    top=unknown_top,
    spec_fields=unknown_spec,
    process_fields=unknown_process,
    env=st.integers(0, 6),
    mounts=st.integers(0, 4),
)
def test_rewrite_keeps_everything_but_the_cdi_annotations(
    name: str,
    sandbox: bool,
    use_plan: bool,
    extra: dict[str, str],
    top: list[tuple[int, bytes]],
    spec_fields: list[tuple[int, bytes]],
    process_fields: list[tuple[int, bytes]],
    env: int,
    mounts: int,
) -> None:
    req = create_container(
        name,
        sandbox=sandbox,
        plan_json=PLAN.encode() if use_plan else "",
        env=env,
        mounts=mounts,
        extra_annotations=extra,
    )
    unknown = _raw(top) + raw_field(6, _raw(spec_fields) + raw_field(2, _raw(process_fields)))
    payload = req.SerializeToString() + unknown
    out = rewrite_create_container(payload, STORED)
    # every field but the annotations (unknown ones included) is unchanged
    assert _without_annotations(out) == _without_annotations(payload)
    for number, data in top:
        assert raw_field(number, data) in out  # unknown fields byte for byte
    before, after = annotations_after(payload), annotations_after(out)
    own = f"cdi.k8s.io/peerpods_{name}"
    assert {k: v for k, v in after.items() if not k.startswith("cdi.k8s.io/")} == {
        k: v for k, v in before.items() if not k.startswith("cdi.k8s.io/")
    }
    assert set(k for k in after if k.startswith("cdi.k8s.io/")) <= {own}
    expected = (
        []
        if sandbox
        else (STORED.with_container_plan(PLAN) if use_plan else STORED).for_container(name)
    )
    assert after.get(own, "") == ",".join(expected)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.binary(max_size=64))
def test_garbage_is_refused_or_decoded_never_crashes(data: bytes) -> None:
    hook = make_hook(STORED)
    try:
        hook(data)
    except TtrpcError as exc:
        assert exc.code == Code.INVALID_ARGUMENT


def test_plan_roundtrip_is_json() -> None:
    assert DevicePlan.from_json(STORED.to_json()) == STORED
