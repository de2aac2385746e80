"""The stats store: the only channel between the decoupled role servers.

M-GRPO trains the main agent and the sub-agents on separate servers; no gradient and no trajectory
crosses between them (paper section 4, "decoupled pipeline"). What crosses is minimal statistics:

- per (iteration, query, rollout) the main agent's correctness ``correct`` (0..1), ``format_ok`` and
  reward R_M (:class:`MainStat`); the sub worker reads ``correct`` to compute R_S = b1*format +
  b2*r_correct^main + b3*expert of its own trajectories;
- per role its latest health (step, loss, reward mean, ...), for monitoring and the stale mode;
- per role the iterations it has already applied (:meth:`StatsStore.mark_done`), so a restarted server
  never applies a statistic twice.

Two backends share one contract (:class:`StatsStore`): ``SQLiteStore`` (``store_sqlite``), one file
that several processes share (the embedded default), and ``RedisStore`` (``store_redis``) for many
machines; :data:`STORE_BACKENDS` finds them by the spec's scheme. Writes are
idempotent (re-publishing the same record stores it once; a different value for an existing key raises
:class:`StoreError`), and every value is validated when read: a corrupted record raises
:class:`StoreError` naming its key, never a ``KeyError`` or ``JSONDecodeError``.

Byte counters (``bytes_written`` / ``bytes_read``) count *payload*, the same way in both backends: what
names the iteration once per call (the Redis key ``mgrpo:main:12``; the SQL parameter ``12``) plus each
record's field (``"query:rollout"``) and encoded value (``[1.0,true,0.9]``), UTF-8; for health the role,
step, time stamp and metrics JSON; for done marks the role and iterations. Protocol or SQL framing
and the count-only polls made while waiting are not counted (a poll is ~20 bytes; how many there are
depends on how long a reader waits, not on the data).

>>> with open_store("sqlite:runs/stats.db") as store:  # doctest: +SKIP
...     store.put_main_stats(0, [MainStat(0, k, correct=1.0, format_ok=True) for k in range(8)])  # main
...     stats = store.get_main_stats(0, expected=8)  # on the sub server: waits for the 8 records
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pkgutil import resolve_name
from typing import Any, TypeVar
from urllib.parse import urlsplit

from mgrpo_tools.registry import Registry

logger = logging.getLogger(__name__)

__all__ = [
    "MainStat",
    "STORE_BACKENDS",
    "StoreBackend",
    "StatsStore",
    "StoreError",
    "StoreTimeout",
    "check_store_spec",
    "open_store",
    "shipped_trajectory_bytes",
]

T = TypeVar("T")

TOKEN_ID_BYTES = 4
"""Bytes per token id when a trajectory is shipped (packed int32)."""
TRAJECTORY_HEADER_BYTES = 64
"""Estimated JSON envelope per shipped trajectory, e.g.
``{"iteration":12,"query":3,"rollout":7,"sub":2,"n_tokens":1500}`` is 62 bytes."""


class StoreError(RuntimeError):
    """A store operation failed: conflicting write, corrupted record, unreachable backend."""


class StoreTimeout(StoreError, TimeoutError):
    """Waiting for an iteration's statistics ran past its timeout."""


