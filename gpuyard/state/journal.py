"""SQLite journal of platform-owned objects, so a restarted process loses nothing.

The store hands every write of a journaled kind to :meth:`Journal.record_put` /
:meth:`record_delete`; they only buffer. :meth:`flush` writes the buffer in one transaction
(group commit, WAL mode). The runtime flushes every `interval` seconds and on shutdown; an API
handler that must not acknowledge before the write is durable awaits :meth:`Journal.sync`.

Only the newest version of each object is kept (one row per key), with the highest
resourceVersion ever issued, so reloading gives the same objects with the same versions.
Versions are also used by kinds that are not journaled (Events, Services), so the store reserves
them in blocks (:meth:`Journal.reserve_versions`, durable at once, before any version of the
block is handed out); a reload continues above the reservation, so a version is never reused.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from gpuyard.apis.meta import Resource
    from gpuyard.state.store import Store

__all__ = ["Journal"]

log = structlog.get_logger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    kind TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
    rv INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (kind, namespace, name)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


class Journal:
    """Buffered, group-committed SQLite journal (WAL)."""

    def __init__(self, path: Path | str, *, max_pending: int = 5_000) -> None:
        self.path = Path(path)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        # key -> newest object (serialised at flush) or None for a delete; a key written many
        # times between flushes is serialised once
        self._pending: dict[tuple[str, str, str], Resource | None] = {}
        self._max_rv = 0
        self._max_pending = max_pending
        self.commits = 0

    # --- the store's sink --------------------------------------------------------------------

    def record_put(self, obj: Resource, rv: int) -> None:
        self._pending[(obj.kind, obj.metadata.namespace, obj.metadata.name)] = obj
        self._max_rv = rv
        if len(self._pending) >= self._max_pending:
            self.flush()

    def record_delete(self, kind: str, namespace: str, name: str, rv: int) -> None:
        self._pending[(kind, namespace, name)] = None
        self._max_rv = rv
        if len(self._pending) >= self._max_pending:
            self.flush()

    def reserve_versions(self, upto: int) -> None:
        """Durably record that versions up to `upto` may be handed out (one small commit)."""
        self._db.execute(
            "INSERT OR REPLACE INTO meta VALUES ('rv_reserved', MAX(?, COALESCE((SELECT value FROM meta WHERE key='rv_reserved'), 0)))",
            (upto,),
        )

    # --- durability --------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        return len(self._pending)

    def flush(self) -> None:
        """Write everything buffered in one transaction."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        puts = [
            (
                k,
                ns,
                n,
                int(obj.metadata.resource_version),
                obj.__pydantic_serializer__.to_json(obj, by_alias=True),
            )
            for (k, ns, n), obj in pending.items()
            if obj is not None
        ]
        deletes = [key for key, v in pending.items() if v is None]
        db = self._db
        db.execute("BEGIN")
        try:
            if deletes:
                db.executemany("DELETE FROM objects WHERE kind=? AND namespace=? AND name=?", deletes)
            if puts:
                db.executemany("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?, ?)", puts)
            db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('rv', MAX(?, COALESCE((SELECT value FROM meta WHERE key='rv'), 0)))",
                (self._max_rv,),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            # keep what was not written, unless newer writes of the same keys came since
            for key, value in pending.items():
                self._pending.setdefault(key, value)
            raise
        self.commits += 1

    async def sync(self) -> None:
        """Make every write so far durable (called by API handlers before they answer)."""
        self.flush()

    async def run(self, *, interval: float = 0.05) -> None:
        """Flush periodically until cancelled; flush once more on the way out."""
        try:
            while True:
                await asyncio.sleep(interval)
                self.flush()
        finally:
            self.flush()

    # --- reload ------------------------------------------------------------------------------

    def load_into(self, store: Store) -> int:
        """Load every journaled object into `store`; return how many were loaded."""
        count = 0
        rows = self._db.execute("SELECT kind, data FROM objects ORDER BY rv").fetchall()
        for kind, data in rows:
            if kind not in store.kinds():
                log.warning("journal.unknown_kind", kind=kind)
                continue
            store.load(store.kind_class(kind).model_validate_json(data))
            count += 1
        row = self._db.execute("SELECT MAX(value) FROM meta WHERE key IN ('rv', 'rv_reserved')").fetchone()
        store.restore_version(int(row[0]) if row and row[0] is not None else 0)
        return count

    def close(self, *, issued: int | None = None) -> None:
        """Flush and close. `issued`: the store's resourceVersion once nothing writes any more;
        the next start continues exactly after it instead of after the reserved block."""
        try:
            self.flush()
            if issued is not None:
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('rv_reserved', ?)", (issued,))
        finally:
            self._db.close()
