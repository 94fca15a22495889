"""Warm pools: stopped VMs that already booted once and pulled their images, adopted by StartVM
(docs/warm-pools.md). `WarmPool` keeps them; `match` is the rule StartVM and `peerpods plan`
share."""

from adaptor.warmpool._keeper import Sources, WarmPool
from adaptor.warmpool._model import Match, Pool, Slot, SlotState, WarmConfig, match
from adaptor.warmpool._record import CLAIMS, MEMBERS, Member, PoolRecord

__all__ = [
    "CLAIMS",
    "MEMBERS",
    "Match",
    "Member",
    "Pool",
    "PoolRecord",
    "Slot",
    "SlotState",
    "Sources",
    "WarmConfig",
    "WarmPool",
    "match",
]
