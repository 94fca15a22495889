"""`podvm prepare` on the fake NVML: what it creates, what it keeps, what it refuses, and the one
reboot a pending MIG mode may take."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adaptor.cli.main import main
from adaptor.podvm.layout import GpuLayout, Layout, MigSpec
from tests.podvm import fake_nvml, fakehost
from tests.podvm.checks import check_bound, nodes_of
from tests.podvm.conftest import PodVM

MIXED = Layout(
    model="h100-80gb",
    gpus=(
        GpuLayout(index=0, name="peerpods.io/gpu=gpu0"),
        GpuLayout(
            index=1,
            mig=(
                MigSpec(profile="1g.10gb", start=0, name="peerpods.io/gpu=gpu1-mig0"),
                MigSpec(profile="1g.10gb", start=1, name="peerpods.io/gpu=gpu1-mig1"),
                MigSpec(profile="1g.10gb", start=2, name="peerpods.io/gpu=gpu1-mig2"),
                MigSpec(profile="1g.10gb", start=3, name="peerpods.io/gpu=gpu1-mig3"),
                MigSpec(profile="3g.40gb", start=4, name="peerpods.io/gpu=gpu1-mig4"),
            ),
        ),
    ),
)
MUTATING = ("SetMigMode", "CreateGI", "CreateCI", "DestroyGI", "DestroyCI")


def test_mixed_layout_is_created_at_its_placements_and_bound_to_its_names(make_vm: Any) -> None:
    vm = make_vm(mig_enabled=False, seed=7)
    vm.send(MIXED)
    result = vm.prepare()
    assert result.exit_code == 0, vm.lines
    assert [g.mig_current for g in vm.machine.gpus] == [0, 1]  # MIG only where MIG is planned
    check_bound(vm, MIXED)
    (spec,) = vm.specs().values()
    assert spec.kind == "peerpods.io/gpu" and spec.version == "0.3.0"
    assert sorted(spec.qualified_names()) == sorted(MIXED.names())
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec.edits.env
    assert {n.path for n in spec.edits.device_nodes} == {
        "/dev/nvidiactl",
        "/dev/nvidia-modeset",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    }
    mounts = {m.container_path for m in spec.edits.mounts}
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" in mounts
    assert "/usr/lib/x86_64-linux-gnu/libc.so.6" not in mounts
    assert "/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin" in mounts
    assert [h.args[1] for h in spec.edits.hooks] == ["create-symlinks", "update-ldcache"]
    assert vm.lines[-1] == "podvm: 6 planned device(s) ready"
    assert any("peerpods.io/gpu=gpu1-mig4: ready MIG-" in line for line in vm.lines)


def test_ids_and_indices_are_read_back_not_assumed(make_vm: Any) -> None:
    # Across seeds the same placements get other GI ids and MIG indices: the names still bind.
    seen: set[tuple[int, ...]] = set()
    for seed in range(4):
        vm = make_vm(seed=seed, mig_enabled=True)
        vm.send(MIXED)
        assert vm.prepare().exit_code == 0, vm.lines
        check_bound(vm, MIXED)
        truth = sorted(vm.machine.truth(), key=lambda t: t["start"])
        seen.add(tuple(t["gi"] for t in truth) + tuple(t["mig_index"] for t in truth))
    assert len(seen) > 1


def test_a_second_prepare_changes_nothing(make_vm: Any) -> None:
    vm = make_vm()
    vm.send(MIXED)
    assert vm.prepare().exit_code == 0
    specs, status = vm.spec_texts(), vm.status()
    stamps = {p: p.stat().st_mtime_ns for p in vm.options.cdi_dir.iterdir()}
    calls = len(vm.machine.calls)
    again = vm.prepare()
    assert again.exit_code == 0 and not again.changed
    assert vm.machine.calls[calls:] == []
    assert vm.spec_texts() == specs and vm.status() == status
    assert {p: p.stat().st_mtime_ns for p in vm.options.cdi_dir.iterdir()} == stamps


def _pre_existing(
    vm: PodVM, gpu: int, profile: str, start: int, pids: tuple[int, ...] = ()
) -> None:
    """A GI (with a full CI) left on the GPU by someone else, as NVML would have made it."""
    m = vm.machine
    g = m.gpus[gpu]
    g.mig_current = g.mig_pending = 1
    p = next(p for p in g.profiles() if p.name == profile)
    gi = fake_nvml.FakeGI(next(iter(fake_nvml._GI_POOLS[p.memory_slots])), p, start)
    gi.cis[0] = fake_nvml.FakeCI(
        0, {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[p.slices], p.slices, 6, m._uuid("MIG"), list(pids)
    )
    g.gis[gi.id] = gi


def test_a_conflicting_layout_is_replaced_when_nothing_runs_on_it(make_vm: Any) -> None:
    vm = make_vm()
    _pre_existing(vm, 1, "7g.80gb", 0)
    vm.send(MIXED)
    assert vm.prepare().exit_code == 0, vm.lines
    assert "DestroyGI(1,0)" in vm.machine.calls
    check_bound(vm, MIXED)


def test_a_matching_instance_is_kept(make_vm: Any) -> None:
    vm = make_vm()
    _pre_existing(vm, 1, "3g.40gb", 4, pids=(77,))
    before = vm.machine.truth()
    vm.send(MIXED)
    assert vm.prepare().exit_code == 0, vm.lines
    kept = next(t for t in vm.machine.truth() if t["start"] == 4)
    assert kept == before[0]  # same GI, CI, UUID: a running process keeps its device
    check_bound(vm, MIXED)


def test_a_layout_held_by_a_process_fails_the_overlapped_devices_only(make_vm: Any) -> None:
    vm = make_vm()
    _pre_existing(vm, 1, "4g.40gb", 0, pids=(4242,))
    vm.send(MIXED)
    result = vm.prepare()
    assert result.exit_code == 1
    failed = {r.name: r.error for r in result.failed}
    assert set(failed) == {f"peerpods.io/gpu=gpu1-mig{i}" for i in range(4)}
    assert all("in use by processes 4242" in e for e in failed.values())
    status = {d["name"]: d for d in vm.status()["devices"]}
    assert status["peerpods.io/gpu=gpu1-mig4"]["state"] == "ready"
    assert status["peerpods.io/gpu=gpu1-mig0"]["state"] == "failed"
    assert vm.status()["result"] == "failed"
    (spec,) = vm.specs().values()
    assert sorted(spec.qualified_names()) == ["peerpods.io/gpu=gpu0", "peerpods.io/gpu=gpu1-mig4"]
    assert "4 of 6 planned devices could not be created: peerpods.io/gpu=gpu1-mig0" in vm.lines[-1]


def test_a_layout_the_gpu_refuses_fails_with_the_reason_through_the_cli(
    make_vm: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    vm = make_vm()
    vm.machine.refuse[(1, 4)] = fake_nvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    vm.send(MIXED)
    code = vm.prepare_cli()
    out, err = capsys.readouterr()
    assert code == 1
    assert err.count("\n") == 1
    assert err.startswith(
        "peerpods podvm prepare: 1 of 6 planned devices could not be created: "
        "peerpods.io/gpu=gpu1-mig4 (3g.40gb at GPU 1 slot 4): cannot create "
        "GPU instance: nvmlDeviceCreateGpuInstanceWithPlacement: "
        "Insufficient resources (NVML 23)"
    )
    (bad,) = [d for d in vm.status()["devices"] if d["state"] == "failed"]
    assert bad["name"] == "peerpods.io/gpu=gpu1-mig4"
    assert "Insufficient resources" in bad["error"]
    assert "peerpods.io/gpu=gpu1-mig4: failed" in out
    assert "gpu1-mig4" not in "".join(vm.spec_texts().values())


def test_a_profile_the_gpu_lacks_fails_naming_what_it_offers(make_vm: Any) -> None:
    vm = make_vm(model="h200", gpus=1)
    vm.send(
        Layout(
            model="h200",
            gpus=(
                GpuLayout(
                    index=0,
                    mig=(MigSpec(profile="1g.10gb", start=0, name="peerpods.io/gpu=gpu0-mig0"),),
                ),
            ),
        )
    )
    result = vm.prepare()
    assert result.exit_code == 1
    assert "profile 1g.10gb is not offered by NVIDIA H200" in result.failed[0].error
    assert "1g.18gb" in result.failed[0].error


def test_more_gpus_planned_than_present_fail_alone(make_vm: Any) -> None:
    vm = make_vm(gpus=1)
    vm.send(MIXED)
    result = vm.prepare()
    assert {r.name for r in result.failed} == {n for n in MIXED.names() if "gpu1" in n}
    assert result.failed[0].error == "the VM has 1 GPU(s), no GPU 1"


def test_a_whole_gpu_left_in_mig_mode_is_switched_back(make_vm: Any) -> None:
    vm = make_vm(gpus=1)
    _pre_existing(vm, 0, "7g.80gb", 0)
    vm.send(Layout(model="h100-80gb", gpus=(GpuLayout(index=0, name="peerpods.io/gpu=gpu0"),)))
    assert vm.prepare().exit_code == 0, vm.lines
    assert vm.machine.gpus[0].mig_current == 0 and not vm.machine.gpus[0].gis


def test_an_nvml_failure_outside_any_device_fails_them_all_with_a_status(
    make_vm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    vm = make_vm()
    vm.send(MIXED)

    def broken() -> str:
        raise fake_nvml.NVMLError(999)

    monkeypatch.setattr(fake_nvml, "nvmlSystemGetDriverVersion", broken)
    result = vm.prepare()
    assert result.exit_code == 1 and len(result.failed) == 6
    assert (
        vm.status()["devices"][0]["error"]
        == "NVML: nvmlSystemGetDriverVersion: Unknown Error (NVML 999)"
    )
    assert vm.spec_texts() == {}


# --- pending MIG mode: one reboot, never a loop ------------------------------------------------


def test_pending_mig_mode_reboots_once_then_prepares(make_vm: Any) -> None:
    vm = make_vm(passthrough=True)
    vm.send(MIXED)
    first = vm.prepare()
    assert first.exit_code == 3 and first.rebooting
    assert (vm.base / "rebooted").exists()
    assert vm.status()["result"] == "rebooting"
    assert vm.machine.gpus[1].mig_pending == 1 and vm.machine.gpus[1].mig_current == 0

    vm.machine.reboot()  # the GPU resets with the VM; /run is empty again
    fakehost.set_boot(vm.root, "boot-2")
    vm.options.apf_path.unlink()
    second = vm.prepare()
    assert second.exit_code == 0, vm.lines
    check_bound(vm, MIXED)
    assert not (vm.options.state_dir / "reboot.json").exists()


def test_a_mode_still_pending_after_the_reboot_is_not_rebooted_again(make_vm: Any) -> None:
    vm = make_vm(passthrough=True)
    vm.send(MIXED)
    assert vm.prepare().exit_code == 3
    (vm.base / "rebooted").unlink()
    fakehost.set_boot(vm.root, "boot-2")  # rebooted, but this platform did not reset the GPU
    vm.machine.session = False
    result = vm.prepare()
    assert result.exit_code == 1 and not (vm.base / "rebooted").exists()
    errors = {r.name: r.error for r in result.failed}
    assert set(errors) == {n for n in MIXED.names() if "gpu1" in n}
    assert "still pending after a reboot" in errors["peerpods.io/gpu=gpu1-mig0"]
    assert vm.status()["devices"][0]["state"] == "ready"  # the whole GPU is unaffected


def test_no_writable_state_means_no_reboot(make_vm: Any) -> None:
    vm = make_vm(passthrough=True)
    vm.options.state_dir.parent.mkdir(parents=True, exist_ok=True)
    vm.options.state_dir.write_text("a file where the state dir should be")
    vm.send(MIXED)
    result = vm.prepare()
    assert result.exit_code == 1 and not (vm.base / "rebooted").exists()
    assert "not rebooting: cannot write the reboot guard" in result.failed[0].error
    vm.machine.reboot()  # rebooted by hand: where no reboot is needed, no state dir is needed
    assert vm.prepare().exit_code == 0, vm.lines


def test_no_reboot_fails_the_pending_gpu(make_vm: Any) -> None:
    vm = make_vm(passthrough=True)
    vm.send(MIXED)
    result = vm.prepare(reboot=False)
    assert result.exit_code == 1 and not (vm.base / "rebooted").exists()
    assert "rebooting is turned off" in result.failed[0].error


# --- inputs ------------------------------------------------------------------------------------


def test_legacy_devices_json_keeps_working(make_vm: Any) -> None:
    vm = make_vm()
    slots = [{"profile": "3g.40gb", "start": 4}, {"profile": "1g.10gb", "start": 0}]
    legacy = {"v": 1, "gpu_model": "h100-80gb", "cdi": {"generate": True}, "mig": [[], slots]}
    vm.options.legacy_path.parent.mkdir(parents=True, exist_ok=True)
    vm.options.legacy_path.write_text(json.dumps(legacy))
    vm.write_apf({"pod-network": None, "pod-namespace": "default", "pod-name": "p"})
    assert vm.prepare().exit_code == 0, vm.lines
    (spec,) = vm.specs().values()
    assert spec.kind == "nvidia.com/gpu" and spec.version == "0.5.0"  # names start with digits
    assert sorted(spec.qualified_names()) == [
        "nvidia.com/gpu=0",
        "nvidia.com/gpu=1:0",
        "nvidia.com/gpu=1:1",
    ]
    truth = {t["start"]: t["uuid"] for t in vm.machine.truth()}
    assert vm.uuid_of(nodes_of(vm, "nvidia.com/gpu=1:0")) == truth[0]  # rank by start slot
    assert vm.uuid_of(nodes_of(vm, "nvidia.com/gpu=1:1")) == truth[4]


def test_the_layout_of_the_vms_gpu_model_is_used(make_vm: Any) -> None:
    vm = make_vm(model="h200", gpus=1)
    other = Layout(
        model="h100-80gb",
        gpus=(
            GpuLayout(
                index=0,
                mig=(MigSpec(profile="3g.40gb", start=0, name="peerpods.io/gpu=gpu0-mig0"),),
            ),
        ),
    )
    mine = Layout(
        model="h200",
        gpus=(
            GpuLayout(
                index=0,
                mig=(MigSpec(profile="3g.71gb", start=0, name="peerpods.io/gpu=gpu0-mig0"),),
            ),
        ),
    )
    vm.send(other, mine)
    assert vm.prepare().exit_code == 0, vm.lines
    assert [t["profile"] for t in vm.machine.truth()] == ["3g.71gb"]


def test_rdma_names_bind_the_uverbs_devices(make_vm: Any) -> None:
    vm = make_vm(gpus=1, rdma=2)
    vm.send(
        Layout(
            model="h100-80gb",
            gpus=(GpuLayout(index=0, name="peerpods.io/gpu=gpu0"),),
            rdma=("rdma.peerpods.io/hca=0", "rdma.peerpods.io/hca=1", "rdma.peerpods.io/hca=2"),
        )
    )
    result = vm.prepare()
    assert [r.name for r in result.failed] == ["rdma.peerpods.io/hca=2"]
    specs = {s.kind: s for s in vm.specs().values()}
    rdma = specs["rdma.peerpods.io/hca"]
    assert rdma.version == "0.5.0"
    assert nodes_of(vm, "rdma.peerpods.io/hca=1") == [("/dev/infiniband/uverbs1", 193)]
    assert [n.path for n in rdma.edits.device_nodes] == ["/dev/infiniband/rdma_cm"]


def test_no_layout_prepares_nothing_and_removes_old_specs(make_vm: Any) -> None:
    vm = make_vm()
    vm.send(MIXED)
    assert vm.prepare().exit_code == 0
    vm.write_apf({"pod-network": None, "pod-namespace": "default", "pod-name": "p"})
    result = vm.prepare()
    assert result.exit_code == 0 and result.records == []
    assert vm.spec_texts() == {}
    assert vm.lines[-1] == "podvm: no devices planned for this VM"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        (
            json.dumps({"peerpods-devices": {"v": 2, "layouts": [{"gpus": [{"index": 0}]}]}}),
            "needs either a whole-GPU name or MIG devices",
        ),
        (
            json.dumps(
                {
                    "peerpods-devices": {
                        "v": 2,
                        "layouts": [
                            {
                                "gpus": [
                                    {"index": 0, "name": "peerpods.io/gpu=x"},
                                    {"index": 1, "name": "peerpods.io/gpu=x"},
                                ]
                            }
                        ],
                    }
                }
            ),
            "device name 'peerpods.io/gpu=x' is used twice",
        ),
        (
            json.dumps(
                {
                    "peerpods-devices": {
                        "v": 2,
                        "layouts": [{"gpus": [{"index": 0, "name": "not a name"}]}],
                    }
                }
            ),
            "not a qualified CDI name",
        ),
        (json.dumps({"peerpods-devices": {"v": 3}}), "v"),
    ],
)
def test_a_bad_layout_is_one_line_and_changes_nothing(
    make_vm: Any, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    vm = make_vm()
    vm.options.apf_path.parent.mkdir(parents=True, exist_ok=True)
    vm.options.apf_path.write_text(content)
    code = vm.prepare_cli()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert vm.machine.calls == [] and not vm.options.cdi_dir.exists()


def test_missing_nvml_bindings_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "podvm",
            "prepare",
            "--nvml-module",
            "no_such_nvml_module",
            "--apf-json",
            str(tmp_path / "apf.json"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no_such_nvml_module" in err


def test_nvidia_ctks_spec_is_left_alone_and_a_same_kind_spec_is_warned_about(make_vm: Any) -> None:
    vm = make_vm()
    etc = vm.options.other_cdi_dirs[0]
    etc.mkdir(parents=True)
    ctk = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
    }
    (etc / "nvidia.json").write_text(json.dumps(ctk))
    vm.options.cdi_dir.mkdir(parents=True)
    (vm.options.cdi_dir / "nvidia.json").write_text(json.dumps(ctk))
    vm.send(MIXED)
    assert vm.prepare().exit_code == 0
    assert not [line for line in vm.lines if "warning" in line]
    assert json.loads((vm.options.cdi_dir / "nvidia.json").read_text()) == ctk

    (etc / "other.json").write_text(json.dumps(dict(ctk, kind="peerpods.io/gpu")))
    assert vm.prepare().exit_code == 0
    assert f"podvm: warning: {etc / 'other.json'} also defines kind peerpods.io/gpu" in vm.lines
