"""The state store: records and leases survive reopening; leases are exclusive."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from adaptor.state import SandboxRecord, SandboxState, StateError, StateStore
from providers.core.base import Instance


async def test_records_round_trip_and_survive_reopen(tmp_path: Path) -> None:
    store = await StateStore.open(tmp_path / "state")
    instance = Instance(
        "i-1", "vm", ("10.1.2.3",), "g5.xlarge", "us-east-1a", port=9, tags={"a": "b"}
    )
    record = SandboxRecord(
        id="sb1", pod_namespace="ns", pod_name="pod", annotations={"k": "v"}, agent_socket="/x"
    )
    stored = await store.put(record)
    assert stored.created_at > 0
    await store.put(stored.evolve(state=SandboxState.RUNNING, instance=instance))
    await store.close()
    await store.close()  # idempotent

    again = await StateStore.open(tmp_path / "state")
    got = await again.get("sb1")
    assert got is not None
    assert got.state is SandboxState.RUNNING
    assert got.instance == instance
    assert got.annotations == {"k": "v"}
    assert got.created_at == stored.created_at
    assert [r.id for r in await again.records()] == ["sb1"]
    await again.delete("sb1")
    assert await again.get("sb1") is None
    await again.close()
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700


async def test_write_is_visible_to_another_connection_at_once(tmp_path: Path) -> None:
    store = await StateStore.open(tmp_path)
    await store.put(SandboxRecord(id="sb2", pod_namespace="ns", pod_name="p"))
    with sqlite3.connect(tmp_path / "sandboxes.db") as other:
        assert other.execute("SELECT state FROM sandboxes WHERE id='sb2'").fetchone() == (
            "created",
        )
    await store.close()


async def test_leases_are_exclusive_idempotent_and_durable(tmp_path: Path) -> None:
    store = await StateStore.open(tmp_path)
    pool = ["a:1", "b:2"]
    assert await store.acquire_lease("static", "s1", pool) == "a:1"
    assert await store.acquire_lease("static", "s1", pool) == "a:1"
    assert await store.acquire_lease("static", "s2", pool) == "b:2"
    assert await store.acquire_lease("static", "s3", pool) is None
    await store.close()
    store = await StateStore.open(tmp_path)
    assert await store.leases("static") == {"a:1": "s1", "b:2": "s2"}
    await store.release_lease("static", "a:1")
    assert await store.acquire_lease("static", "s3", pool) == "a:1"
    await store.delete("s2")  # forgetting a sandbox frees its lease
    assert await store.leases("static") == {"a:1": "s3"}
    await store.close()


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "sandboxes.db") as db:
        db.execute("PRAGMA user_version=99")
    with pytest.raises(StateError, match="newer"):
        await StateStore.open(tmp_path)


async def test_unwritable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StateError, match="state"):
        await StateStore.open(blocker / "state")


async def test_schema_1_database_gains_pod_network_column(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "sandboxes.db")
    db.executescript(
        """
        CREATE TABLE sandboxes (id TEXT PRIMARY KEY, pod_namespace TEXT NOT NULL,
            pod_name TEXT NOT NULL, annotations TEXT NOT NULL, network_namespace TEXT NOT NULL,
            agent_socket TEXT NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL, instance TEXT,
            created_at REAL NOT NULL, updated_at REAL NOT NULL,
            device_plan TEXT NOT NULL DEFAULT '');
        INSERT INTO sandboxes VALUES ('old','ns','p','{}','','/s','running','',NULL,1,1,'');
        PRAGMA user_version=1;
        """
    )
    db.close()
    store = await StateStore.open(tmp_path)
    try:
        old = await store.get("old")
        assert old is not None and old.pod_network == ""
        await store.put(old.evolve(pod_network='{"v": 1}'))
        again = await store.get("old")
        assert again is not None and again.pod_network == '{"v": 1}'
    finally:
        await store.close()
