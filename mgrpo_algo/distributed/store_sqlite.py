"""The SQLite backend of the stats store: one file that the role processes of one machine share.

See :mod:`mgrpo_algo.distributed.store` for the contract; this module holds only what is SQLite-specific.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .store import StatsStore, StoreError

__all__ = ["SQLiteStore", "open_sqlite"]

T = TypeVar("T")


_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS main_stats (iteration INTEGER NOT NULL, query INTEGER NOT NULL,
    rollout INTEGER NOT NULL, value TEXT NOT NULL, PRIMARY KEY (iteration, query, rollout)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS health (role TEXT PRIMARY KEY, step INTEGER NOT NULL, time TEXT NOT NULL,
    metrics TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS done (role TEXT NOT NULL, iteration INTEGER NOT NULL,
    PRIMARY KEY (role, iteration)) WITHOUT ROWID;
"""


class SQLiteStore(StatsStore):
    """One SQLite file shared by the role processes of one machine (WAL journal, busy timeout).

    One connection guarded by a lock per store object, so one object may be shared by threads.

    Args:
        path: the database file (created with its parent folder when absent).
        busy_timeout_s: how long a writer waits for another process's lock before :class:`StoreError`.
    """

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        super().__init__()
        self.path = Path(path)
        self._lock = threading.RLock()
        try:
            if str(path) != ":memory:":
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                str(path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, _SCHEMA_VERSION):
                raise StoreError(f"{path}: stats-store schema version {version}, expected {_SCHEMA_VERSION}")
            self._conn.executescript(
                f"BEGIN IMMEDIATE;{_SCHEMA}PRAGMA user_version={_SCHEMA_VERSION};COMMIT;"
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open sqlite stats store {path}: {exc}") from exc

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    def _run(self, what: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            try:
                return fn(self._conn)
            except sqlite3.Error as exc:
                raise StoreError(f"{self!r}: {what} failed: {exc}") from exc

    def _main_key(self, iteration: int, field: str | None = None) -> str:
        if field is None:
            return f"main_stats[iteration={iteration}]"
        query, _, rollout = field.partition(":")
        return f"main_stats[iteration={iteration}, query={query}, rollout={rollout}]"

    def _wire_key(self, iteration: int) -> str:
        return str(iteration)  # the SQL parameter

    def _health_key(self, role: str) -> str:
        return f"health[role={role!r}]"

    def _done_key(self, role: str) -> str:
        return f"done[role={role!r}]"

    def _put_main(self, iteration: int, records: dict[str, str]) -> None:
        def txn(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                existing = {
                    f"{q}:{r}": v
                    for q, r, v in conn.execute(
                        "SELECT query, rollout, value FROM main_stats WHERE iteration = ?", (iteration,)
                    )
                }
                for field, value in records.items():
                    if field in existing and existing[field] != value:
                        raise StoreError(
                            f"conflicting write to {self._main_key(iteration, field)}: stored "
                            f"{existing[field]!r}, new {value!r}"
                        )
                conn.executemany(
                    "INSERT INTO main_stats (iteration, query, rollout, value) VALUES (?, ?, ?, ?)",
                    [
                        (iteration, *map(int, field.split(":")), value)
                        for field, value in records.items()
                        if field not in existing
                    ],
                )
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

        self._run("put_main_stats", txn)

    def _count_main(self, iteration: int) -> int:
        sql = "SELECT COUNT(*) FROM main_stats WHERE iteration = ?"
        return self._run("count", lambda c: c.execute(sql, (iteration,)).fetchone()[0])

    def _read_main(self, iteration: int) -> list[tuple[Any, Any, Any]]:
        sql = "SELECT query, rollout, value FROM main_stats WHERE iteration = ?"
        return self._run("get_main_stats", lambda c: c.execute(sql, (iteration,)).fetchall())

    def _latest_complete(self, expected: int) -> int | None:
        sql = (
            "SELECT iteration FROM main_stats GROUP BY iteration HAVING COUNT(*) >= ? ORDER BY iteration DESC"
        )
        rows = self._run("latest_complete_iteration", lambda c: c.execute(sql, (expected,)).fetchall())
        valid = [it for (it,) in rows if isinstance(it, int) and it >= 0]
        if len(valid) != len(rows):
            bad = [it for (it,) in rows if it not in valid]
            raise StoreError(f"malformed records in main_stats: iteration values {bad!r} are not ints >= 0")
        return max(valid, default=None)

    def _put_health(self, role: str, step: int, stamp: str, data: str) -> None:
        sql = "INSERT OR REPLACE INTO health (role, step, time, metrics) VALUES (?, ?, ?, ?)"
        self._run("put_health", lambda c: c.execute(sql, (role, step, stamp, data)))

    def _get_health(self, role: str) -> tuple[Any, Any, Any] | None:
        sql = "SELECT step, time, metrics FROM health WHERE role = ?"
        return self._run("get_health", lambda c: c.execute(sql, (role,)).fetchone())

    def _mark_done(self, role: str, iteration: int) -> None:
        sql = "INSERT OR IGNORE INTO done (role, iteration) VALUES (?, ?)"
        self._run("mark_done", lambda c: c.execute(sql, (role, iteration)))

    def _done(self, role: str) -> list[Any]:
        sql = "SELECT iteration FROM done WHERE role = ?"
        return [it for (it,) in self._run("done_iterations", lambda c: c.execute(sql, (role,)).fetchall())]

    def _close(self) -> None:
        with self._lock:
            self._conn.close()


def open_sqlite(spec: str, **kwargs: Any) -> SQLiteStore:
    """The store of a ``sqlite:PATH`` spec (``STORE_BACKENDS["sqlite"]``)."""
    return SQLiteStore(spec.partition(":")[2], **kwargs)
