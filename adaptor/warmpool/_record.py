"""The pool's durable record, in the state store beside the sandboxes.

Two lease tables of the store hold it: MEMBERS names each slot with what it holds (written
before its VM is launched, so a pool VM whose slot is not recorded is an orphan), and CLAIMS
names the sandbox a slot was handed to (written before the VM is touched for it, and taken by
one sandbox only: the store's lease is one transaction, so no slot is ever adopted twice, not
even across a crash).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from adaptor.state import StateStore

MEMBERS = "warm-pool"
CLAIMS = "warm-pool-claim"


@dataclass(frozen=True)
class Member:
    """A recorded slot: its pool's type and zone, and the image it launches."""

    instance_type: str
    zone: str
    image: str

    def to_json(self) -> str:
        return json.dumps(
            {"type": self.instance_type, "zone": self.zone, "image": self.image}, sort_keys=True
        )

    @classmethod
    def from_json(cls, text: str) -> Member:
        data = json.loads(text)
        return cls(str(data["type"]), str(data.get("zone", "")), str(data.get("image", "")))


class PoolRecord:
    """The slots and claims of this node's warm pools."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    async def add(self, slot: str, member: Member) -> None:
        """Record a slot before its VM is launched."""
        await self.store.acquire_lease(MEMBERS, member.to_json(), [slot])

    async def members(self) -> dict[str, Member]:
        """slot -> what it holds; a member that cannot be read is left out (its VM is then an
        orphan, and deleted)."""
        found: dict[str, Member] = {}
        for slot, text in (await self.store.leases(MEMBERS)).items():
            try:
                found[slot] = Member.from_json(text)
            except (ValueError, KeyError, TypeError):
                continue
        return found

    async def claim(self, slot: str, sandbox_id: str) -> bool:
        """Hand the slot to the sandbox; False when another sandbox holds it."""
        return await self.store.acquire_lease(CLAIMS, sandbox_id, [slot]) == slot

    async def claims(self) -> dict[str, str]:
        """slot -> the sandbox it was handed to."""
        return await self.store.leases(CLAIMS)

    async def remove(self, slot: str) -> None:
        """Forget a slot and its claim (its VM is deleted, or a sandbox's now)."""
        await self.store.release_lease(CLAIMS, slot)
        await self.store.release_lease(MEMBERS, slot)
