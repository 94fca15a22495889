"""What an admission derives and the limits it works under belong to its objects, never to the
process: two admissions in one process each apply their own CEL time limit, keep their own view
of the catalog (selector, device space, DRA ranks) and seal under their own key."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import yaml

from providers.core.catalog import Catalog
from providers.core.contract import SEAL
from tests.webhook.conftest import container, pod, review
from tests.webhook.test_dra import CLASSES, exactly, template
from webhook import Admission, CatalogView, MemoryResolver, SelectorLimits, Settings, mutate_pod
from webhook._reviews import parse_review

# past the deadline check (every 256 metered steps) on each device, far under the cost limit
SLOW = "[" + ",".join(map(str, range(20))) + "].all(x, x >= 0)"


def _claim_pod() -> dict[str, Any]:
    main = container("main")
    main["resources"] = {"claims": [{"name": "c"}]}
    return pod(main, resourceClaims=[{"name": "c", "resourceClaimTemplateName": "slow"}])


def _admission(catalog: Catalog, seconds: float) -> Admission:
    objects = [
        *yaml.safe_load_all(CLASSES),
        template("slow", [exactly("gpu", "gpu.nvidia.com", SLOW)]),
    ]
    return Admission(
        Settings(), lambda: catalog, MemoryResolver(objects), cel_timeout_seconds=seconds
    )


def test_two_admissions_apply_their_own_cel_limits_side_by_side(catalog: Catalog) -> None:
    strict, lenient = _admission(catalog, 5.0), _admission(catalog, 600.0)
    answers: dict[str, dict[str, Any]] = {}

    def decide(name: str, admission: Admission) -> None:
        arrived = time.monotonic() - 30  # queued for 30 s: past the strict limit only
        body = review(_claim_pod())
        answers[name] = admission.decide(parse_review(json.dumps(body).encode()), arrived)[
            "response"
        ]

    threads = [
        threading.Thread(target=decide, args=(f"{name}{i}", admission))
        for i in range(2)
        for name, admission in (("strict", strict), ("lenient", lenient))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(2):
        assert answers[f"lenient{i}"]["allowed"] is True, answers[f"lenient{i}"]
        denied = answers[f"strict{i}"]
        assert denied["allowed"] is False
        assert "CEL time limit of 5s per admission" in denied["status"]["message"]


def test_selector_limits_are_passed_not_ambient(catalog: Catalog) -> None:
    space = CatalogView(catalog).space
    selectors = [("selector 1", SLOW)]
    late = SelectorLimits.starting(None, 1.0, started=time.monotonic() - 10)
    roomy = SelectorLimits.starting(None, 600.0)
    try:
        space.match(selectors, late)
        raise AssertionError("a selector past its deadline must be refused")
    except Exception as exc:
        assert "did not finish within the CEL time limit of 1s" in str(exc)
    match, error = space.match(selectors, roomy)
    assert match.devices and not error
    assert space.match(selectors)[0].devices == match.devices  # no limits: none given


def test_each_admission_holds_its_own_view_of_its_catalog(catalog: Catalog) -> None:
    first, second = _admission(catalog, 600.0), _admission(catalog, 600.0)
    first.decide(parse_review(json.dumps(review(_claim_pod())).encode()))
    mine, yours = first.view(), second.view()
    assert mine is not None and yours is not None and mine is not yours
    assert mine is first.view()  # built once for the catalog in use
    assert mine.selector is not yours.selector and mine.space is not yours.space
    smaller = Catalog(**{**dict(catalog), "types": catalog.types[:3]})
    swapped = Admission(Settings(), lambda: smaller)
    view = swapped.view()
    assert view is not None and view.catalog is smaller and len(view.space.catalog.types) == 3


def test_each_settings_seals_under_its_own_key(catalog: Catalog) -> None:
    gpu = container("main", limits={"nvidia.com/gpu": 1})
    ours, theirs = Settings(), Settings()
    sealed = mutate_pod(pod(gpu), catalog=catalog, settings=ours, namespace="default")
    seal = sealed.pod["metadata"]["annotations"][SEAL]
    assert mutate_pod(sealed.pod, catalog=catalog, settings=ours, namespace="default").patch == []
    again = mutate_pod(sealed.pod, catalog=catalog, settings=theirs, namespace="default")
    # not theirs: translated anew from what the pod asks for now, never kept as sealed
    assert again.patch and again.pod["metadata"]["annotations"].get(SEAL) != seal
