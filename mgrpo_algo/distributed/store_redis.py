"""The Redis backend of the stats store (scale-out: role servers on several machines share it).

See :mod:`mgrpo_algo.distributed.store` for the contract; this module holds only what is Redis-specific.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .store import (
    StatsStore,
    StoreError,
    _as_index,
)

__all__ = ["RedisStore"]

T = TypeVar("T")
logger = logging.getLogger("mgrpo_algo.distributed.store")


_PUT_MAIN_LUA = """
for i = 2, #ARGV, 2 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if cur and cur ~= ARGV[i + 1] then return {ARGV[i], cur} end
end
for i = 2, #ARGV, 2 do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('SADD', KEYS[2], ARGV[1])
return 0
"""


class RedisStore(StatsStore):
    """The scale-out store: a Redis server the role servers of several machines share.

    Keys (``NS`` = ``namespace``): ``NS:main:<iteration>`` (hash ``"query:rollout"`` -> ``[correct,format_ok]``),
    ``NS:iterations`` (set), ``NS:health:<role>`` (hash step/time/metrics), ``NS:done:<role>`` (set).
    When the server goes away every operation retries with exponential backoff (50 ms .. 1 s) for up to
    ``retry_s``, logging one warning per outage, then raises ``StoreError("redis unreachable ...")``.
    Writes stay idempotent across a retry (one Lua script checks and writes atomically).

    Args:
        url: ``redis://[:PASSWORD@]HOST:PORT[/DB]`` or ``rediss://...`` (TLS), in redis-py's URL syntax,
            passed to ``redis.Redis.from_url`` as it is: TLS options go in the query
            (``?ssl_ca_certs=/path/ca.pem``, ``ssl_cert_reqs=required``). The password never appears in
            ``repr`` or in error messages. A wrong or missing password fails at once (no retrying).
        namespace: prefix of every key, so that several runs can share one server.
        retry_s: how long an operation keeps retrying while the server is unreachable or loading.
        socket_timeout_s: per-command socket timeout (a hung server counts as unreachable).
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        namespace: str = "mgrpo",
        retry_s: float = 30.0,
        socket_timeout_s: float = 5.0,
    ) -> None:
        super().__init__()
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:  # pragma: no cover - redis is in the [dist] extra
            raise ImportError("RedisStore needs redis-py: pip install 'mgrpo[dist]' (or redis)") from exc
        if not namespace:
            raise ValueError("namespace must be a non-empty str")
        self._redis = redis
        self.namespace = namespace
        self.retry_s = float(retry_s)
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=min(socket_timeout_s, 2.0),
            retry=Retry(NoBackoff(), 0),  # our own loop below retries, with a deadline
        )
        kw = self._client.connection_pool.connection_kwargs
        scheme = url.split(":", 1)[0]
        self._where = f"{scheme}://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"  # no password
        self._put_script = self._client.register_script(_PUT_MAIN_LUA)
        self._outage_lock = threading.Lock()
        self._down_since: float | None = None

    def __repr__(self) -> str:
        return f"RedisStore({self._where!r}, namespace={self.namespace!r})"

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        errors = (self._redis.ConnectionError, self._redis.TimeoutError)  # BusyLoadingError included
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        while True:
            try:
                result = fn()
            except self._redis.AuthenticationError as exc:  # a ConnectionError, but retrying cannot help
                raise StoreError(f"redis at {self._where} refused the credentials: {exc}") from exc
            except errors as exc:
                with self._outage_lock:
                    if self._down_since is None:
                        self._down_since = time.monotonic()
                        logger.warning(
                            "redis at %s unreachable (%s); retrying for up to %g s",
                            self._where,
                            exc,
                            self.retry_s,
                        )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StoreError(
                        f"redis unreachable at {self._where}: {what} failed for {self.retry_s:g} s ({exc})"
                    ) from exc
                time.sleep(min(delay, remaining))
                delay = min(2 * delay, 1.0)
                continue
            except self._redis.RedisError as exc:  # WRONGTYPE on a hand-made key, script errors, ...
                raise StoreError(f"{self!r}: {what} failed: {exc}") from exc
            if self._down_since is not None:
                with self._outage_lock:
                    if self._down_since is not None:
                        logger.info(
                            "redis at %s reachable again after %.1f s",
                            self._where,
                            time.monotonic() - self._down_since,
                        )
                        self._down_since = None
            return result

    def _text(self, raw: Any, where: str) -> str:
        if isinstance(raw, bytes):
            try:
                return raw.decode()
            except UnicodeDecodeError as exc:
                raise StoreError(f"malformed record at {where}: not UTF-8 ({raw[:40]!r})") from exc
        if isinstance(raw, (str, int)):
            return str(raw)
        raise StoreError(f"malformed record at {where}: unexpected {type(raw).__name__}")

    def _main_key(self, iteration: int, field: str | None = None) -> str:
        key = f"{self.namespace}:main:{iteration}"
        return key if field is None else f"{key} field {field}"

    def _health_key(self, role: str) -> str:
        return f"{self.namespace}:health:{role}"

    def _done_key(self, role: str) -> str:
        return f"{self.namespace}:done:{role}"

    def _put_main(self, iteration: int, records: dict[str, str]) -> None:
        key = self._main_key(iteration)
        args = [str(iteration)] + [x for item in records.items() for x in item]
        out = self._call(
            f"put_main_stats({key})",
            lambda: self._put_script(keys=[key, f"{self.namespace}:iterations"], args=args),
        )
        if out != 0:
            field, stored = (self._text(x, key) for x in out)
            raise StoreError(
                f"conflicting write to {self._main_key(iteration, field)}: stored {stored!r}, "
                f"new {records[field]!r}"
            )

    def _count_main(self, iteration: int) -> int:
        key = self._main_key(iteration)
        return int(self._call(f"count({key})", lambda: self._client.hlen(key)))

    def _read_main(self, iteration: int) -> list[tuple[Any, Any, Any]]:
        key = self._main_key(iteration)
        raw = self._call(f"get_main_stats({key})", lambda: self._client.hgetall(key))
        rows = []
        for field, value in raw.items():
            field_s = self._text(field, key)
            query, sep, rollout = field_s.partition(":")
            if not sep:
                raise StoreError(f"malformed record at {key}: field {field_s!r} is not 'query:rollout'")
            rows.append((query, rollout, self._text(value, self._main_key(iteration, field_s))))
        return rows

    def _latest_complete(self, expected: int) -> int | None:
        set_key = f"{self.namespace}:iterations"
        members = self._call("latest_complete_iteration", lambda: self._client.smembers(set_key))
        iterations = sorted(
            (_as_index(self._text(m, set_key), set_key, "iteration") for m in members), reverse=True
        )

        def lengths() -> list[int]:
            pipe = self._client.pipeline(transaction=False)
            for it in iterations:
                pipe.hlen(self._main_key(it))
            return pipe.execute()

        counts = self._call("latest_complete_iteration", lengths) if iterations else []
        return next((it for it, n in zip(iterations, counts, strict=True) if int(n) >= expected), None)

    def _put_health(self, role: str, step: int, stamp: str, data: str) -> None:
        key = self._health_key(role)
        mapping = {"step": step, "time": stamp, "metrics": data}
        self._call(f"put_health({key})", lambda: self._client.hset(key, mapping=mapping))

    def _get_health(self, role: str) -> tuple[Any, Any, Any] | None:
        key = self._health_key(role)
        raw = self._call(f"get_health({key})", lambda: self._client.hgetall(key))
        if not raw:
            return None
        fields = {self._text(k, key): v for k, v in raw.items()}
        missing = sorted({"step", "time", "metrics"} - fields.keys())
        if missing:
            raise StoreError(f"malformed health record at {key}: missing {missing}")
        return tuple(self._text(fields[name], key) for name in ("step", "time", "metrics"))  # type: ignore[return-value]

    def _mark_done(self, role: str, iteration: int) -> None:
        key = self._done_key(role)
        self._call(f"mark_done({key})", lambda: self._client.sadd(key, iteration))

    def _done(self, role: str) -> list[Any]:
        key = self._done_key(role)
        return [
            self._text(m, key)
            for m in self._call(f"done_iterations({key})", lambda: self._client.smembers(key))
        ]

    def _close(self) -> None:
        self._client.close()
