"""Selection keeps its per-catalog index on a `Selector`, never in the process: two selectors
over different catalogs in one process each see their own catalog, and what one has seen (its
GPU verdicts) is not the other's."""

from __future__ import annotations

import pytest

from providers.core.catalog import Catalog
from providers.core.errors import NoMatch
from providers.core.request import InstanceRequest
from providers.core.selection import Selector, select
from providers.core.snapshots import load_snapshot

H100 = InstanceRequest(gpus=1, gpu_models=("h100",))


def _without(catalog: Catalog, name: str) -> Catalog:
    return Catalog(**{**dict(catalog), "types": tuple(t for t in catalog.types if t.name != name)})


def test_two_selectors_over_different_catalogs_do_not_see_each_other() -> None:
    full = load_snapshot("aws", "us-east-1")
    best = Selector(full).select(H100).selected.name
    smaller = _without(full, best)
    mine, yours = Selector(full), Selector(smaller)
    assert yours.select(H100).selected.name != best
    assert mine.select(H100).selected.name == best
    assert yours.select(H100).selected.name != best  # the other's catalog left nothing behind
    assert best not in yours.catalog.by_name()
    with pytest.raises(NoMatch, match="not in the aws us-east-1 catalog"):
        yours.select(InstanceRequest(instance_type=best)).selected  # noqa: B018


def test_verdicts_belong_to_the_selector_that_made_them() -> None:
    catalog = load_snapshot("aws", "us-east-1")
    used, fresh = Selector(catalog), Selector(catalog)
    used.select(H100)
    assert used._index.verdicts and not fresh._index.verdicts
    # a one-off `select` builds its own index and keeps nothing
    assert select(catalog, H100).selected.name == used.select(H100).selected.name
    assert len(used._index.verdicts) == 1 and not fresh._index.verdicts
