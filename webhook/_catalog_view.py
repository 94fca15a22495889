"""What admission derives from one catalog, built once per catalog and owned by whoever holds it.

The admission holds the view of the catalog in use and builds a new one when its catalog source
returns another catalog (a reloaded snapshot): the selector (the catalog's selection index), the
virtual DRA devices selectors are evaluated against (built on first use: a pod without claims
never needs them), and each DRA request's rank, remembered because the same pods recur (every
replica of a Deployment), so a repeated admission costs the building of its requests, not their
selection. Nothing of it outlives the view.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from providers.core.catalog import Catalog
from providers.core.errors import NoMatch
from providers.core.request import InstanceRequest
from providers.core.selection import Selector
from webhook._devices import DeviceSpace

__all__ = ["REMEMBERED_RANKS", "CatalogView", "Rank"]

Rank = tuple[float, int, int, int, int, int, str]

REMEMBERED_RANKS = 4096  # request ranks kept per view, least recently used dropped first


class CatalogView:
    """One catalog with its selector, its device space and the ranks of requests seen."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.selector = Selector(catalog)
        self._space: DeviceSpace | None = None
        self._ranks: OrderedDict[str, Rank | None] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def space(self) -> DeviceSpace:
        """The catalog's virtual devices, built on first use."""
        with self._lock:
            if self._space is None:
                self._space = DeviceSpace(self.catalog)
            return self._space

    def rank(self, request: InstanceRequest) -> Rank | None:
        """The rank of the type selection picks for `request` (None: no type), remembered."""
        key = request.model_dump_json()
        with self._lock:
            if key in self._ranks:
                self._ranks.move_to_end(key)
                return self._ranks[key]
        try:
            rank: Rank | None = self.selector.select(request).selected.rank
        except NoMatch:
            rank = None
        with self._lock:
            self._ranks[key] = rank
            if len(self._ranks) > REMEMBERED_RANKS:
                self._ranks.popitem(last=False)
        return rank

    @property
    def ranks_remembered(self) -> int:
        """How many request ranks this view holds."""
        with self._lock:
            return len(self._ranks)
