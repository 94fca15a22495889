from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dra.fake_kube import FakeKube


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[FakeKube]:
    fake = FakeKube(tmp_path)
    yield fake
    fake.close()
