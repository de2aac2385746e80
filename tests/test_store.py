"""The stats store: the contract on both backends (SQLite file, real redis-server), cross-thread and
cross-process waits, validation of corrupted records, and Redis outages (restart, long outage)."""

from __future__ import annotations

import logging
import math
import multiprocessing
import random
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from redis_server import (  # noqa: F401 - fixtures
    RedisServer,
    persistent_redis_server_fixture,
    redis_available,
    redis_server_fixture,
    self_signed_cert,
)

from mgrpo_algo.distributed.store import (
    MainStat,
    StoreError,
    StoreTimeout,
    open_store,
    shipped_trajectory_bytes,
)
from mgrpo_algo.distributed.store_redis import RedisStore
from mgrpo_algo.distributed.store_sqlite import SQLiteStore

B, K = 2, 3  # queries x rollouts per iteration in most tests


def batch(b: int = B, k: int = K, seed: int = 0) -> list[MainStat]:
    rng = random.Random(seed)
    return [MainStat(q, r, c := float(rng.random() < 0.5), f := rng.random() < 0.8, (0.1 + 0.9 * c) if f else 0.0)
            for q in range(b) for r in range(k)]


@pytest.fixture(params=["sqlite", "redis"])
def spec(request, tmp_path):
    """A store spec; every ``open_store(spec)`` reaches the same data (one file / one server)."""
    if request.param == "sqlite":
        yield f"sqlite:{tmp_path / 'stats.db'}"
        return
    if not redis_available():
        pytest.skip("redis-server is not installed")
    pytest.importorskip("redis")
    with RedisServer() as server:
        yield server.url


@pytest.fixture
def store(spec):
    with open_store(spec) as s:
        yield s


def corrupt(spec: str, iteration: int, field: str, value: str) -> None:
    """Write a raw main-stat record behind the store's back (a hand edit)."""
    if spec.startswith("sqlite:"):
        query, rollout = field.split(":")
        with sqlite3.connect(spec[len("sqlite:") :]) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO main_stats VALUES (?, ?, ?, ?)", (iteration, query, rollout, value)
            )
        conn.close()
    else:
        import redis

        with redis.Redis.from_url(spec) as client:
            client.hset(f"mgrpo:main:{iteration}", field, value)


# --------------------------------------------------------------------------- the contract


def test_round_trip_sorted_and_visible_to_another_client(spec, store):
    stats = batch()
    shuffled = stats[:]
    random.Random(1).shuffle(shuffled)
    store.put_main_stats(3, shuffled)
    assert store.get_main_stats(3, expected=B * K, timeout_s=1) == stats
    with open_store(spec) as other:
        assert other.get_main_stats(3, expected=B * K, timeout_s=1) == stats
        assert other.get_main_stats(np.int64(3), expected=np.int32(B * K), timeout_s=1) == stats
    store.put_main_stats(np.int64(4), stats)  # numpy ints from a trainer are plain ints in the store
    assert store.latest_complete_iteration(B * K) == 4


def test_reput_is_idempotent(store):
    stats = batch()
    store.put_main_stats(0, stats)
    store.put_main_stats(0, stats)  # a restarted main server re-publishes
    store.put_main_stats(0, stats[:2] + [MainStat(B, 0, 1.0, True)])  # partial overlap + one new
    got = store.get_main_stats(0, expected=B * K + 1, timeout_s=1)
    assert got == sorted(stats + [MainStat(B, 0, 1.0, True)], key=lambda s: (s.query, s.rollout))
    assert store.latest_complete_iteration(B * K + 1) == 0
    store.put_main_stats(0, [])  # nothing to do


