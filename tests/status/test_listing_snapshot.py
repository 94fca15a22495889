"""A flood of `GET /v1/sandboxes` reads the store (the state thread that CreateVM and StopVM
wait on) once a second, whatever the number of requests, and past 20 listings a second the
rest are refused (429, Retry-After) instead of each costing the event loop the whole list."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from adaptor.state import SandboxRecord, StateStore
from adaptor.status import DeviceBook, build_app
from adaptor.status.app import LISTING_SECONDS, LISTINGS_PER_SECOND


class CountingStore:
    """The state store, counting the listings read from it."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.reads = 0

    async def records(self) -> list[SandboxRecord]:
        self.reads += 1
        return await self.store.records()

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        return await self.store.get(sandbox_id)

    async def quarantined(self) -> dict[str, str]:
        return await self.store.quarantined()


async def test_listings_come_from_a_snapshot_and_are_rate_limited(tmp_path: Path) -> None:
    store = await StateStore.open(tmp_path)
    counting = CountingStore(store)
    app = build_app(counting, DeviceBook())
    transport = httpx.ASGITransport(app=app)
    try:
        for i in range(200):
            await store.put(SandboxRecord(id=f"sb{i:03d}", pod_namespace="ns", pod_name="p"))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            answers = await asyncio.gather(*(http.get("/v1/sandboxes") for _ in range(60)))
            codes = [a.status_code for a in answers]
            assert codes.count(200) == LISTINGS_PER_SECOND
            assert codes.count(429) == 60 - LISTINGS_PER_SECOND
            refused = next(a for a in answers if a.status_code == 429)
            assert refused.headers["Retry-After"] == "1"
            assert refused.json()["code"] == "too_many_requests"
            listed = next(a for a in answers if a.status_code == 200).json()["sandboxes"]
            assert len(listed) == 200
            assert counting.reads == 1  # one read of the store for all of them
            await store.put(SandboxRecord(id="late", pod_namespace="ns", pod_name="p"))
            await asyncio.sleep(LISTING_SECONDS + 0.1)  # the snapshot ages, the bucket refills
            fresh = (await http.get("/v1/sandboxes")).json()["sandboxes"]
            assert "late" in {s["id"] for s in fresh}
            assert counting.reads == 2
    finally:
        await store.close()
