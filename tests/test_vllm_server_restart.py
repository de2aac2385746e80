"""The launched server's restart diagnosis without a vLLM engine: a process stands in for the server (no
port answers /health), so what is checked is how ``VLLMServer.ensure_up`` tells a death from a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from mgrpo_algo.policies.vllm_server import VLLMServer, free_port


class _Unreaped:
    """A server process as ``poll`` sees it just after a SIGKILL: still there for its first ``calls``
    polls (the kernel is tearing it down), then as it is."""

    def __init__(self, proc: subprocess.Popen, calls: int) -> None:
        self.proc, self.calls = proc, calls
        self.pid = proc.pid

    def poll(self):
        if self.calls > 0:
            self.calls -= 1
            return None
        return self.proc.poll()

    def wait(self, timeout=None):
        return self.proc.wait(timeout=timeout)

    @property
    def returncode(self):
        return self.proc.returncode


@pytest.fixture()
def server(tmp_path, monkeypatch):
    server = VLLMServer(tmp_path, name="main", python=sys.executable, port=free_port())
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    server.ready = True  # it had answered /health: a failure now is a death or a hang, not a slow start
    monkeypatch.setattr(server, "start", lambda wait=True: None)  # the restart itself is not under test
    monkeypatch.setattr(server, "stop", lambda grace_s=15.0: None)
    yield server, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_server_killed_a_moment_ago_is_reported_dead_with_its_signal(server, capsys):
    server, proc = server
    server.proc = _Unreaped(proc, calls=3)  # every check before the grace still sees it running
    os.killpg(proc.pid, signal.SIGKILL)
    assert server.ensure_up("ReadError: [Errno 104] Connection reset by peer") == "restarted"
    assert server.restarts[0]["why"] == "died (exit code -9, SIGKILL)"
    assert "the vLLM server at" in capsys.readouterr().out


def test_an_unhealthy_server_that_stays_alive_is_hung(server):
    server, proc = server
    server.proc, server.exit_grace_s = proc, 0.2
    assert server.ensure_up("ReadTimeout") == "restarted"
    assert server.restarts[0]["why"] == "hung (no answer to /health in 10 s)"