def test_conflicting_reput_raises_and_writes_nothing(store):
    stats = batch()
    store.put_main_stats(1, stats)
    flipped = MainStat(stats[1].query, stats[1].rollout, 1.0 - stats[1].correct, stats[1].format_ok)
    with pytest.raises(StoreError, match=r"conflicting write to .*(query=0, rollout=1|main:1 field 0:1)"):
        store.put_main_stats(1, [MainStat(9, 9, 1.0, True), flipped])
    assert store.get_main_stats(1, expected=B * K, timeout_s=1) == stats  # (9, 9) not written
    with pytest.raises(StoreError, match="conflicting values"):
        store.put_main_stats(2, [MainStat(0, 0, 1.0, True), MainStat(0, 0, 1.0, False)])


def test_get_waits_for_a_writer_thread(spec, store):
    stats = batch()

    def write_later():
        time.sleep(0.3)
        with open_store(spec) as writer:
            writer.put_main_stats(5, stats[:3])
            time.sleep(0.1)
            writer.put_main_stats(5, stats[3:])

    thread = threading.Thread(target=write_later)
    start = time.monotonic()
    thread.start()
    assert store.get_main_stats(5, expected=B * K, timeout_s=10, poll_s=0.02) == stats
    assert time.monotonic() - start >= 0.35
    thread.join()


def _put_in_child(spec: str, iteration: int, rows: list[tuple], delay_s: float) -> None:
    time.sleep(delay_s)
    with open_store(spec) as store:
        for row in rows:  # one call per record: many small transactions against the parent's
            store.put_main_stats(iteration, [MainStat(*row)])


def test_get_waits_for_a_writer_process(spec, store):
    """Two processes share the SQLite file (or the Redis server); both write the same iteration."""
    stats = batch(b=4, k=8)
    child_rows = [(s.query, s.rollout, s.correct, s.format_ok, s.reward) for s in stats[16:]]
    proc = multiprocessing.get_context("spawn").Process(target=_put_in_child, args=(spec, 0, child_rows, 0.2))
    proc.start()
    try:
        for stat in stats[:16]:
            store.put_main_stats(0, [stat])
        assert store.get_main_stats(0, expected=32, timeout_s=30) == stats
    finally:
        proc.join(timeout=30)
    assert proc.exitcode == 0


def test_timeout_names_iteration_and_arrivals(store):
    store.put_main_stats(7, batch()[:3])
    start = time.monotonic()
    with pytest.raises(StoreTimeout, match=r"iteration 7: 3 of 8 main-agent statistics arrived within 0.3 s"):
        store.get_main_stats(7, expected=8, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - start < 2
    assert issubclass(StoreTimeout, TimeoutError) and issubclass(StoreTimeout, StoreError)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("0:0", "oops", "value 'oops'"),
        ("0:0", "[2.0,true,0.0]", r"\[0, 1\]"),
        ("0:0", "[1.0,1,0.0]", "expected"),
        ("0:0", "[1.0,true]", "expected"),  # R_M missing: the sub side's group statistics
        ("0:0", '[1.0,true,"x"]', "reward must be a finite number"),
        ("0:0", '{"correct":1}', "expected"),
        ("0:0", "[true,true,0.0]", "correct must be a number"),
        ("x:0", "[1.0,true,0.0]", "query must be an int"),
        ("0:-1", "[1.0,true,0.0]", "rollout must be an int"),
    ],
)
def test_malformed_record_raises_store_error_naming_the_key(spec, store, field, value, message):
    store.put_main_stats(4, [MainStat(0, 1, 1.0, True)])
    corrupt(spec, 4, field, value)
    with pytest.raises(StoreError, match=message) as info:
        store.get_main_stats(4, expected=2, timeout_s=1)
    assert "main_stats[iteration=4" in str(info.value) or "mgrpo:main:4" in str(info.value)


def test_more_records_than_expected_is_an_error(store):
    store.put_main_stats(0, batch())
    with pytest.raises(StoreError, match=f"holds {B * K} records, expected {B * K - 1}"):
        store.get_main_stats(0, expected=B * K - 1, timeout_s=1)


