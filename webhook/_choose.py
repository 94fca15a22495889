"""Which alternative serves each DRA request: the combination whose pod VM ranks first.

A DRA request usually matches more than one kind of device (several MIG profiles, a GPU share,
whole GPUs of several models); the scheduler of a real cluster would take whichever device is
free, and for a peer pod every one of them means a different VM. So each combination of
alternatives is turned into the pod's VM-level intent and run through instance selection, and
the combination whose chosen type ranks first (price, then size: `Candidate.rank`) wins; a tie
keeps the preferred alternatives (listed first). Combinations whose claims contradict each other
(two GPU models, MIG devices that cannot share a parent) are skipped.

A `firstAvailable` request is served by its first subrequest that leads to a type at all, as
Kubernetes allocates the first subrequest it can: its alternatives rank before any of a later
subrequest's, price only deciding within one subrequest. A subrequest whose devices exist only on
types the pod cannot run on (another architecture, not sold the way the pod buys, confidential)
falls through to the next.

Each request's rank comes from the catalog's view (`webhook._catalog_view`), which remembers it:
the same pods recur (every replica of a Deployment), so a repeated admission costs the building
of its requests, not their selection.

Many requests with many alternatives each are not enumerated: past `EXHAUSTIVE` combinations one
request at a time is improved with the others held (a pass in request order), which finds the
cheapest alternative of each independent request.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from providers.core.errors import InvalidRequest
from providers.core.request import InstanceRequest
from webhook._catalog_view import CatalogView, Rank
from webhook._dra import ClaimDenied, ClaimUnit, Translation

__all__ = ["EXHAUSTIVE", "choose"]

EXHAUSTIVE = 64

Key = tuple[tuple[int, ...], Rank | None]  # firstAvailable tiers per request, then the rank


def choose(
    translation: Translation,
    view: CatalogView,
    request_for: Callable[[list[ClaimUnit]], InstanceRequest],
) -> list[ClaimUnit]:
    """The claim units of the best combination (ClaimDenied/InvalidRequest if none is valid).

    `request_for` turns the pod's claim units into the selection request (with the pod's own
    extended resources and CPU/memory); it raises InvalidRequest for a contradictory pod.
    """
    space = view.space
    if all(len(r.alternatives) == 1 for r in translation.requests):
        return translation.first_valid(space)
    cache: dict[tuple[int, ...], tuple[Key, list[ClaimUnit]] | Exception] = {}

    def score(picks: tuple[int, ...]) -> tuple[Key, list[ClaimUnit]] | Exception:
        found = cache.get(picks)
        if found is not None:
            return found
        chosen = [r.alternatives[i] for r, i in zip(translation.requests, picks, strict=True)]
        result: tuple[Key, list[ClaimUnit]] | Exception
        try:
            units = translation.resolve(chosen, space)
            request = request_for(units)
        except InvalidRequest as exc:
            result = exc
        else:
            tiers = tuple(u.tier for u in chosen)
            result = ((tiers, view.rank(request)), units)
        cache[picks] = result
        return result

    sizes = [len(r.alternatives) for r in translation.requests]
    if translation.combinations <= EXHAUSTIVE:
        order: Sequence[tuple[int, ...]] = list(itertools.product(*(range(n) for n in sizes)))
        return _noted(translation, _best(order, score))
    picks = [0] * len(sizes)
    for position, size in enumerate(sizes):
        trials = []
        for i in range(size):
            trial = list(picks)
            trial[position] = i
            trials.append(tuple(trial))
        best = _best_index(trials, score)
        if best is not None:
            picks = list(trials[best])
    return _noted(translation, _best([tuple(picks)], score))


def _noted(translation: Translation, units: list[ClaimUnit]) -> list[ClaimUnit]:
    """The chosen units, with a warning for each firstAvailable request that fell through."""
    for unit in units:
        if unit.tier > 0:
            translation.warnings.append(
                f"claim {unit.claim} request {unit.request}: the earlier firstAvailable "
                f"subrequests match no type this pod can run on; {unit.subrequest} serves it"
            )
    return units


def _best_index(
    order: Sequence[tuple[int, ...]],
    score: Callable[[tuple[int, ...]], tuple[Key, list[ClaimUnit]] | Exception],
) -> int | None:
    best: tuple[tuple[tuple[int, ...], Rank], int] | None = None
    fallback: int | None = None
    for index, picks in enumerate(order):
        result = score(picks)
        if isinstance(result, Exception):
            continue
        (tiers, rank), _ = result
        if fallback is None:
            fallback = index
        if rank is not None and (best is None or (tiers, rank) < best[0]):
            best = ((tiers, rank), index)
    return best[1] if best is not None else fallback


def _best(
    order: Sequence[tuple[int, ...]],
    score: Callable[[tuple[int, ...]], tuple[Key, list[ClaimUnit]] | Exception],
) -> list[ClaimUnit]:
    index = _best_index(order, score)
    if index is None:  # every combination contradicts itself: say why the first one does
        first = score(order[0])
        assert isinstance(first, Exception)
        if isinstance(first, InvalidRequest):
            raise first
        raise ClaimDenied(str(first))
    result = score(order[index])
    assert not isinstance(result, Exception)
    return result[1]
