"""`podvm prepare` on layouts no adaptor writes (user data is the VM's input): JSON nested past
the parser's depth, NaN and Infinity; each is exit 2 with one line on stderr, nothing changed."""

from __future__ import annotations

from typing import Any

import pytest

from adaptor.podvm.layout import LayoutError, load_json

DEEP = '{"peerpods-devices": ' + "[" * 100_000 + "]" * 100_000 + "}"
INFINITE = (
    '{"peerpods-devices": {"v": 2, "layouts": [{"gpus": '
    '[{"index": Infinity, "name": "peerpods.io/gpu=a"}]}]}}'
)
NAN_ELSEWHERE = '{"pod-network": {"mtu": NaN}, "peerpods-devices": {"v": 2}}'
LEGACY_INFINITE = '{"v": 1, "mig": [[{"profile": "1g.10gb", "start": -Infinity}]]}'


@pytest.mark.parametrize(
    ("apf", "legacy", "message"),
    [
        (DEEP, None, "nested too deeply"),
        (INFINITE, None, "Infinity is not a JSON number"),
        (NAN_ELSEWHERE, None, "NaN is not a JSON number"),
        (None, LEGACY_INFINITE, "-Infinity is not a JSON number"),
    ],
    ids=["deep", "infinity", "nan-elsewhere", "legacy-infinity"],
)
def test_hostile_json_is_exit_2_with_one_line(
    make_vm: Any,
    capsys: pytest.CaptureFixture[str],
    apf: str | None,
    legacy: str | None,
    message: str,
) -> None:
    vm = make_vm()
    vm.options.apf_path.parent.mkdir(parents=True, exist_ok=True)
    if apf is not None:
        vm.options.apf_path.write_text(apf)
    if legacy is not None:
        vm.options.legacy_path.write_text(legacy)
    code = vm.prepare_cli()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert "Traceback" not in err
    assert vm.machine.calls == [] and not vm.options.cdi_dir.exists()


def test_an_infinite_legacy_slot_is_a_layout_error_even_unparsed() -> None:
    """The legacy reader converts starts itself: an infinite float there is a LayoutError too."""
    from adaptor.podvm.layout import legacy_layout

    with pytest.raises(LayoutError, match="bad slot"):
        legacy_layout({"v": 1, "mig": [[{"profile": "1g.10gb", "start": float("inf")}]]}, "here")
    with pytest.raises(LayoutError, match="nested too deeply"):
        load_json("[" * 100_000, "here")
