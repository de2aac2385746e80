"""Concurrent OpenEnv sessions: 16 clients of one ``mgrpo serve-env`` for a set time, against the same
episodes in process.

    .venv/bin/python benchmarks/openenv_sessions.py [--sessions 16] [--duration 60] [--entities 300] [--quick]
    .venv/bin/python benchmarks/openenv_sessions.py --duration 600        # the issue's 10-minute target

Each of ``--sessions`` threads runs the scripted oracle (main and sub-agents) through whole episodes on
its own client (a fresh server session per episode), seeds drawn in turn, until the time is up; every
exception is an error, counted and kept. After the clients have closed, the server's ``GET /sessions``
must come back to 0 sessions and 0 browser pages (else they leaked). Then the same number of threads
run the same oracle on in-process envs (one env each, one shared world) for the same time: env steps/s
over HTTP vs in process, side by side (the policy's time is in both). Prints a table and writes
benchmarks/results/openenv_sessions.json (``--quick``: results/quick/).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import httpx  # noqa: E402

import mgrpo_env  # noqa: E402
from mgrpo_env.openenv_client import MGRPOEnvClient  # noqa: E402
from mgrpo_env.openenv_types import AgentAction  # noqa: E402
from mgrpo_env.rollout import PolicyRequest  # noqa: E402
from mgrpo_env.scripted import OraclePolicy  # noqa: E402
from mgrpo_scenarios import Task  # noqa: E402

ROLES = ("main", "sub")


class _Tally:
    """What the session threads count, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.episodes = self.steps = self.correct = 0
        self.errors: list[str] = []

    def add(self, steps: int, correct: bool) -> None:
        with self.lock:
            self.episodes += 1
            self.steps += steps
            self.correct += int(correct)

    def error(self, exc: BaseException) -> None:
        with self.lock:
            self.errors.append(f"{type(exc).__name__}: {exc}"[:500])


def _keep_going(done: int, deadline: float, episodes_per_session: int) -> bool:
    return done < episodes_per_session or time.monotonic() < deadline


def _wire_session(url: str, policies: dict[str, Any], tasks: dict[str, Task], seeds: Any, deadline: float,
                  episodes_per_session: int, tally: _Tally) -> None:
    """One client: whole oracle episodes, a fresh server session each, until the time is up. The oracle
    reads its task here, by the id ``state()`` gives (the server keeps the gold answer until the end)."""
    client = MGRPOEnvClient(url).sync()
    done = 0
    try:
        while _keep_going(done, deadline, episodes_per_session):
            done += 1
            try:
                result = client.reset(seed=next(seeds))
                task = tasks[client.state().task["id"]]
                steps = 0
                while not result.done:
                    obs = result.observation
                    role = "main" if obs.agent == "main_0" else "sub"
                    request = PolicyRequest(episode=0, agent=obs.agent, role=role, observation=obs.text,
                                            messages=obs.messages, task=task)
                    result = client.step(AgentAction(agent=obs.agent, text=policies[role]([request])[0]))
                    steps += 1
                tally.add(steps, bool(result.observation.record["correct"]))
            except Exception as exc:  # noqa: BLE001 - every failure is counted, and the next episode reconnects
                tally.error(exc)
    finally:
        client.close()


def _local_session(scenario: Any, world: Any, split: str, policies: dict[str, Any], seeds: Any, deadline: float,
                   episodes_per_session: int, tally: _Tally) -> None:
    """The same episodes on an in-process env of this thread's own, over the shared world."""
    env = mgrpo_env.raw_env(scenario=scenario, split=split, world=world)
    done = 0
    try:
        while _keep_going(done, deadline, episodes_per_session):
            done += 1
            env.reset(seed=next(seeds))
            steps = 0
            while not env.record.end_reason:
                agent = env.agent_selection
                role = env.infos[agent]["role"]
                request = PolicyRequest(episode=0, agent=agent, role=role, observation=env.observe(agent)["text"],
                                        messages=env.infos[agent]["messages"], task=env.task)
                env.step(policies[role]([request])[0])
                steps += 1
            tally.add(steps, env.record.correct)
    finally:
        env.close()


