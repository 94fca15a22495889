"""RDMA device counts: a pod asking for N EFA interfaces gets a type with at least N."""

from __future__ import annotations

import pytest

from providers.core.errors import NoMatch
from providers.core.request import InstanceRequest
from providers.core.selection import rdma_devices, select
from providers.core.snapshots import load_snapshot


def test_a_count_excludes_types_with_too_few_interfaces() -> None:
    catalog = load_snapshot("aws", "us-east-1")
    any_rdma = select(catalog, InstanceRequest(gpus=8, rdma=True))
    four = select(catalog, InstanceRequest(gpus=8, rdma=True, rdma_devices=4))
    assert rdma_devices(any_rdma.selected.instance_type) < 4  # the cheapest 8-GPU EFA type
    assert any_rdma.selected.name != four.selected.name
    assert all(rdma_devices(c.instance_type) >= 4 for c in four.candidates)
    rejected = {r.name: r.reason for r in four.rejections}
    assert "RDMA device(s), need 4" in rejected[any_rdma.selected.name]


def test_sixteen_interfaces_need_a_p5_class_type() -> None:
    catalog = load_snapshot("aws", "us-east-1")
    chosen = select(
        catalog, InstanceRequest(gpus=8, gpu_models=("h100",), rdma=True, rdma_devices=16)
    ).selected
    assert chosen.name.startswith("p5") and rdma_devices(chosen.instance_type) >= 16


def test_cpu_only_requests_honour_the_count_too() -> None:
    catalog = load_snapshot("aws", "us-east-1")
    chosen = select(catalog, InstanceRequest(vcpus=8, rdma=True, rdma_devices=2)).selected
    assert rdma_devices(chosen.instance_type) >= 2
    with pytest.raises(NoMatch, match="RDMA"):
        _ = select(catalog, InstanceRequest(rdma=True, rdma_devices=10_000)).selected