def test_corrupted_health_and_done_raise_store_error(spec, store):
    store.put_health("main", 1, {"loss": 1.0})
    store.mark_done("sub", 0)
    if spec.startswith("sqlite:"):
        with sqlite3.connect(spec[len("sqlite:") :]) as conn:
            conn.execute("UPDATE health SET metrics = '[1, 2]'")
            conn.execute("INSERT INTO done VALUES ('sub', 'seven')")
        conn.close()
    else:
        import redis

        with redis.Redis.from_url(spec) as client:
            client.hdel("mgrpo:health:main", "metrics")
            client.sadd("mgrpo:done:sub", "seven")
            client.set("mgrpo:main:3", "not a hash")
        with pytest.raises(StoreError, match="mgrpo:main:3.*WRONGTYPE"):
            store.get_main_stats(3, expected=1, timeout_s=1)
    with pytest.raises(StoreError, match=r"health.*main"):
        store.get_health("main")
    with pytest.raises(StoreError, match=r"done.*sub.*'seven'"):
        store.done_iterations("sub")


def test_main_stat_carries_r_m_checked_and_read_back(store):
    """R_M travels with each rollout's statistics (the paper's group statistics) and is validated."""
    store.put_main_stats(0, [MainStat(0, 0, 1.0, True, 1.0), MainStat(0, 1, 0.0, True, 0.1)])
    assert [s.reward for s in store.get_main_stats(0, expected=2, timeout_s=0)] == [1.0, 0.1]
    for bad in (float("nan"), float("inf"), True, "0.5"):
        with pytest.raises(ValueError, match="reward must be a finite number"):
            MainStat(0, 0, 1.0, True, bad)


def test_latest_complete_iteration(store):
    assert store.latest_complete_iteration(B * K) is None
    store.put_main_stats(0, batch())
    store.put_main_stats(1, batch()[:2])
    store.put_main_stats(2, batch(seed=2))
    store.put_main_stats(3, batch()[:1])
    assert store.latest_complete_iteration(B * K) == 2
    assert store.latest_complete_iteration(1) == 3
    assert store.latest_complete_iteration(B * K + 1) is None
    with pytest.raises(ValueError):
        store.latest_complete_iteration(0)


def test_health_last_write_wins_per_role(spec, store):
    assert store.get_health("main") is None
    store.put_health("main", 1, {"loss": 0.5, "reward_mean": 0.25})
    store.put_health("main", 2, {"loss": 0.4, "reward_mean": np.float32(0.5), "nan_check": math.nan})
    store.put_health("sub", 7, {"loss": 1})
    with open_store(spec) as other:
        health = other.get_health("main")
    assert health["role"] == "main" and health["step"] == 2
    assert health["metrics"]["loss"] == 0.4 and health["metrics"]["reward_mean"] == 0.5
    assert math.isnan(health["metrics"]["nan_check"])
    assert abs(health["time"] - time.time()) < 60
    assert store.get_health("sub")["metrics"] == {"loss": 1.0}
    with pytest.raises(ValueError, match="str to float"):
        store.put_health("main", 3, {"loss": "high"})
    with pytest.raises(ValueError, match="role"):
        store.put_health("", 3, {})


def test_done_iterations_survive_a_restarted_client(spec, store):
    assert store.done_iterations("sub") == set()
    for it in (0, 1, 1, 2):
        store.mark_done("sub", it)
    store.mark_done("main", 0)
    with open_store(spec) as restarted:
        assert restarted.done_iterations("sub") == {0, 1, 2}
        assert restarted.done_iterations("main") == {0}


def test_byte_counters_count_payload_consistently(spec, store):
    with open_store(spec) as reader:
        store.put_main_stats(0, batch())
        written = store.bytes_written
        assert written > B * K * len("0:0[1.0,true,0.0]") - B * K  # at least the records
        reader.get_main_stats(0, expected=B * K, timeout_s=1)
        assert reader.bytes_read == written and reader.bytes_written == 0  # same payload both ways
        store.put_main_stats(0, batch())  # a re-publish is sent again
        assert store.bytes_written == 2 * written
        with pytest.raises(StoreTimeout):
            reader.get_main_stats(1, expected=1, timeout_s=0.1)  # polls are not payload
        assert reader.bytes_read == written
        store.put_health("main", 1, {"loss": 0.5})
        store.mark_done("main", 0)
        reader.get_health("main")
        reader.done_iterations("main")
        assert store.bytes_written - 2 * written == reader.bytes_read - written > 0


