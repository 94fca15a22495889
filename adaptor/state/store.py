"""Durable sandbox state in SQLite under `--state-dir`.

Every write is committed before the awaiting call returns, so whatever the daemon told Kata
survives `kill -9`. All SQLite work runs on one dedicated thread that owns the connection
(adaptor.state.thread): the event loop never blocks on disk, and writes are serialized without
locks.

The journal is a write-ahead log with synchronous=NORMAL: a commit is in the kernel's page cache
when it returns, and only a checkpoint waits for the disk. A process crash (kill -9, the OOM
killer) loses nothing. A power loss or kernel crash may lose the last commits, never the
database's consistency: the log replays a prefix of them, as if the daemon had stopped a moment
earlier. Nothing of a sandbox outlives that on the node (the shims and pods die with it); what
the lost commits described in the cloud is a VM tagged with the node's owner id, which the
orphan sweep deletes (adaptor.hypervisor.gc). synchronous=FULL would wait for the disk at every
commit instead (about eight per sandbox's lifecycle), milliseconds each on one thread shared
by every sandbox, which at a thousand sandboxes made that thread the queue StartVM waited in.

A row that cannot be read back (bad JSON, an unknown state, a malformed instance: a bug of an older
build, or a disk that lied) is quarantined, never fatal: it is logged once by id, left in place
for an operator, reported by `quarantined()` (the status API shows it as such), and skipped by
`records()`, so every valid sandbox of the node is still served. `get()` of a quarantined id
raises `QuarantinedRecord`. The JSON columns the layers above own (`device_plan`, `pod_network`)
are checked with the parsers they hand to `open`, so a wrongly typed field in one is
quarantined the same way.

The database files are the adaptor's alone (they hold what each pod VM was told): created 0600
in a 0700 directory, and narrowed to 0600 when an older build left them wider.

Besides sandboxes the store keeps endpoint leases for pool providers (`static`): which endpoint a
sandbox holds, so one endpoint serves one sandbox at a time across restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from adaptor.state.records import (
    SandboxRecord,
    SandboxState,
    instance_from_dict,
    instance_to_dict,
)
from adaptor.state.thread import StateThread
from providers.core.errors import PeerpodsError

T = TypeVar("T")

log = logging.getLogger(__name__)

DB_NAME = "sandboxes.db"
# SQLite's companions of the database file (WAL mode); it creates them with the file's mode.
_COMPANIONS = ("-wal", "-shm", "-journal")
# The JSON columns whose content the layers above parse (see `StateStore.open`).
CHECKED_COLUMNS = ("device_plan", "pod_network")
SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    pod_namespace TEXT NOT NULL,
    pod_name TEXT NOT NULL,
    annotations TEXT NOT NULL,
    network_namespace TEXT NOT NULL,
    agent_socket TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL,
    instance TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    device_plan TEXT NOT NULL DEFAULT '',
    pod_network TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS leases (
    pool TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    PRIMARY KEY (pool, endpoint)
);
"""

_COLUMNS = (
    "id",
    "pod_namespace",
    "pod_name",
    "annotations",
    "network_namespace",
    "agent_socket",
    "state",
    "reason",
    "instance",
    "created_at",
    "updated_at",
    "device_plan",
    "pod_network",
)
# A record written over its row in place: INSERT OR REPLACE would delete the row and insert it
# anew, changing both the table and its primary key index (about five times the CPU, and the
# write-ahead log pages, of an update in place).
_UPSERT = (
    f"INSERT INTO sandboxes ({', '.join(_COLUMNS)}) VALUES ({','.join('?' * len(_COLUMNS))}) "
    f"ON CONFLICT(id) DO UPDATE SET {', '.join(f'{c}=excluded.{c}' for c in _COLUMNS[1:])}"
)


class StateError(PeerpodsError):
    """The state database cannot be opened or written."""


class QuarantinedRecord(StateError):
    """A sandbox whose stored record cannot be read (it is kept aside, not served)."""


