"""Every layout the packer can produce for A100, H100, H200 and B200, prepared on the fake NVML:
each name bound to the device at its planned placement (by UUID), and a second run a no-op."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from adaptor.devices import plan_devices
from adaptor.podvm.layout import Layout
from providers.core.contract import GpuIntent
from providers.core.mig import min_gpus, profiles_for
from tests.podvm.checks import check_bound

MODELS = ("a100-40gb", "a100-80gb", "h100-80gb", "h200", "b200")
MUTATING = ("SetMigMode", "CreateGI", "CreateCI", "DestroyGI", "DestroyCI")


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict[str, int], int, int, bool, int]:
    """(model, MIG request, whole GPUs, spare GPUs, MIG already on, seed)."""
    model = draw(st.sampled_from(MODELS))
    names = sorted(profiles_for(model))
    chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
    mig = {name: draw(st.integers(1, 4)) for name in chosen}
    needed = min_gpus(model, mig)
    assume(needed is not None and needed <= 3)
    whole = draw(st.integers(0, 1))
    spare = draw(st.integers(0, 1))
    return model, mig, whole, spare, draw(st.booleans()), draw(st.integers(0, 2**16))


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=requests())
def test_every_packed_layout_is_created_and_bound(make_vm: Any, case: Any) -> None:
    model, mig, whole, spare, enabled, seed = case
    needed = min_gpus(model, mig)
    assert needed is not None
    count = whole + needed + spare
    plan = plan_devices(None, GpuIntent(gpus=whole, mig=mig), (count, model))
    layout = Layout.from_plan(plan)
    assert sorted(layout.names()) == sorted(plan.default)

    vm = make_vm(model=model, gpus=count, seed=seed, mig_enabled=enabled)
    vm.send(layout)
    result = vm.prepare()
    assert result.exit_code == 0, vm.lines
    check_bound(vm, layout)
    planned = sorted((m.gpu, m.profile, m.start) for m in plan.mig)
    made = sorted((t["gpu"], t["profile"], t["start"]) for t in vm.machine.truth())
    assert made == planned
    (spec,) = vm.specs().values()
    assert sorted(spec.qualified_names()) == sorted(plan.default)

    calls = len(vm.machine.calls)
    again = vm.prepare()
    assert again.exit_code == 0 and not again.changed
    assert not [c for c in vm.machine.calls[calls:] if c.startswith(MUTATING)]
