"""The served engine's watchdog without an engine: ``VLLMServer`` supervises tests/fake_engine.py (a loopback
server process standing in for vLLM's entry point) that answers ``/health`` 503 (what vLLM answers once its
engine died), hangs, drops the connection, dies, crashes while loading or starts slowly. ``healthy()``,
``wait_ready`` and ``ensure_up`` are checked on what they do to the real process: left alone, waited for,
or killed and started again (a new process that answers)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from mgrpo_algo.policies import vllm_server
from mgrpo_algo.policies.vllm_server import VLLMServer, VLLMServerError

FAKE = Path(__file__).with_name("fake_engine.py")


@pytest.fixture()
def make_server(tmp_path, monkeypatch):
    """``make_server(mode, then=None, delay=0)``: a VLLMServer whose process is the fake engine in ``mode``;
    a restart starts it in ``then`` (default ``ok``). Every process is killed at the end."""
    monkeypatch.setattr(vllm_server, "engine_refusal", lambda python=None: None)  # no vLLM installed: not needed
    servers: list[VLLMServer] = []

    def make(mode: str = "ok", then: str = "ok", delay: float = 0.0, **kwargs) -> VLLMServer:
        options = {"health_timeout_s": 0.5, "start_timeout_s": 30.0, **kwargs}
        server = VLLMServer(tmp_path / "model", name="main", python=sys.executable,
                            log_path=tmp_path / f"server{len(servers)}.log", **options)
        server.exit_grace_s = 0.2
        modes = [(mode, delay)]

        def command() -> list[str]:
            m, d = modes.pop(0) if modes else (then, 0.0)
            # -S: the fake needs only the standard library, and starts faster without site-packages
            return [sys.executable, "-S", str(FAKE), "--port", str(server.port), "--mode", m, "--delay", str(d)]

        server.command = command
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop(grace_s=0.5)


def _listening(server: VLLMServer, timeout_s: float = 20.0) -> None:
    """Wait until the server process accepts connections (whatever it answers)."""
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex((server.host, server.port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError("the fake engine did not listen")


def test_a_healthy_server_is_left_alone(make_server):
    server = make_server("ok").start()
    pid = server.pid
    assert server.ready and server.healthy() and len(server.start_s) == 1
    assert server.ensure_up("ReadTimeout") == "up"
    assert server.pid == pid and server.restarts == [] and server.alive()


@pytest.mark.parametrize("mode", ["503", "hang", "drop"])
def test_an_alive_server_that_does_not_answer_health_is_killed_and_started_again(make_server, mode, capsys):
    """503 (its engine died), no answer at all, or a dropped connection: alive, not healthy -> hung."""
    server = make_server(mode, then="ok").start(wait=False)
    _listening(server)
    server.ready = True  # it had answered /health: this is no slow start
    old = server.proc
    t0 = time.monotonic()
    assert not server.healthy()
    assert time.monotonic() - t0 < 5  # a hanging server is given up on after health_timeout_s, not waited for
    assert server.ensure_up("ReadTimeout: timed out") == "restarted"
    assert old.poll() is not None  # the old process is gone, not left behind
    assert server.pid != old.pid and server.alive() and server.healthy() and server.ready
    assert [r["why"] for r in server.restarts] == ["hung (no answer to /health in 0.5 s)"]
    assert server.restarts[0]["problem"] == "ReadTimeout: timed out"
    out = capsys.readouterr().out
    assert f"served engine main: the vLLM server at {server.url} hung" in out and "after: ReadTimeout" in out


def test_a_dead_server_is_started_again_and_says_how_it_died(make_server, capsys):
    server = make_server("ok").start()
    old = server.proc
    os.killpg(old.pid, signal.SIGTERM)
    old.wait(timeout=10)
    assert not server.healthy()
    assert server.ensure_up("ConnectError: refused") == "restarted"
    assert server.restarts[0]["why"] == "died (exit code -15, SIGTERM)"
    assert server.alive() and server.healthy() and server.pid != old.pid
    assert "died (exit code -15, SIGTERM) after: ConnectError: refused; restarting it from" in capsys.readouterr().out


def test_a_server_still_starting_is_waited_for_not_restarted(make_server):
    server = make_server("ok", delay=1.0).start(wait=False)
    pid = server.pid
    assert not server.healthy()
    assert server.ensure_up("ConnectError: refused") == "waited"
    assert server.pid == pid and server.ready and server.healthy() and server.restarts == []
    assert len(server.start_s) == 1 and server.start_s[0] >= 1.0


def test_failures_together_restart_the_server_once(make_server):
    server = make_server("ok").start()
    server.kill()
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(server.ensure_up("ConnectError"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == ["restarted", "up", "up", "up"] and len(server.restarts) == 1
    assert server.restarts[0]["why"] == "died (exit code -9, SIGKILL)"


def test_a_start_that_crashes_or_never_answers_raises_with_the_reason(make_server):
    crashed = make_server("crash")
    with pytest.raises(VLLMServerError, match=r"^main: the vLLM server exited while starting \(exit code 3\)"):
        crashed.start()
    slow = make_server("503", start_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(VLLMServerError, match=r"did not answer /health within 1 s"):
        slow.start()
    # it waited its timeout out (how much longer is the machine's speed, not the watchdog's behaviour)
    assert time.monotonic() - t0 >= 1.0 and slow.alive() and not slow.ready
