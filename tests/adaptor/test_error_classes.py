"""Errors that are the caller's or the operator's reach the shim with their own status, never
INTERNAL (which reads as a bug of the adaptor)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptor.hypervisor.service import to_status
from adaptor.podnet import PodNet, PodNetSettings, VniExhausted
from adaptor.podnet._model import MAX_VNI
from adaptor.state import StateStore
from adaptor.ttrpc.status import Code


async def test_an_exhausted_vni_pool_is_resource_exhausted(tmp_path: Path) -> None:
    store = await StateStore.open(tmp_path)
    podnet = PodNet(PodNetSettings(vxlan_min_id=MAX_VNI - 1), store)
    try:
        assert await podnet.allocate_vni("a") == MAX_VNI - 1
        assert await podnet.allocate_vni("b") == MAX_VNI
        with pytest.raises(VniExhausted) as caught:
            await podnet.allocate_vni("c")
        status = to_status(caught.value)
        assert status.code is Code.RESOURCE_EXHAUSTED
        assert str(MAX_VNI) in status.message
    finally:
        await podnet.close()
        await store.close()
