"""The stand-in is only as good as its likeness: every pynvml function the pod VM code calls exists
in the real bindings with the same parameters, and the constants and profile enums agree."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from tests.podvm import fake_nvml

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
CALLED = sorted(
    set(
        re.findall(
            r'"(nvml[A-Za-z_]+)"', (Path(__file__).parents[2] / "adaptor/podvm/nvml.py").read_text()
        )
    )
)


@pytest.mark.parametrize("name", CALLED)
def test_every_function_called_exists_with_the_same_parameters(name: str) -> None:
    real = inspect.signature(getattr(pynvml, name))
    fake = inspect.signature(getattr(fake_nvml, name))
    assert len(real.parameters) == len(fake.parameters), (real, fake)
    defaults = [p.default for p in real.parameters.values()]
    assert defaults == [p.default for p in fake.parameters.values()]


def test_constants_and_profile_enums_agree() -> None:
    for name in [n for n in dir(fake_nvml) if n.startswith(("NVML_ERROR_", "NVML_DEVICE_MIG_"))]:
        assert getattr(fake_nvml, name) == getattr(pynvml, name), name
    for name in ("NVML_SUCCESS", "NVML_GPU_INSTANCE_PROFILE_COUNT",
                 "NVML_COMPUTE_INSTANCE_PROFILE_COUNT",
                 "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED"):  # fmt: skip
        assert getattr(fake_nvml, name) == getattr(pynvml, name), name
    rows = ("1_SLICE", "1_SLICE_REV1", "1_SLICE_REV2", "2_SLICE", "3_SLICE", "4_SLICE", "7_SLICE")
    enums = [getattr(pynvml, f"NVML_GPU_INSTANCE_PROFILE_{r}") for r in rows]
    assert enums == [enum for _, enum in fake_nvml._ROW_IDS]
    assert all(pid != enum for pid, enum in fake_nvml._ROW_IDS if pid)  # ids unlike the enums
    assert [f[0] for f in fake_nvml.c_nvmlGpuInstancePlacement_t._fields_] == [
        f[0] for f in pynvml.c_nvmlGpuInstancePlacement_t._fields_
    ]


def test_errors_are_raised_as_pynvml_raises_them() -> None:
    for code in (1, 2, 3, 6, 7, 9, 16, 19, 23, 999):
        real, fake = pynvml.NVMLError(code), fake_nvml.NVMLError(code)
        assert type(real).__name__ == type(fake).__name__ and fake.value == real.value == code
        assert str(real) == str(fake)
