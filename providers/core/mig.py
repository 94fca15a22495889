"""MIG profiles per GPU model and the placement packer.

How many GPUs a set of MIG devices needs is decided by placing them with NVIDIA's placement rules
(docs/gpus.md, section 2), never by dividing memory: on a 7-slice GPU 3g+4g fits one GPU,
2x3g+1g does not. A GPU has 8 memory slots (4 on an A30 or RTX PRO 6000); each profile occupies
`memory_slots` contiguous slots from one of its allowed starts, uses `compute_slices` of the GPU's
compute, and at most one "+me" profile fits a GPU (a GPU has one JPEG decoder and one OFA, and
"+me" takes both).

The tables are NVIDIA's MIG user guide ("Supported MIG Profiles"): seven-slice GPUs (A100, H100,
H100 NVL, H100 on GH200, H200, B200, GB200, B300) share one geometry and differ only in names;
four-slice GPUs (A30, RTX PRO 6000 Blackwell Server Edition) have their own rows. The packer
returns the layout (profile -> GPU index, start slot) so device plans can name the very slices
selection counted.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "MIG_PROFILES",
    "MigLayout",
    "MigPlacement",
    "MigProfileSpec",
    "geometry",
    "min_gpus",
    "pack",
    "profiles_for",
]


@dataclass(frozen=True)
class MigProfileSpec:
    """One MIG profile as it exists on one GPU model."""

    name: str  # e.g. "1g.10gb" (the same name differs between GPU models)
    memory_slots: int  # contiguous memory slots it occupies
    compute_slices: int  # compute slices (of the GPU's total) it uses
    max_per_gpu: int  # how many fit one GPU on their own
    starts: tuple[int, ...]  # allowed first memory slot
    media_extensions: bool = False  # "+me": at most one per GPU


@dataclass(frozen=True)
class _Geometry:
    memory_slots: int
    compute_slices: int


_SEVEN = _Geometry(memory_slots=8, compute_slices=7)
_FOUR = _Geometry(memory_slots=4, compute_slices=4)

# Rows of NVIDIA's MIG profile table: (memory slots, compute slices, max per GPU, +me, starts),
# then one name per column (the MIG guide's per-product tables; names follow each part's memory).
_ROWS: tuple[tuple[int, int, int, bool, tuple[int, ...]], ...] = (
    (1, 1, 7, False, (0, 1, 2, 3, 4, 5, 6)),
    (1, 1, 1, True, (0, 1, 2, 3, 4, 5, 6)),
    (2, 1, 4, False, (0, 2, 4, 6)),
    (2, 2, 3, False, (0, 2, 4)),
    (4, 3, 2, False, (0, 4)),
    (4, 4, 1, False, (0,)),
    (8, 7, 1, False, (0,)),
)
_COLUMNS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("a100-40gb",): (
        "1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
    ),
    ("a100-80gb", "h100-80gb"): (
        "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
    ),
    ("h100-nvl",): (
        "1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb",
    ),
    ("h200",): (
        "1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
    ),
    ("b200",): (
        "1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb",
    ),
    # H100 96GB as GH200 carries it
    ("gh200",): (
        "1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb",
    ),
    # GB200 186GB
    ("gb200",): (
        "1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb",
    ),
    # B300 288GB (269 GB usable)
    ("b300",): (
        "1g.34gb", "1g.34gb+me", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb",
    ),
}  # fmt: skip

# Four-slice GPUs: (name, memory slots, compute slices, max per GPU, starts, +me).
_FOUR_SLICE: dict[str, tuple[tuple[str, int, int, int, tuple[int, ...], bool], ...]] = {
    "a30": (
        ("1g.6gb", 1, 1, 4, (0, 1, 2, 3), False),
        ("1g.6gb+me", 1, 1, 1, (0, 1, 2, 3), True),  # R470 and later
        ("2g.12gb", 2, 2, 2, (0, 2), False),
        ("2g.12gb+me", 2, 2, 1, (0, 2), True),  # R525 and later
        ("4g.24gb", 4, 4, 1, (0,), False),
    ),
    # RTX PRO 6000 Blackwell Server Edition 96GB (compute profiles; the +gfx graphics
    # variants are not offered to pods)
    "rtx-pro-6000": (
        ("1g.24gb", 1, 1, 4, (0, 1, 2, 3), False),
        ("1g.24gb+me", 1, 1, 1, (0, 1, 2, 3), True),
        ("2g.48gb", 2, 2, 2, (0, 2), False),
        ("4g.96gb", 4, 4, 1, (0,), False),
    ),
}  # fmt: skip


def _build() -> dict[str, tuple[MigProfileSpec, ...]]:
    table: dict[str, tuple[MigProfileSpec, ...]] = {}
    for models, names in _COLUMNS.items():
        specs = tuple(
            MigProfileSpec(name, slots, compute, most, starts, me)
            for name, (slots, compute, most, me, starts) in zip(names, _ROWS, strict=True)
        )
        for model in models:
            table[model] = specs
    for model, rows in _FOUR_SLICE.items():
        table[model] = tuple(
            MigProfileSpec(name, slots, compute, most, starts, me)
            for name, slots, compute, most, starts, me in rows
        )
    return table


MIG_PROFILES: Mapping[str, tuple[MigProfileSpec, ...]] = _build()
_GEOMETRY: Mapping[str, _Geometry] = {
    m: (_FOUR if m in _FOUR_SLICE else _SEVEN) for m in MIG_PROFILES
}


def geometry(model_id: str) -> tuple[int, int] | None:
    """(memory slots, compute slices) of one GPU of this model; None without a MIG table."""
    found = _GEOMETRY.get(model_id)
    return None if found is None else (found.memory_slots, found.compute_slices)


_BY_NAME: Mapping[str, Mapping[str, MigProfileSpec]] = {
    model: MappingProxyType({p.name: p for p in specs}) for model, specs in MIG_PROFILES.items()
}
_NONE: Mapping[str, MigProfileSpec] = MappingProxyType({})


def profiles_for(model_id: str) -> Mapping[str, MigProfileSpec]:
    """Profile name -> spec on this GPU model (empty when it has no known MIG profiles)."""
    return _BY_NAME.get(model_id, _NONE)


@dataclass(frozen=True)
class MigPlacement:
    """One MIG device: which GPU of the VM and which first memory slot."""

    profile: str
    gpu: int
    start: int


@dataclass(frozen=True)
class MigLayout:
    """Where every requested MIG device goes; `gpus_used` GPUs carry at least one."""

    model: str
    gpus_used: int
    placements: tuple[MigPlacement, ...]

    def per_gpu(self) -> list[list[MigPlacement]]:
        """Placements grouped by GPU index (0..gpus_used-1), each sorted by start slot."""
        groups: list[list[MigPlacement]] = [[] for _ in range(self.gpus_used)]
        for placement in self.placements:
            groups[placement.gpu].append(placement)
        for group in groups:
            group.sort(key=lambda p: p.start)
        return groups


def place_one_gpu(model_id: str, profiles: Mapping[str, int]) -> tuple[tuple[str, int], ...] | None:
    """Starts for a multiset of profiles on one GPU, or None when it does not fit."""
    specs = profiles_for(model_id)
    geometry = _GEOMETRY.get(model_id)
    if geometry is None or any(p not in specs for p in profiles):
        return None
    items = [specs[p] for p, n in profiles.items() for _ in range(n)]
    if sum(s.compute_slices for s in items) > geometry.compute_slices:
        return None
    if sum(s.memory_slots for s in items) > geometry.memory_slots:
        return None
    if sum(1 for s in items if s.media_extensions) > 1:
        return None
    # Largest first: fewer starts, earlier failure.
    items.sort(key=lambda s: (-s.memory_slots, len(s.starts), s.name))
    used = [False] * geometry.memory_slots
    chosen: list[tuple[str, int]] = []

    def search(index: int, min_start: int) -> bool:
        if index == len(items):
            return True
        spec = items[index]
        same_as_previous = index > 0 and items[index - 1] == spec
        for start in spec.starts:
            if same_as_previous and start < min_start:
                continue  # identical items in increasing start order: no symmetric retries
            span = range(start, start + spec.memory_slots)
            if span.stop > geometry.memory_slots or any(used[s] for s in span):
                continue
            for s in span:
                used[s] = True
            chosen.append((spec.name, start))
            nxt = items[index + 1] if index + 1 < len(items) else None
            if search(index + 1, start + 1 if nxt == spec else 0):
                return True
            chosen.pop()
            for s in span:
                used[s] = False
        return False

    return tuple(chosen) if search(0, 0) else None


@functools.lru_cache(maxsize=256)
def _configurations(model_id: str, names: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """Every maximal count vector over `names` that fits one GPU of this model."""
    specs = profiles_for(model_id)
    found: set[tuple[int, ...]] = set()

    def grow(counts: list[int], index: int) -> None:
        if index == len(names):
            found.add(tuple(counts))
            return
        for n in range(specs[names[index]].max_per_gpu, -1, -1):
            counts[index] = n
            trial = {names[i]: counts[i] for i in range(index + 1) if counts[i]}
            if place_one_gpu(model_id, trial) is not None:
                grow(counts, index + 1)
        counts[index] = 0

    grow([0] * len(names), 0)
    vectors = sorted(found, reverse=True)

    def dominated(v: tuple[int, ...]) -> bool:
        return any(w != v and all(a >= b for a, b in zip(w, v, strict=True)) for w in vectors)

    return tuple(v for v in vectors if any(v) and not dominated(v))


def _lower_bound(model_id: str, names: tuple[str, ...], demand: tuple[int, ...]) -> int:
    specs = profiles_for(model_id)
    geometry = _GEOMETRY[model_id]
    memory = sum(specs[n].memory_slots * d for n, d in zip(names, demand, strict=True))
    compute = sum(specs[n].compute_slices * d for n, d in zip(names, demand, strict=True))
    per_profile = max(
        (-(-d // specs[n].max_per_gpu) for n, d in zip(names, demand, strict=True)), default=0
    )
    return max(
        -(-memory // geometry.memory_slots), -(-compute // geometry.compute_slices), per_profile
    )


def _plan(
    model_id: str, names: tuple[str, ...], demand: tuple[int, ...], limit: int
) -> list[tuple[int, ...]] | None:
    """The fewest per-GPU count vectors (at most `limit`) covering `demand`, or None."""
    configs = _configurations(model_id, names)
    failed: set[tuple[int, tuple[int, ...]]] = set()

    def solve(k: int, rest: tuple[int, ...]) -> list[tuple[int, ...]] | None:
        if not any(rest):
            return []
        if k == 0 or (k, rest) in failed or _lower_bound(model_id, names, rest) > k:
            return None
        first = next(i for i, d in enumerate(rest) if d)
        tried: set[tuple[int, ...]] = set()
        for config in configs:
            if not config[first]:
                continue  # some GPU holds the first remaining profile: let it be this one
            take = tuple(min(c, d) for c, d in zip(config, rest, strict=True))
            if take in tried:
                continue
            tried.add(take)
            tail = solve(k - 1, tuple(d - t for d, t in zip(rest, take, strict=True)))
            if tail is not None:
                return [take, *tail]
        failed.add((k, rest))
        return None

    start = _lower_bound(model_id, names, demand)
    for k in range(max(start, 0), limit + 1):
        plan = solve(k, demand)
        if plan is not None:
            return plan
    return None


_MAX_GPUS = 64


@functools.lru_cache(maxsize=1024)
def _pack_cached(
    model_id: str, request: tuple[tuple[str, int], ...], limit: int
) -> MigLayout | None:
    specs = profiles_for(model_id)
    if not request or any(p not in specs or n <= 0 for p, n in request):
        return None
    names = tuple(p for p, _ in request)
    demand = tuple(n for _, n in request)
    plan = _plan(model_id, names, demand, limit)
    if plan is None:
        return None
    placements: list[MigPlacement] = []
    for gpu, counts in enumerate(plan):
        slots = place_one_gpu(model_id, {n: c for n, c in zip(names, counts, strict=True) if c})
        assert slots is not None  # every vector of the plan was checked to fit
        placements.extend(MigPlacement(name, gpu, start) for name, start in slots)
    placements.sort(key=lambda p: (p.gpu, p.start))
    return MigLayout(model=model_id, gpus_used=len(plan), placements=tuple(placements))


def _key(profiles: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(profiles.items()))


def pack(model_id: str, profiles: Mapping[str, int], gpus: int | None = None) -> MigLayout | None:
    """Place the MIG devices on the fewest GPUs (at most `gpus` when given); None if impossible.

    None too when the model lacks one of the profiles or the request is empty.
    """
    limit = _MAX_GPUS if gpus is None else min(gpus, _MAX_GPUS)
    if limit <= 0:
        return None
    return _pack_cached(model_id, _key(profiles), limit)


def min_gpus(model_id: str, profiles: Mapping[str, int]) -> int | None:
    """How many GPUs of this model the MIG devices need (None: a profile is not offered)."""
    layout = pack(model_id, profiles)
    return None if layout is None else layout.gpus_used