def test_closed_store_raises(store):
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.put_main_stats(0, batch())


def test_sqlite_store_shared_by_threads(tmp_path):
    with SQLiteStore(tmp_path / "stats.db") as store:

        def write(it: int) -> None:
            for stat in batch(seed=it):
                store.put_main_stats(it, [stat])
                store.put_health(f"role{it}", it, {"loss": float(it)})

        threads = [threading.Thread(target=write, args=(it,)) for it in range(8)]
        for thread in threads:
            thread.start()
        got = [store.get_main_stats(it, expected=B * K, timeout_s=10) for it in range(8)]
        for thread in threads:
            thread.join()
        assert got == [batch(seed=it) for it in range(8)]
        assert store.latest_complete_iteration(B * K) == 7


def test_sqlite_refuses_a_foreign_schema_version(tmp_path):
    path = tmp_path / "stats.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(StoreError, match="schema version 99"):
        SQLiteStore(path)


# --------------------------------------------------------------------------- Redis outages


def test_redis_restart_while_a_reader_waits(persistent_redis_server, caplog):
    server = persistent_redis_server
    stats = batch(b=4, k=8)
    with open_store(server.url) as first_writer:
        first_writer.put_main_stats(0, stats[:16])
    result: dict = {}
    with RedisStore(server.url, retry_s=15) as reader:

        def wait() -> None:
            try:
                result["stats"] = reader.get_main_stats(0, expected=32, timeout_s=20, poll_s=0.02)
            except Exception as exc:  # noqa: BLE001 - reported below
                result["error"] = exc

        with caplog.at_level(logging.WARNING, logger="mgrpo_algo.distributed.store"):
            thread = threading.Thread(target=wait)
            thread.start()
            time.sleep(0.2)
            server.stop()  # SIGTERM: the append-only file keeps the first 16 records
            time.sleep(0.8)  # the reader keeps polling into a dead port
            server.start()
            with RedisStore(server.url) as second_writer:
                second_writer.put_main_stats(0, stats[16:])
            thread.join(timeout=20)
    assert "error" not in result, result.get("error")
    assert result["stats"] == stats
    warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(warnings) == 1  # once per outage, not once per failed poll


def test_redis_write_retries_through_a_crash(persistent_redis_server):
    server = persistent_redis_server
    stats = batch()
    with RedisStore(server.url, retry_s=15) as store:
        store.put_main_stats(0, stats[:3])
        server.stop(kill=True)  # SIGKILL; appendfsync always keeps what was acknowledged
        restart = threading.Timer(0.5, server.start)
        restart.start()
        store.put_main_stats(0, stats)  # waits for the server, then writes (the first 3 once)
        restart.join()
        assert store.get_main_stats(0, expected=B * K, timeout_s=1) == stats


def test_redis_down_longer_than_retry_s_raises(redis_server):
    with RedisStore(redis_server.url, retry_s=0.5) as store:
        store.put_main_stats(0, batch())
        redis_server.stop()
        start = time.monotonic()
        with pytest.raises(StoreError, match=r"redis unreachable at redis://127\.0\.0\.1:\d+/0"):
            store.get_main_stats(0, expected=B * K, timeout_s=5)
        assert 0.5 <= time.monotonic() - start < 3


# --------------------------------------------------------------------------- values and specs


def test_main_stat_validation():
    assert MainStat(np.int64(1), 2, np.float32(1.0), np.bool_(True)) == MainStat(1, 2, 1.0, True)
    assert MainStat(0, 0, True, False).correct == 1.0
    for bad in [(-1, 0, 1.0, True), (0, 1.5, 1.0, True), (0, 0, 1.5, True), (0, 0, math.nan, True),
                (0, 0, "1", True), (0, 0, 1.0, 1), (True, 0, 1.0, True)]:  # fmt: skip
        with pytest.raises(ValueError):
            MainStat(*bad)


