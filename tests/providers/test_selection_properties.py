"""Properties over random catalogs and requests: the selected type satisfies the request, no
cheaper satisfying type exists, and the candidates are exactly the satisfying types."""

from __future__ import annotations

import fnmatch

from hypothesis import given, settings
from hypothesis import strategies as st

from providers.core.catalog import Catalog, GpuSpec, InstanceType
from providers.core.errors import NoMatch
from providers.core.estimates import catalog_gpu_rates, estimate_price
from providers.core.gpus import GPU_MODELS
from providers.core.mig import min_gpus
from providers.core.request import InstanceRequest
from providers.core.selection import select

MODELS = ["t4", "l4", "a100-40gb", "a100-80gb", "h100-80gb"]
ZONES = ["z-a", "z-b", "z-c"]


@st.composite
def instance_types(draw: st.DrawFn, index: int) -> InstanceType:
    gpu = None
    if draw(st.booleans()):
        model = draw(st.sampled_from(MODELS))
        fraction = draw(st.sampled_from([1.0, 1.0, 1.0, 0.5, 0.125])) if model == "l4" else 1.0
        count = 1 if fraction < 1 else draw(st.sampled_from([1, 2, 4, 8]))
        nominal = GPU_MODELS[model].memory_mib
        gpu = GpuSpec(
            model=model, count=count, memory_mib=int(nominal * fraction), fraction=fraction
        )
    price = draw(st.one_of(st.none(), st.integers(1, 50).map(lambda c: c / 4)))
    return InstanceType(
        name=f"{draw(st.sampled_from(['a', 'b', 'c']))}{index}.x",
        vcpus=draw(st.sampled_from([1, 2, 4, 8, 16, 96])),
        memory_mib=draw(st.sampled_from([1024, 4096, 16384, 65536])),
        arch=draw(st.sampled_from(["x86_64", "x86_64", "arm64"])),
        gpu=gpu,
        rdma=draw(st.sampled_from(["", "", "efa"])),
        zones=tuple(draw(st.lists(st.sampled_from(ZONES), unique=True, min_size=1, max_size=3)))
        if draw(st.integers(0, 5))
        else (),
        price_per_hour=price,
        # some shapes are sold only as Spot or Flex-start (GCP's small A3 High)
        provisioning=draw(
            st.sampled_from([("on-demand", "spot"), ("on-demand", "spot"), ("spot", "flex-start")])
        ),
    )


@st.composite
def catalogs(draw: st.DrawFn) -> Catalog:
    n = draw(st.integers(1, 20))
    types = [draw(instance_types(i)) for i in range(n)]
    return Catalog(cloud="aws", region="r-1", types=tuple(types))


@st.composite
def requests(draw: st.DrawFn) -> InstanceRequest:
    mig: dict[str, int] = {}
    gpus = draw(st.sampled_from([0, 0, 0, 1, 1, 2, 4, 8, 9]))
    if draw(st.integers(0, 3)) == 0:
        mig = draw(
            st.dictionaries(
                st.sampled_from(["1g.10gb", "3g.40gb", "4g.40gb", "2g.20gb"]),
                st.integers(1, 4),
                max_size=2,
            )
        )
    return InstanceRequest(
        vcpus=draw(st.sampled_from([0, 0, 1, 4, 16])),
        memory_mib=draw(st.sampled_from([0, 0, 2048, 16384])),
        gpus=gpus,
        gpu_models=tuple(draw(st.lists(st.sampled_from(["a100", "l4", "h100", "t4"]), max_size=2))),
        gpu_memory_mib=draw(st.sampled_from([0, 0, 0, 20480, 40960])),
        mig=mig,
        fractional=draw(st.booleans()),
        arch=draw(st.sampled_from(["x86_64", "x86_64", "x86_64", "arm64"])),
        rdma=draw(st.sampled_from([False, False, False, True])),
        deny=draw(st.sampled_from([(), (), (), ("a*",), ("b1.x", "c?.x")])),
        allow=draw(st.sampled_from([(), (), (), ("a*", "b*"), ("*.x",)])),
        zone=draw(st.sampled_from(["", "", "", "z-a"])),
    )


def _family(name: str) -> set[str]:
    return {"a100": {"a100-40gb", "a100-80gb"}, "h100": {"h100-80gb"}}.get(name, {name})


def satisfies(t: InstanceType, r: InstanceRequest, catalog_has_zones: bool) -> bool:
    """The request's meaning, written out independently of providers.core.selection."""
    if t.arch != r.arch or t.vcpus < r.vcpus or t.memory_mib < r.memory_mib:
        return False
    if r.rdma and not t.rdma:
        return False
    if catalog_has_zones and not t.zones:
        return False
    if r.provisioning not in t.provisioning:
        return False
    if r.zone and t.zones and r.zone not in t.zones:
        return False
    if any(fnmatch.fnmatchcase(t.name, d) for d in r.deny):
        return False
    if r.allow and not any(fnmatch.fnmatchcase(t.name, a) for a in r.allow):
        return False
    wants = bool(r.gpus or r.mig or r.gpu_models or r.gpu_memory_mib)
    if not wants:
        return t.gpu is None
    g = t.gpu
    if g is None:
        return False
    if r.gpu_models and not any(g.model in _family(m) for m in r.gpu_models):
        return False
    memory = g.memory_mib if g.fraction < 1 else max(g.memory_mib, GPU_MODELS[g.model].memory_mib)
    if memory < r.gpu_memory_mib:
        return False
    if g.fraction < 1 and (not r.fractional or r.mig or r.gpus > 1):
        return False
    needed = r.gpus if (r.gpus or r.mig) else 1
    if r.mig:
        extra = min_gpus(g.model, r.mig)
        if extra is None:
            return False
        needed += extra
    return needed <= g.count


@settings(max_examples=150, deadline=None)
@given(catalogs(), requests())
def test_selection_matches_the_meaning_of_the_request(catalog: Catalog, r: InstanceRequest) -> None:
    has_zones = any(t.zones for t in catalog.types)
    satisfying = [t for t in catalog.types if satisfies(t, r, has_zones)]
    selection = select(catalog, r)
    assert sorted(c.name for c in selection.candidates) == sorted(t.name for t in satisfying)
    assert len(selection.rejections) == len(catalog.types) - len(satisfying)
    if not satisfying:
        try:
            _ = selection.selected
        except NoMatch as exc:
            assert str(exc)
        else:
            raise AssertionError("selected a type though none satisfies the request")
        return
    chosen = selection.selected
    assert satisfies(chosen.instance_type, r, has_zones)

    # Every candidate is ranked by a price: the list price, else an estimate from what it carries
    # (providers.core.estimates), never "unknown, so last"; a real price wins a tie with an
    # estimate.
    rates = catalog_gpu_rates(catalog.types)

    def effective(t: InstanceType) -> tuple[float, bool]:
        if t.price_per_hour is not None:
            return round(t.price_per_hour, 2), False
        return round(estimate_price(t, rates=rates), 2), True

    cheapest = min(effective(t) for t in satisfying)
    assert chosen.price_per_hour is not None
    assert (round(chosen.price_per_hour, 2), chosen.price_estimated) == cheapest
    prices = [round(c.price_per_hour or 0, 2) for c in selection.candidates]
    assert prices == sorted(prices)
    for c in selection.candidates:
        assert c.price_estimated == (c.instance_type.price_per_hour is None)
    for candidate in selection.candidates:
        assert len(candidate.reasons) == 2 and all(candidate.reasons)
