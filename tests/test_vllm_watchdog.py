"""The served engine's watchdog without an engine: ``VLLMServer`` supervises tests/fake_engine.py (a loopback
server process standing in for vLLM's entry point) that answers ``/health`` 503 (what vLLM answers once its
engine died), hangs, drops the connection, dies, crashes while loading or starts slowly. ``healthy()``,
``wait_ready`` and ``ensure_up`` are checked on what they do to the real process: left alone, waited for,
or killed and started again (a new process that answers)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
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
        options = {"health_timeout_s": 0.5, "start_timeout_s": 30.0, "log_path": tmp_path / f"server{len(servers)}.log",
                   **kwargs}
        server = VLLMServer(tmp_path / "model", name="main", python=sys.executable, **options)
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
    t0 = time.monotonic()
    assert server.ensure_up("ReadTimeout: timed out") == "restarted"
    took = time.monotonic() - t0
    # the old process is gone, not left behind, and killed outright: a hung engine gets no SIGTERM grace
    assert old.poll() == -signal.SIGKILL
    assert 0 < server.restarts[0]["seconds"] <= took
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
    t0 = time.monotonic()
    server = make_server("ok", delay=1.0).start(wait=False)
    pid = server.pid
    assert not server.healthy()
    assert server.ensure_up("ConnectError: refused") == "waited"
    took = time.monotonic() - t0
    assert server.pid == pid and server.ready and server.healthy() and server.restarts == []
    assert len(server.start_s) == 1 and 1.0 <= server.start_s[0] <= took


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
    with pytest.raises(VLLMServerError, match=r"^main: the vLLM server exited while starting \(exit code 3\)") as error:
        crashed.start()
    assert f"the end of {crashed.log_path}:" in str(error.value)  # the engine's own words, from its log
    assert str(error.value).endswith("fake engine: RuntimeError while loading the model")
    slow = make_server("503", start_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(VLLMServerError, match=r"did not answer /health within 1 s"):
        slow.start()
    # it waited its timeout out (how much longer is the machine's speed, not the watchdog's behaviour)
    assert time.monotonic() - t0 >= 1.0 and slow.alive() and not slow.ready


def test_a_server_that_died_while_loading_unwatched_is_restarted_and_the_line_reaches_the_log(make_server, tmp_path):
    """A launched server starts without waiting (launch_role_engine): one that dies while loading is found
    by the next failed request. Its line names the exit code (no signal) and, with no problem given, says
    nothing more; it reaches a run's log file (stdout is a file there, block-buffered) at once."""
    server = make_server("crash", then="ok").start(wait=False)
    assert server.proc.wait(timeout=20) == 3
    log = tmp_path / "run.log"
    with open(log, "w") as out, contextlib.redirect_stdout(out):
        assert server.ensure_up() == "restarted"
        written = log.read_text()  # before the file is closed: what a crash of the run would leave
    assert written == f"served engine main: the vLLM server at {server.url} died (exit code 3); restarting it from {server.model}\n"
    assert [(r["why"], r["problem"]) for r in server.restarts] == [("died (exit code 3)", "")]
    assert server.alive() and server.healthy() and server.ready


def test_a_death_by_a_signal_without_a_name_and_a_server_never_started(make_server):
    server = make_server("ok").start()
    rt_signal = signal.SIGRTMIN + 6  # a real-time signal: it kills, and Python's Signals has no name for it
    os.killpg(server.pid, rt_signal)
    server.proc.wait(timeout=10)
    assert server.ensure_up("ConnectError") == "restarted"
    assert server.restarts[0]["why"] == f"died (exit code -{int(rt_signal)})"
    assert server.alive() and server.healthy()
    # never started: a request's failure starts it; waiting for it says so at once
    never = make_server("ok")
    with pytest.raises(VLLMServerError, match=r"exited while starting \(exit code None\)"):
        never.wait_ready()
    assert never.ensure_up("ConnectError") == "restarted"
    assert never.restarts[0]["why"] == "died (exit code None)" and never.alive() and never.healthy()


def test_health_checks_ignore_a_proxy_set_in_the_environment(make_server, monkeypatch):
    """The server is on loopback: a proxy in the environment (common on clusters) must not route /health."""
    server = make_server("ok").start()
    dead = f"http://127.0.0.1:{vllm_server.free_port()}"
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, dead)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(httpx.HTTPError):  # what a client that trusts the environment gets here
        httpx.get(server.url + "/health", timeout=2.0)
    assert server.healthy() and server.ensure_up("ReadTimeout") == "up" and server.restarts == []


def test_a_start_is_refused_in_one_line_where_the_engine_python_cannot_run(tmp_path):
    missing = tmp_path / "no-venv" / "bin" / "python"
    server = VLLMServer(tmp_path / "model", name="main", python=str(missing))
    with pytest.raises(VLLMServerError, match=rf"^main: cannot run the vLLM Python {re.escape(str(missing))}: "):
        server.start()
    assert server.proc is None


def test_the_server_gets_its_environment_and_logs_to_a_new_folder(make_server, tmp_path):
    log = tmp_path / "run" / "logs" / "vllm-main.log"  # a run folder not made yet
    server = make_server("ok", log_path=log, env={"VLLM_CPU_KVCACHE_SPACE": "3", "MGRPO_FAKE_MARK": "m"}).start()
    assert server.healthy()
    shown = next(line for line in log.read_text().splitlines() if line.startswith("fake engine: environment ")).split()
    # the development endpoints on, the caller's variables over the defaults, no LoRA updating without LoRA
    assert {"VLLM_SERVER_DEV_MODE=1", "VLLM_CPU_KVCACHE_SPACE=3", "MGRPO_FAKE_MARK=m"} <= set(shown)
    assert not any(v.startswith("VLLM_ALLOW_RUNTIME_LORA_UPDATING") for v in shown)
    quiet = make_server("ok", log_path=None).start()  # no log: the output goes nowhere
    assert quiet.healthy() and quiet.ready


def test_a_wait_keeps_its_own_deadline_even_against_a_server_that_hangs(make_server):
    refusing = make_server("503").start(wait=False)
    _listening(refusing)
    t0 = time.monotonic()
    with pytest.raises(VLLMServerError, match=r"did not answer /health within 0.5 s"):
        refusing.wait_ready(timeout_s=0.5)  # not the 30 s start_timeout_s
    assert time.monotonic() - t0 < 10
    # each /health poll of a start has its own short limit: a server that accepts and never answers does
    # not hold the start for health_timeout_s
    hanging = make_server("hang", start_timeout_s=1.0, health_timeout_s=30.0)
    t0 = time.monotonic()
    with pytest.raises(VLLMServerError, match=r"did not answer /health within 1 s"):
        hanging.start()
    assert time.monotonic() - t0 < 10