@dataclass(frozen=True)
class MainStat:
    """The main agent's outcome for one rollout: what the sub side needs for its reward.

    Attributes:
        query: index of the query in the iteration's batch (>= 0).
        rollout: index of the rollout of that query (0..K-1).
        correct: r_correct of the main trajectory, in [0, 1] (0/1 for exact match, F1 or a judge's
            score otherwise).
        format_ok: whether the main trajectory's format was valid.
        reward: the main trajectory's R_M (the group statistics the paper shares), a finite number.
    """

    query: int
    rollout: int
    correct: float
    format_ok: bool
    reward: float = 0.0

    def __post_init__(self) -> None:
        for name in ("query", "rollout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"MainStat.{name} must be an int >= 0, got {value!r}")
            object.__setattr__(self, name, int(value))
        correct = self.correct
        if not isinstance(correct, numbers.Real) or not math.isfinite(correct) or not 0 <= correct <= 1:
            raise ValueError(f"MainStat.correct must be a number in [0, 1], got {correct!r}")
        object.__setattr__(self, "correct", float(correct))
        fmt = self.format_ok
        if not (isinstance(fmt, bool) or getattr(getattr(fmt, "dtype", None), "kind", None) == "b"):
            raise ValueError(f"MainStat.format_ok must be a bool, got {fmt!r}")
        object.__setattr__(self, "format_ok", bool(fmt))
        reward = self.reward
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
            raise ValueError(f"MainStat.reward must be a finite number, got {reward!r}")
        object.__setattr__(self, "reward", float(reward))


def shipped_trajectory_bytes(token_ids: Sequence[Sequence[int]]) -> int:
    """What shipping full trajectories would cost, for the comparison with the store's figure.

    Convention: each trajectory costs ``4`` bytes per token id (packed int32) plus a
    ``TRAJECTORY_HEADER_BYTES`` (64) JSON envelope naming it. A lower bound: a learner would also need
    the per-token log-probs (4 more bytes a token), the loss mask and usually the text.
    """
    return sum(TOKEN_ID_BYTES * len(ids) + TRAJECTORY_HEADER_BYTES for ids in token_ids)


# --------------------------------------------------------------------------- codec and validation


def _encode_stat(stat: MainStat) -> tuple[str, str]:
    """``(field, value)``: ``"query:rollout"`` and the canonical JSON ``[correct,format_ok,reward]``."""
    return f"{stat.query}:{stat.rollout}", json.dumps([stat.correct, stat.format_ok, stat.reward], separators=(",", ":"))


def _as_index(raw: Any, where: str, what: str) -> int:
    """An int >= 0 from a backend value (int, or canonical decimal text), else :class:`StoreError`."""
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
        return raw
    if isinstance(raw, str) and raw.isascii() and raw.isdigit() and str(int(raw)) == raw:
        return int(raw)
    raise StoreError(f"malformed record at {where}: {what} must be an int >= 0, got {raw!r}")


def _decode_stat(query: Any, rollout: Any, value: Any, where: str) -> MainStat:
    q, r = _as_index(query, where, "query"), _as_index(rollout, where, "rollout")
    try:
        decoded = json.loads(value)
        if not (isinstance(decoded, list) and len(decoded) == 3 and isinstance(decoded[1], bool)):
            raise ValueError("expected [correct, format_ok, reward]")
        if isinstance(decoded[0], bool):
            raise ValueError("correct must be a number")
        return MainStat(query=q, rollout=r, correct=decoded[0], format_ok=decoded[1], reward=decoded[2])
    except (TypeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise StoreError(f"malformed record at {where}: value {value!r} ({exc})") from exc


def _encode_metrics(metrics: Mapping[str, float]) -> str:
    if not isinstance(metrics, Mapping):
        raise ValueError(f"health metrics must be a mapping of str to float, got {type(metrics).__name__}")
    clean: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"health metrics must map str to float, got {key!r}: {value!r}")
        clean[key] = float(value)
    return json.dumps(clean, separators=(",", ":"), sort_keys=True)


def _decode_health(role: str, step: Any, stamp: Any, metrics: Any, where: str) -> dict[str, Any]:
    step_int = _as_index(step, where, "step")
    try:
        when = float(stamp)
        decoded = json.loads(metrics)
        if not isinstance(decoded, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in decoded.values()
        ):
            raise ValueError("metrics must be a JSON object of numbers")
    except (TypeError, ValueError) as exc:
        raise StoreError(f"malformed health record at {where}: {exc}") from exc
    return {
        "role": role,
        "step": step_int,
        "time": when,
        "metrics": {k: float(v) for k, v in decoded.items()},
    }


def _nbytes(*parts: object) -> int:
    """UTF-8 size of the parts as text: the payload convention of the byte counters."""
    return sum(len(str(part).encode()) for part in parts)


def _check_role(role: str) -> None:
    if not isinstance(role, str) or not role:
        raise ValueError(f"role must be a non-empty str, got {role!r}")


def _check_int(value: int, name: str, minimum: int = 0) -> int:
    """``value`` as a plain int (numpy ints accepted), or ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


# --------------------------------------------------------------------------- the contract


class StatsStore(ABC):
    """The shared-store contract. Subclasses implement the ``_``-prefixed primitives; the waiting,
    validation and byte accounting live here once. Thread-safe; use as a context manager."""

    def __init__(self) -> None:
        self._counter_lock = threading.Lock()
        self._bytes_written = 0
        self._bytes_read = 0
        self._closed = False

    # -- public API

    def put_main_stats(self, iteration: int, stats: Sequence[MainStat]) -> None:
        """Publish the main agent's statistics of ``iteration``, atomically and idempotently.

        Re-publishing a record with the same value is a no-op (a restarted server may re-send);
        a different value for an existing ``(iteration, query, rollout)`` raises :class:`StoreError`
        naming the key, and then nothing of this call is written.
        """
        iteration = _check_int(iteration, "iteration")
        records: dict[str, str] = {}
        for stat in stats:
            if not isinstance(stat, MainStat):
                raise TypeError(f"put_main_stats expects MainStat records, got {type(stat).__name__}")
            field, value = _encode_stat(stat)
            if records.setdefault(field, value) != value:
                raise StoreError(f"conflicting values for {self._main_key(iteration, field)} in one call")
        if not records:
            return
        self._check_open()
        self._put_main(iteration, records)
        self._count(
            written=_nbytes(self._wire_key(iteration), *(x for item in records.items() for x in item))
        )

    def get_main_stats(
        self, iteration: int, *, expected: int, timeout_s: float = 60.0, poll_s: float = 0.05
    ) -> list[MainStat]:
        """Wait until ``expected`` records of ``iteration`` are present; return them sorted by
        ``(query, rollout)``. Raises :class:`StoreTimeout` after ``timeout_s``, and :class:`StoreError`
        if the iteration holds more than ``expected`` records (the roles disagree on B*K)."""
        iteration = _check_int(iteration, "iteration")
        expected = _check_int(expected, "expected", 1)
        self._check_open()
        deadline = time.monotonic() + timeout_s
        while (arrived := self._count_main(iteration)) < expected:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StoreTimeout(
                    f"iteration {iteration}: {arrived} of {expected} main-agent statistics arrived within "
                    f"{timeout_s:g} s ({self._main_key(iteration)}); is the main role server running?"
                )
            time.sleep(min(poll_s, remaining))
        rows = self._read_main(iteration)
        stats = sorted(
            (_decode_stat(q, r, v, self._main_key(iteration, f"{q}:{r}")) for q, r, v in rows),
            key=lambda s: (s.query, s.rollout),
        )
        keys = {(s.query, s.rollout) for s in stats}
        if len(keys) != len(stats):
            raise StoreError(f"malformed records at {self._main_key(iteration)}: duplicate (query, rollout)")
        if len(stats) != expected:
            raise StoreError(
                f"{self._main_key(iteration)} holds {len(stats)} records, expected {expected}: "
                "do the role servers agree on queries x rollouts per iteration?"
            )
        self._count(read=_nbytes(self._wire_key(iteration), *(f"{q}:{r}{v}" for q, r, v in rows)))
        return stats

    def latest_complete_iteration(self, expected: int) -> int | None:
        """The highest iteration holding at least ``expected`` records, or None."""
        expected = _check_int(expected, "expected", 1)
        self._check_open()
        return self._latest_complete(expected)

    def put_health(self, role: str, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``role``'s health at ``step`` (last write wins: a role restarted from an older
        checkpoint reports its older step)."""
        _check_role(role)
        step = _check_int(step, "step")
        data = _encode_metrics(metrics)
        self._check_open()
        stamp = repr(time.time())
        self._put_health(role, step, stamp, data)
        self._count(written=_nbytes(role, step, stamp, data))

    def get_health(self, role: str) -> dict[str, Any] | None:
        """``{"role", "step", "time", "metrics": {name: float}}`` last written by ``role``, or None."""
        _check_role(role)
        self._check_open()
        raw = self._get_health(role)
        if raw is None:
            return None
        step, stamp, data = raw
        health = _decode_health(role, step, stamp, data, self._health_key(role))
        self._count(read=_nbytes(role, step, stamp, data))
        return health

    def mark_done(self, role: str, iteration: int) -> None:
        """Record that ``role`` has applied ``iteration`` (idempotent)."""
        _check_role(role)
        iteration = _check_int(iteration, "iteration")
        self._check_open()
        self._mark_done(role, iteration)
        self._count(written=_nbytes(role, iteration))

    def done_iterations(self, role: str) -> set[int]:
        """The iterations ``role`` has marked done."""
        _check_role(role)
        self._check_open()
        raw = self._done(role)
        where = self._done_key(role)
        done = {_as_index(it, where, "iteration") for it in raw}
        self._count(read=_nbytes(role, *raw))
        return done

    @property
    def bytes_written(self) -> int:
        """Payload bytes sent to the backend by this store object (see the module docstring)."""
        return self._bytes_written

    @property
    def bytes_read(self) -> int:
        """Payload bytes received from the backend by this store object."""
        return self._bytes_read

    def close(self) -> None:
        """Release the connection (idempotent)."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> StatsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers and primitives

    def _count(self, *, written: int = 0, read: int = 0) -> None:
        with self._counter_lock:
            self._bytes_written += written
            self._bytes_read += read

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self!r} is closed")

    @abstractmethod
    def _main_key(self, iteration: int, field: str | None = None) -> str: ...

    def _wire_key(self, iteration: int) -> str:
        """What names the iteration on the wire (counted once per call in the byte counters)."""
        return self._main_key(iteration)

    @abstractmethod
    def _health_key(self, role: str) -> str: ...

    @abstractmethod
    def _done_key(self, role: str) -> str: ...

    @abstractmethod
    def _put_main(self, iteration: int, records: dict[str, str]) -> None: ...

    @abstractmethod
    def _count_main(self, iteration: int) -> int: ...

    @abstractmethod
    def _read_main(self, iteration: int) -> list[tuple[Any, Any, Any]]:
        """``(query, rollout, value)`` rows as stored (validated by the caller)."""

    @abstractmethod
    def _latest_complete(self, expected: int) -> int | None: ...

    @abstractmethod
    def _put_health(self, role: str, step: int, stamp: str, data: str) -> None: ...

    @abstractmethod
    def _get_health(self, role: str) -> tuple[Any, Any, Any] | None: ...

    @abstractmethod
    def _mark_done(self, role: str, iteration: int) -> None: ...

    @abstractmethod
    def _done(self, role: str) -> list[Any]: ...

    @abstractmethod
    def _close(self) -> None: ...


# --------------------------------------------------------------------------- factory


@dataclass(frozen=True)
class StoreBackend:
    """A statistics store, chosen by the scheme of its spec (``sqlite:PATH``, ``redis://...``)."""

    open: Callable[..., StatsStore] | str
    """``open(spec, **kwargs) -> StatsStore``; a "module:attr" string is imported on first open (a
    backend module imports this one for the base class, never the reverse: no import cycle)."""
    check: Callable[[str], None]
    """Raises ValueError on a malformed spec, without connecting (run when the config loads)."""
    form: str
    """The spec's form for error messages, e.g. ``'sqlite:PATH' (e.g. sqlite:runs/stats.db)``."""


def _sqlite_path(spec: str) -> str:
    path = spec.partition(":")[2]
    if not path:
        raise ValueError("has no path")
    return path


def _check_redis(spec: str) -> None:
    parts = urlsplit(spec)
    parts.port  # noqa: B018 - raises ValueError on a bad port
    db = parts.path.lstrip("/")
    if not spec.startswith(f"{parts.scheme}://") or not parts.hostname or (db and not db.isdigit()) \
            or parts.path.count("/") > 1:
        raise ValueError("bad host or db")


_REDIS = StoreBackend("mgrpo_algo.distributed.store_redis:RedisStore", _check_redis,
                      "'redis://HOST:PORT[/DB]' (e.g. redis://127.0.0.1:6379/0; a password: redis://:PASSWORD@HOST:PORT; "
                      "TLS: rediss://...)")
#: Store backends by the scheme of their spec (``placement.store``, checked when the config loads). A
#: new backend is one registered :class:`StoreBackend` with a :class:`StatsStore` subclass behind it.
STORE_BACKENDS: Registry[StoreBackend] = Registry("store scheme", {
    "sqlite": StoreBackend("mgrpo_algo.distributed.store_sqlite:open_sqlite", _sqlite_path,
                           "'sqlite:PATH' (e.g. sqlite:runs/stats.db)"),
    "redis": _REDIS,
    "rediss": _REDIS,
})


def _forms() -> str:
    forms = dict.fromkeys(STORE_BACKENDS.get(name).form for name in STORE_BACKENDS.names())
    return " or ".join(forms)


def check_store_spec(spec: str, field: str = "") -> StoreBackend:
    """The backend of ``spec`` after checking its form (no connection is made). Raises ValueError
    naming ``field`` (the config's dotted path, when given) and the accepted forms."""
    where = f"config field '{field}': " if field else ""
    if not isinstance(spec, str):
        raise ValueError(f"{where}store spec must be a str: {_forms()}; got {spec!r}")
    scheme, sep, _ = spec.partition(":")
    if not sep or scheme not in STORE_BACKENDS:
        raise ValueError(f"{where}unknown store spec {spec!r} (schemes: {', '.join(STORE_BACKENDS.names())}); "
                         f"use {_forms()}")
    backend = STORE_BACKENDS.get(scheme)
    try:
        backend.check(spec)
    except ValueError as exc:
        raise ValueError(f"{where}malformed {scheme} store spec {spec!r} ({exc}); use {_forms()}") from None
    return backend


def open_store(spec: str, **kwargs: Any) -> StatsStore:
    """Open a store from a spec string: ``"sqlite:PATH"``, ``"redis://HOST:PORT[/DB]"`` or the form of
    another registered backend (:data:`STORE_BACKENDS`).

    Keyword arguments go to the backend (``namespace=``, ``retry_s=`` for Redis; ``busy_timeout_s=``
    for SQLite). Anything else raises ``ValueError`` listing the accepted forms.
    """
    backend = check_store_spec(spec)
    opener = resolve_name(backend.open) if isinstance(backend.open, str) else backend.open
    return opener(spec, **kwargs)


def check_store_field(spec: str, field: str) -> None:
    """The config's check of ``placement.store``: empty (the run's own SQLite file) or a valid spec."""
    if spec != "":
        check_store_spec(spec, field)
