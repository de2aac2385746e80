"""A response cache on SQLite: record tool responses and replay them, keyed by a normalised request.

Modes:
    ``"readwrite"`` (default): serve hits, record misses.
    ``"replay"``: serve hits only; a miss is an error (a run that must be reproducible offline).
    ``"record"``: always go to the backend and overwrite what is stored.
    ``"off"``: neither read nor write.

The file uses WAL so several processes (rollout workers) can share it. Values are JSON objects.

Entries are portable between runs as long as requests and responses do not name a per-run address:
a loopback site is reached through a virtual origin (:mod:`.origin_map`, e.g.
``http://wiki-hops.test``), so the fetchers and the search index store only that stable origin and a
cache recorded against one run's port replays in any other run.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from .base import ToolError

__all__ = ["ResponseCache", "CACHE_MODES", "request_key"]

CACHE_MODES = ("readwrite", "replay", "record", "off")


def request_key(namespace: str, request: Any) -> str:
    """A stable key for ``request`` (any JSON-serialisable value) under ``namespace``.

    Dict keys are sorted, so ``{"a": 1, "b": 2}`` and ``{"b": 2, "a": 1}`` are the same request.
    Normalising the request itself (URL canonical form, lower-cased queries) is the caller's job.
    """
    return _hash(_request_blob(namespace, request))


def _request_blob(namespace: str, request: Any) -> str:
    return json.dumps([namespace, request], sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _hash(blob: str) -> str:
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResponseCache:
    """Thread-safe SQLite cache of JSON responses.

    Args:
        path: database file; created with its parent folder if absent.
        mode: one of :data:`CACHE_MODES`.
    """

    def __init__(self, path: str | Path, mode: str = "readwrite") -> None:
        if mode not in CACHE_MODES:
            raise ValueError(f"cache mode must be one of {CACHE_MODES}, got {mode!r}")
        self.path = Path(path)
        self.mode = mode
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS responses ("
            " key TEXT PRIMARY KEY, namespace TEXT NOT NULL, request TEXT NOT NULL,"
            " value TEXT NOT NULL, created REAL NOT NULL)"
        )
        self._conn.commit()
        self.hits = 0
        self.misses = 0

    def get(self, namespace: str, request: Any) -> dict[str, Any] | None:
        """The stored value for this request, or None. In ``replay`` mode a miss raises ToolError("cache")."""
        if self.mode in ("off", "record"):
            return None
        key = request_key(namespace, request)
        with self._lock:
            row = self._conn.execute("SELECT value FROM responses WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.misses += 1
            if self.mode == "replay":
                raise ToolError("cache", f"no recorded response for this {namespace} request (replay mode)")
            return None
        self.hits += 1
        return json.loads(row[0])

    def put(self, namespace: str, request: Any, value: dict[str, Any]) -> None:
        """Store ``value`` (a JSON object) for this request; a no-op in ``off`` and ``replay`` modes."""
        if self.mode in ("off", "replay"):
            return
        key = request_key(namespace, request)
        blob = json.dumps(value, ensure_ascii=False)
        req = json.dumps(request, sort_keys=True, ensure_ascii=False)
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO responses (key, namespace, request, value, created) VALUES (?, ?, ?, ?, ?)",
                (key, namespace, req, blob, time.time()),
            )
            self._conn.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> ResponseCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