@pytest.mark.parametrize(
    "spec", ["", "stats.db", "sqlite:", "postgres://h/db", "redis://", "redis://h:port/0", "redis://h:1/x", 7]
)
def test_open_store_rejects_bad_specs(spec):
    with pytest.raises(ValueError, match=r"sqlite:PATH.*redis://HOST:PORT\[/DB\]"):
        open_store(spec)


def test_open_store_accepts_both_forms(tmp_path):
    with open_store(f"sqlite:{tmp_path / 'sub' / 'stats.db'}") as store:
        assert isinstance(store, SQLiteStore) and store.path == tmp_path / "sub" / "stats.db"
    with open_store("redis://127.0.0.1:1/3", namespace="run7", retry_s=0) as store:  # connects lazily
        assert isinstance(store, RedisStore) and store.namespace == "run7"
        with pytest.raises(StoreError, match="redis unreachable"):
            store.done_iterations("main")


def test_shipped_trajectory_bytes():
    assert shipped_trajectory_bytes([]) == 0
    assert shipped_trajectory_bytes([[1] * 1500] * 3) == 3 * (4 * 1500 + 64)


# --------------------------------------------------------------------------- Redis password and TLS


def _redis_with(tmp_path: Path, **kwargs: Any) -> RedisServer:
    if not redis_available():
        pytest.skip("redis-server is not installed")
    return RedisServer(persist_dir=None, **kwargs)


def test_redis_password_from_the_url(tmp_path: Path) -> None:
    with _redis_with(tmp_path, password="s3cret-pw") as server:
        assert server.url.startswith("redis://:s3cret-pw@127.0.0.1:")
        with open_store(server.url, retry_s=5) as store:
            store.put_main_stats(0, batch())
            assert store.get_main_stats(0, expected=B * K, timeout_s=1) == batch()
            assert "s3cret-pw" not in repr(store)
        # No password, or a wrong one: refused at once with a clear error (an outage would be retried
        # for retry_s) that does not repeat the password.
        bare = f"redis://127.0.0.1:{server.port}/0"
        for url in (bare, f"redis://:wrong-pw@127.0.0.1:{server.port}/0"):
            with RedisStore(url, retry_s=0.3) as store:
                # An outage would end as "redis unreachable" after retry_s; this names the cause.
                with pytest.raises(StoreError, match="refused the credentials") as info:
                    store.put_main_stats(1, batch())
                assert "wrong-pw" not in str(info.value)


def test_redis_tls_from_a_rediss_url(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (it makes the test certificate)")
    cert, key = self_signed_cert(tmp_path)
    with _redis_with(tmp_path, password="tls-pw", tls=(cert, key)) as server:
        assert server.url.startswith("rediss://:tls-pw@127.0.0.1:")
        # The server speaks only TLS: the store's ``rediss://`` URL, with the test CA and
        # certificate checks on (redis-py's query options), connects and authenticates.
        verified = f"{server.url}?ssl_cert_reqs=required&ssl_ca_certs={cert}"
        with open_store(verified, retry_s=5) as store:
            assert repr(store).startswith("RedisStore('rediss://127.0.0.1:")
            store.put_main_stats(0, batch())
            assert store.get_main_stats(0, expected=B * K, timeout_s=1) == batch()
        # Certificate checks really run: without the CA the self-signed certificate is refused...
        with RedisStore(f"{server.url}?ssl_cert_reqs=required", retry_s=0.3) as store, pytest.raises(StoreError):
            store.put_main_stats(1, batch())
        # ...and a plain redis:// URL to the TLS port gets no answer.
        plain = server.url.replace("rediss://", "redis://")
        with RedisStore(plain, retry_s=0.3, socket_timeout_s=1.0) as store, pytest.raises(StoreError):
            store.put_main_stats(1, batch())
