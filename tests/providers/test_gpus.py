"""The alias table: every name a GPU goes by resolves to one canonical model."""

from __future__ import annotations

import pytest

from providers.core.errors import InvalidRequest
from providers.core.gpus import (
    GPU_MODELS,
    aws_gpu,
    azure_size_gpu,
    gcp_accelerator_gpu,
    models_matching,
    resolve_gpu,
)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("h100", "h100-80gb"),
        ("H100 80GB", "h100-80gb"),
        ("nvidia-h100-80gb", "h100-80gb"),
        ("NVIDIA H100 80GB HBM3", "h100-80gb"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("a100-80gb", "a100-80gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb"),
        ("Tesla T4", "t4"),
        ("T4", "t4"),
        ("NVIDIA L4", "l4"),
        ("l40s", "l40s"),
        ("NVIDIA A10G", "a10g"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("NVIDIA H200", "h200"),
        ("b200", "b200"),
    ],
)
def test_resolve_any_spelling(name: str, expected: str) -> None:
    assert resolve_gpu(name).id == expected


def test_unknown_name_is_a_clear_error() -> None:
    with pytest.raises(InvalidRequest, match="unknown GPU model 'h900'"):
        resolve_gpu("h900")
    with pytest.raises(InvalidRequest):
        resolve_gpu("")


@pytest.mark.parametrize(
    ("name", "memory", "expected"),
    [
        ("A100", 40960, "a100-40gb"),  # p4d
        ("A100", 81920, "a100-80gb"),  # p4de reports the same name
        ("H100", 81920, "h100-80gb"),
        ("H200", 144384, "h200"),
        ("B200", 183359, "b200"),
        ("L4", 22888, "l4"),
        ("L4", 2861, "l4"),  # g6f: the partition's memory, still an L4
        ("L40S", 45776, "l40s"),
        ("A10G", 22888, "a10g"),
        ("T4g", 16384, "t4g"),
        ("V100", 32768, "v100-32gb"),  # p3dn
        ("V100", 16384, "v100"),
        ("RTX PRO Server 6000", 98304, "rtx-pro-6000"),
        ("Radeon Pro V520", 8192, "radeon-pro-v520"),
        ("Gaudi HL-205", 32768, "gaudi-hl-205"),
    ],
)
def test_aws_names_with_memory(name: str, memory: int, expected: str) -> None:
    assert aws_gpu(name, memory).id == expected


@pytest.mark.parametrize(
    ("size", "expected", "fraction"),
    [
        ("Standard_NC4as_T4_v3", "t4", 1.0),
        ("Standard_NC64as_T4_v3", "t4", 1.0),
        ("Standard_NC24ads_A100_v4", "a100-80gb", 1.0),
        ("Standard_ND96asr_v4", "a100-40gb", 1.0),
        ("Standard_ND96amsr_A100_v4", "a100-80gb", 1.0),
        ("Standard_ND96isr_H100_v5", "h100-80gb", 1.0),
        ("Standard_NC40ads_H100_v5", "h100-nvl", 1.0),
        ("Standard_NC80adis_H100_v5", "h100-nvl", 1.0),
        ("Standard_ND96isr_H200_v5", "h200", 1.0),
        ("Standard_NV6ads_A10_v5", "a10", 1 / 6),
        ("Standard_NV12ads_A10_v5", "a10", 1 / 3),
        ("Standard_NV18ads_A10_v5", "a10", 1 / 2),
        ("Standard_NV36ads_A10_v5", "a10", 1.0),
        ("Standard_NC6s_v3", "v100", 1.0),
        ("NC24rs_v3", "v100", 1.0),
    ],
)
def test_azure_size_names(size: str, expected: str, fraction: float) -> None:
    found = azure_size_gpu(size)
    assert found is not None
    model, share = found
    assert model.id == expected
    assert share == pytest.approx(fraction)


@pytest.mark.parametrize("size", ["Standard_D4s_v5", "Standard_E96as_v5", "Standard_F2s_v2", ""])
def test_azure_sizes_without_gpu(size: str) -> None:
    assert azure_size_gpu(size) is None


@pytest.mark.parametrize(
    ("accelerator", "expected"),
    [
        ("nvidia-tesla-t4", "t4"),
        ("nvidia-tesla-v100", "v100"),
        ("nvidia-tesla-p100", "p100"),
        ("nvidia-tesla-p4", "p4"),
        ("nvidia-tesla-a100", "a100-40gb"),
        ("nvidia-a100-80gb", "a100-80gb"),
        ("nvidia-h100-80gb", "h100-80gb"),
        ("nvidia-h100-mega-80gb", "h100-80gb"),
        ("nvidia-h200-141gb", "h200"),
        ("nvidia-b200", "b200"),
        ("nvidia-l4", "l4"),
        ("projects/p/zones/us-central1-a/acceleratorTypes/nvidia-l4", "l4"),
    ],
)
def test_gcp_accelerator_types(accelerator: str, expected: str) -> None:
    assert gcp_accelerator_gpu(accelerator).id == expected


def test_gcp_unknown_accelerator() -> None:
    with pytest.raises(InvalidRequest):
        gcp_accelerator_gpu("ct5lp-hightpu")


def test_family_names_accept_every_variant() -> None:
    assert models_matching("a100") == {"a100-40gb", "a100-80gb"}
    assert models_matching("H100") == {"h100-80gb", "h100-nvl"}
    assert models_matching("a100-80gb") == {"a100-80gb"}
    assert models_matching("NVIDIA L4") == {"l4"}


def test_table_is_consistent() -> None:
    for model_id, model in GPU_MODELS.items():
        assert model.id == model_id
        assert resolve_gpu(model_id) is model
        assert resolve_gpu(model.product_name).id == model_id
        assert model.memory_mib > 0
        if model.mig_profiles:
            assert model.mig_capable
    # NVIDIA's MIG guide: MIG capable or not
    for mig in ("a100-40gb", "a100-80gb", "a30", "h100-80gb", "h100-nvl", "h200", "b200"):
        assert GPU_MODELS[mig].mig_profiles
    for plain in ("t4", "t4g", "v100", "a10", "a10g", "l4", "l40s"):
        assert not GPU_MODELS[plain].mig_capable
