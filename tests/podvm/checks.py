"""Checks shared by the podvm tests: a name's nodes lead to the device planned for it."""

from __future__ import annotations

from adaptor.podvm.layout import Layout
from tests.podvm.conftest import PodVM


def nodes_of(vm: PodVM, name: str) -> list[tuple[str, int]]:
    kind, _, short = name.partition("=")
    spec = next(s for s in vm.specs().values() if s.kind == kind)
    device = spec.device(short)
    assert device is not None, name
    return [(n.path, n.minor) for n in device.edits.device_nodes]


def check_bound(vm: PodVM, layout: Layout) -> None:
    """Every MIG name's nodes reach the device the hardware has at its planned placement, and the
    status file records that device's UUID and ids."""
    truth = {(t["gpu"], t["start"]): t for t in vm.machine.truth()}
    records = {d["name"]: d for d in vm.status()["devices"]}
    for gpu in layout.gpus:
        for m in gpu.mig:
            real = truth[(gpu.index, m.start)]
            assert real["profile"] == m.profile
            assert vm.uuid_of(nodes_of(vm, m.name)) == real["uuid"]
            record = records[m.name]
            assert (record["uuid"], record["gi"], record["ci"], record["state"]) == (
                real["uuid"],
                real["gi"],
                real["ci"],
                "ready",
            )
            assert record["mig_index"] == real["mig_index"]
        if gpu.name:
            minor = vm.machine.gpus[gpu.index].minor
            assert nodes_of(vm, gpu.name) == [(f"/dev/nvidia{minor}", minor)]
            assert records[gpu.name]["uuid"] == vm.machine.gpus[gpu.index].uuid