def own_directory(directory: Path) -> None:
    """Narrow the state directory to 0700: it may exist already, wider (a hostPath volume of
    type DirectoryOrCreate is made 0755), and it holds the CA key and every sandbox's record.
    A symbolic link or another user's directory is refused (blocking)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise StateError(f"state directory {directory}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise StateError(
                f"state directory {directory} belongs to uid {info.st_uid}, not {os.geteuid()}"
            )
        if info.st_mode & 0o077:
            log.warning(
                "state directory %s was mode %o; narrowed to 0700", directory, info.st_mode & 0o777
            )
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


class StateStore:
    """Sandbox records and endpoint leases; open with `await StateStore.open(dir)`."""

    def __init__(
        self,
        path: Path,
        thread: StateThread,
        checks: Mapping[str, Callable[[str], object]] | None = None,
    ) -> None:
        self.path = path
        self._thread = thread
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._quarantined: dict[str, str] = {}  # id -> why its row cannot be read
        self._checks = dict(checks or {})
        # (id, column) -> the value of a checked column last found valid: the same value read
        # again (every read of a sandbox, every listing) is not parsed again
        self._valid: dict[tuple[str, str], str] = {}

    @classmethod
    async def open(
        cls,
        state_dir: str | os.PathLike[str],
        *,
        checks: Mapping[str, Callable[[str], object]] | None = None,
    ) -> StateStore:
        """Create the directory (mode 0700) and database (0600) if needed, and check the schema.

        `checks`: a parser per JSON column of CHECKED_COLUMNS, called on every non-empty value
        read; a ValueError, TypeError, KeyError or PeerpodsError from one quarantines the row.
        """
        unknown = set(checks or {}) - set(CHECKED_COLUMNS)
        if unknown:
            raise ValueError(f"no checked column {', '.join(sorted(unknown))}")
        directory = Path(state_dir)
        thread = StateThread()
        store = cls(directory / DB_NAME, thread, checks)
        try:
            await store._run(store._open_sync)
        except BaseException:
            await asyncio.to_thread(thread.stop)
            raise
        return store

    async def close(self) -> None:
        """Close the connection and stop the worker thread."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._run(self._close_sync)
        finally:
            await asyncio.to_thread(self._thread.stop)

    # --- sandboxes -------------------------------------------------------------------------------

    async def put(self, record: SandboxRecord) -> SandboxRecord:
        """Insert or replace a record; durable when this returns. Returns it as stored."""
        now = time.time()
        stored = record.evolve(created_at=record.created_at or now, updated_at=now)
        await self._run(self._put_sync, stored)
        return stored

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        """The record for `sandbox_id`, or None."""
        return await self._run(self._get_sync, sandbox_id)

    async def records(self) -> list[SandboxRecord]:
        """Every record, oldest first (a status API lists these)."""
        return await self._run(self._list_sync)

    async def quarantined(self) -> dict[str, str]:
        """id -> reason for every stored row that cannot be read (rescanned on each call)."""
        await self._run(self._list_sync)
        return dict(self._quarantined)

    async def delete(self, sandbox_id: str) -> None:
        """Forget a sandbox (and any lease it holds)."""
        await self._run(self._delete_sync, sandbox_id)

    async def set_state(self, sandbox_id: str, state: SandboxState, reason: str) -> bool:
        """Change only a record's state and reason (nothing else of it is overwritten, so a
        concurrent step's writes are kept); False when there is no such record."""
        return await self._run(self._set_state_sync, sandbox_id, state, reason, time.time())

    # --- endpoint leases -------------------------------------------------------------------------

    async def acquire_lease(
        self, pool: str, sandbox_id: str, endpoints: Sequence[str]
    ) -> str | None:
        """The endpoint `sandbox_id` holds in `pool`, leasing the first free one if it holds none.

        None when every endpoint is leased to another sandbox.
        """
        return await self._run(self._acquire_sync, pool, sandbox_id, tuple(endpoints))

    async def release_lease(self, pool: str, endpoint: str) -> None:
        """Free `endpoint` for the next sandbox."""
        await self._run(self._release_sync, pool, endpoint)

    async def leases(self, pool: str) -> dict[str, str]:
        """endpoint -> sandbox id for every leased endpoint of `pool`."""
        return await self._run(self._leases_sync, pool)

    # --- the worker thread -----------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await self._thread.call(fn, *args)
        except sqlite3.Error as exc:
            raise StateError(f"state database {self.path}: {exc}") from exc

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StateError("state database is closed")
        return self._conn

    def _open_sync(self) -> None:
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"cannot create state directory {self.path.parent}: {exc}") from exc
        own_directory(self.path.parent)
        self._own_files()
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # why: the module's docstring
            conn.execute("PRAGMA busy_timeout=5000")
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StateError(
                    f"state database {self.path} has schema {version}, newer than this build "
                    f"({SCHEMA_VERSION})"
                )
            conn.executescript(_SCHEMA)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(sandboxes)")}
            if "pod_network" not in columns:
                # Schema 1 (no pod networks): every existing sandbox has none.
                conn.execute(
                    "ALTER TABLE sandboxes ADD COLUMN pod_network TEXT NOT NULL DEFAULT ''"
                )
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _own_files(self) -> None:
        """The database file exists with mode 0600 before SQLite opens it (SQLite would create
        it 0644, and its WAL and shared-memory files take the database file's mode)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
            for suffix in _COMPANIONS:
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(f"{self.path}{suffix}", 0o600)
        except OSError as exc:
            raise StateError(f"cannot create state database {self.path}: {exc}") from exc

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _put_sync(self, record: SandboxRecord) -> None:
        self._db().execute(
            _UPSERT,
            (
                record.id,
                record.pod_namespace,
                record.pod_name,
                json.dumps(dict(record.annotations), sort_keys=True),
                record.network_namespace,
                record.agent_socket,
                record.state.value,
                record.reason,
                json.dumps(instance_to_dict(record.instance)) if record.instance else None,
                record.created_at,
                record.updated_at,
                record.device_plan,
                record.pod_network,
            ),
        )

    def _parse(self, row: tuple[Any, ...]) -> SandboxRecord | None:
        """The record of a row, or None after quarantining it."""
        sandbox_id = str(row[0])
        try:
            record = self._row(row)
            for column, check in self._checks.items():
                value = getattr(record, column)
                if value and self._valid.get((sandbox_id, column)) != value:
                    check(value)
                    self._valid[sandbox_id, column] = value
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, PeerpodsError) as exc:
            # ValueError covers bad JSON, an unknown state and a failed validation
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if sandbox_id not in self._quarantined:
                log.error("state: sandbox %r quarantined, its record is unreadable: %s",
                          sandbox_id, reason)  # fmt: skip
            self._quarantined[sandbox_id] = reason[:300]
            self._forget_valid(sandbox_id)
            return None
        self._quarantined.pop(sandbox_id, None)
        return record

    @staticmethod
    def _row(row: tuple[Any, ...]) -> SandboxRecord:
        annotations = json.loads(row[3])
        if not isinstance(annotations, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
        ):
            raise ValueError("annotations are not a map of strings")
        texts = (row[0], row[1], row[2], row[4], row[5], row[7], row[11], row[12])
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("a text column holds another type")
        for name, blob in (("device plan", row[11]), ("pod network", row[12])):
            if blob and not isinstance(json.loads(blob), dict):
                raise ValueError(f"the {name} is not a JSON object")
        return SandboxRecord(
            id=row[0],
            pod_namespace=row[1],
            pod_name=row[2],
            annotations=annotations,
            network_namespace=row[4],
            agent_socket=row[5],
            state=SandboxState(row[6]),
            reason=row[7],
            instance=instance_from_dict(json.loads(row[8])) if row[8] else None,
            created_at=row[9],
            updated_at=row[10],
            device_plan=row[11],
            pod_network=row[12],
        )

    def _get_sync(self, sandbox_id: str) -> SandboxRecord | None:
        row = self._db().execute("SELECT * FROM sandboxes WHERE id=?", (sandbox_id,)).fetchone()
        if not row:
            self._quarantined.pop(sandbox_id, None)
            self._forget_valid(sandbox_id)
            return None
        record = self._parse(row)
        if record is None:
            raise QuarantinedRecord(
                f"the stored record of sandbox {sandbox_id!r} is unreadable (quarantined): "
                f"{self._quarantined[sandbox_id]}"
            )
        return record

    def _list_sync(self) -> list[SandboxRecord]:
        rows = self._db().execute("SELECT * FROM sandboxes ORDER BY created_at, id").fetchall()
        seen = {str(r[0]) for r in rows}
        for gone in set(self._quarantined) - seen:
            del self._quarantined[gone]
        for key in [key for key in self._valid if key[0] not in seen]:
            del self._valid[key]
        return [record for r in rows if (record := self._parse(r)) is not None]

    def _set_state_sync(
        self, sandbox_id: str, state: SandboxState, reason: str, now: float
    ) -> bool:
        cursor = self._db().execute(
            "UPDATE sandboxes SET state=?, reason=?, updated_at=? WHERE id=?",
            (state.value, reason, now, sandbox_id),
        )
        return cursor.rowcount > 0

    def _delete_sync(self, sandbox_id: str) -> None:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM sandboxes WHERE id=?", (sandbox_id,))
            db.execute("DELETE FROM leases WHERE sandbox_id=?", (sandbox_id,))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        self._quarantined.pop(sandbox_id, None)
        self._forget_valid(sandbox_id)

    def _forget_valid(self, sandbox_id: str) -> None:
        for column in self._checks:
            self._valid.pop((sandbox_id, column), None)

    def _acquire_sync(self, pool: str, sandbox_id: str, endpoints: tuple[str, ...]) -> str | None:
        """The sandbox's own lease, else the first free endpoint, each asked by its key: the
        pool's other leases (a thousand VNIs) are not read, and a free one is mostly first."""
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            mine = db.execute(
                "SELECT endpoint FROM leases WHERE pool=? AND sandbox_id=?", (pool, sandbox_id)
            ).fetchall()
            chosen = next((str(e) for (e,) in mine if e in endpoints), None)
            if chosen is None:
                taken = "SELECT 1 FROM leases WHERE pool=? AND endpoint=?"
                chosen = next(
                    (e for e in endpoints if db.execute(taken, (pool, e)).fetchone() is None),
                    None,
                )
                if chosen is not None:
                    db.execute("INSERT INTO leases VALUES (?,?,?)", (pool, chosen, sandbox_id))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return chosen

    def _release_sync(self, pool: str, endpoint: str) -> None:
        self._db().execute("DELETE FROM leases WHERE pool=? AND endpoint=?", (pool, endpoint))

    def _leases_sync(self, pool: str) -> dict[str, str]:
        rows = (
            self._db()
            .execute(
                "SELECT endpoint, sandbox_id FROM leases WHERE pool=? ORDER BY endpoint", (pool,)
            )
            .fetchall()
        )
        return {str(e): str(s) for e, s in rows}