def _run_threads(target: Any, sessions: int, *args: Any) -> float:
    threads = [threading.Thread(target=target, args=args, daemon=True) for _ in range(sessions)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def _seeds() -> Any:
    counter = itertools.count()
    lock = threading.Lock()

    class Seeds:
        def __next__(self) -> int:
            with lock:
                return next(counter)

    return Seeds()


def run_sessions(url: str, scenario: Any, *, sessions: int = 16, duration_s: float = 60.0,
                 episodes_per_session: int = 0, split: str = "stage2/test", leak_wait_s: float = 60.0) -> dict[str, Any]:
    """``sessions`` oracle clients of the server at ``url`` for ``duration_s`` (and at least
    ``episodes_per_session`` episodes each): episodes, steps, correct answers, errors, wall time, and
    the sessions and browser pages still open on the server afterwards."""
    policies = {role: OraclePolicy(scenario, role) for role in ROLES}
    tasks = {task.id: task for task in scenario.tasks(split)}
    tally = _Tally()
    wall = _run_threads(_wire_session, sessions, url, policies, tasks, _seeds(), time.monotonic() + duration_s,
                        episodes_per_session, tally)
    deadline = time.monotonic() + leak_wait_s
    while True:  # a session is closed when the server sees the disconnect: give it a moment
        left = httpx.get(f"{url}/sessions", timeout=30).json()
        if (left["active_sessions"] == 0 and left["browser_pages"] == 0) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {"episodes": tally.episodes, "steps": tally.steps, "correct": tally.correct, "errors": tally.errors,
            "wall_s": wall, "leaked_sessions": left["active_sessions"], "leaked_browser_pages": left["browser_pages"]}


def run_in_process(scenario: Any, *, sessions: int, duration_s: float, split: str) -> dict[str, Any]:
    policies = {role: OraclePolicy(scenario, role) for role in ROLES}
    tally = _Tally()
    with scenario.open() as world:
        wall = _run_threads(_local_session, sessions, scenario, world, split, policies, _seeds(),
                            time.monotonic() + duration_s, 0, tally)
    return {"episodes": tally.episodes, "steps": tally.steps, "correct": tally.correct, "wall_s": wall}


def main() -> None:
    from common import report

    from mgrpo_algo.experiments.serve_env_cli import ServeEnvProcess
    from mgrpo_scenarios.wiki_hops import WikiHops

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of each side (the issue's target: 600)")
    parser.add_argument("--entities", type=int, default=300)
    parser.add_argument("--split", default="stage2/test")
    parser.add_argument("--quick", action="store_true", help="4 sessions for 10 s")
    args = parser.parse_args()
    sessions, duration = (4, 10.0) if args.quick else (args.sessions, args.duration)
    with tempfile.TemporaryDirectory() as tmp:
        scenario = WikiHops(seed=0, num_entities=args.entities, data_dir=tmp)
        scenario.build()
        serve_args = ["--set", f"num_entities={args.entities}", "--set", f"data_dir={tmp}", "--split", args.split,
                      "--port", "0"]
        with ServeEnvProcess(*serve_args) as server:
            wire = run_sessions(server.url, scenario, sessions=sessions, duration_s=duration, split=args.split)
        local = run_in_process(scenario, sessions=sessions, duration_s=duration, split=args.split)
    wire_rate, local_rate = wire["steps"] / wire["wall_s"], local["steps"] / local["wall_s"]
    rows = [
        ("sessions at once", sessions, "clients, each a fresh server session per episode"),
        ("duration", duration, "s per side"),
        ("episodes over HTTP", wire["episodes"], f"{wire['correct']} correct"),
        ("errors over HTTP", len(wire["errors"]), "exceptions in the clients (target 0)"),
        ("leaked sessions", wire["leaked_sessions"], "open on the server after every client closed (target 0)"),
        ("leaked browser pages", wire["leaked_browser_pages"], "open in the server's browser afterwards (target 0)"),
        ("env steps/s over HTTP", wire_rate, "WebSocket round trips, the oracle's time included"),
        ("episodes in process", local["episodes"], f"{local['correct']} correct"),
        ("env steps/s in process", local_rate, "same threads, same oracle, one env each"),
        ("HTTP / in process", wire_rate / local_rate if local_rate else 0.0, "ratio of steps/s"),
    ]
    report("openenv_sessions", rows, {"wire": wire, "in_process": local,
                                      "command": " ".join([Path(sys.executable).name, *sys.argv])})


if __name__ == "__main__":
    main()
