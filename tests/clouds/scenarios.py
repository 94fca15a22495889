"""Steps each cloud's lifecycle tests take alike: a pod VM request, create/delete churn, a sweep."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from adaptor.hypervisor.gc import GarbageCollector
from providers.core.base import Provider, VMCandidate, VMSpec
from providers.core.errors import ProviderError


def vm_spec(n: int, **fields: Any) -> VMSpec:
    """Sandbox `n`'s request (its id is n in 64 hex digits); `fields` set or override the rest
    (candidates may be given as instance type names)."""
    base: dict[str, Any] = {
        "sandbox_id": f"{n:064x}",
        "pod_namespace": "ml",
        "pod_name": f"train-{n}",
        "user_data": "#cloud-config\nwrite_files: []\n",
    }
    merged = {**base, **fields}
    merged["candidates"] = tuple(
        VMCandidate(c) if isinstance(c, str) else c for c in merged.get("candidates", ())
    )
    return VMSpec(**merged)


async def create_delete_cycles(provider: Provider, specs: Iterable[VMSpec]) -> int:
    """Create each VM and delete what was made (up to five tries); how many creates succeeded."""
    created = 0
    for spec in specs:
        try:
            vm = await provider.create(spec)
        except ProviderError:
            continue
        created += 1
        for _ in range(5):
            try:
                await provider.delete(vm.id)
                break
            except ProviderError:
                continue
    return created


async def sweep_unknown(provider: Provider, owner: str) -> None:
    """One garbage-collector sweep that knows no sandbox: every VM `owner` still has is deleted."""

    async def known() -> set[str]:
        return set()

    await GarbageCollector(provider, owner, known).sweep()
