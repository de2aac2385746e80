"""Fault soak: thousands of tool calls from random and hostile agents, through the AEC env, against a
web that misbehaves on purpose (``mgrpo_tools.faultserver``).

A small wiki-hops world is opened; the fault server (127.0.0.1 only) is let through the world's URL
policy explicitly, as the virtual origin ``http://faults.test`` (nothing in the defaults changes).
Several envs share that world, one per thread. Each episode is driven either by random agents
(``RandomPolicy``: samples of the protocol's action space, well-formed or not) or by hostile scripted
agents: the main agent delegates, its sub-agents visit fault pages, forbidden addresses (loopback,
metadata, site-local IPv6, Teredo, file:, credentials), send malformed arguments, click links that do
not exist, call tools they do not have, then report.

Checked, and printed as a table (JSON under ``benchmarks/results/fault_soak.json``):
- exceptions out of ``env.step`` (must be 0);
- for every fault, the outcome of each visit: the error kind (``http``, ``timeout``, ``content``,
  ``policy``, ``arguments``) or ``ok``; a fault must always give the same outcome (stable);
- every episode record is complete (an end reason, a reward for every agent, every tool call turn
  has its record, every failed call an ``error`` of the form ``kind: message``, JSON round trip);
- memory over time: every ``--sample-every`` episodes, this process's RSS, open files, threads,
  glibc's heap (in use / held free), Python's object count, and its children's RSS (Chromium and
  its helpers); the fault server runs in a child process of its own, counted apart, so that its
  threads and buffers are not what is measured. The growth after ``--warmup-episodes`` is judged
  (first and last sample, least-squares slope per 1,000 episodes, projected over 10,000: the
  target is < 10%), and plotted (``results/<name>.png``).

    PYTHONPATH=. .venv/bin/python benchmarks/fault_soak.py              # >= 10,000 tool calls
    PYTHONPATH=. .venv/bin/python benchmarks/fault_soak.py --calls 300  # a quick look
    PYTHONPATH=. .venv/bin/python benchmarks/fault_soak.py --episodes 10000 --sample-every 100
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing
import random
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, report  # noqa: E402
from soak_common import growth, malloc_mb, plot_samples, tree_sample  # noqa: E402

from mgrpo_env.aec import MGRPOEnv  # noqa: E402
from mgrpo_env.episode import EpisodeRecord  # noqa: E402
from mgrpo_env.scripted import RandomPolicy  # noqa: E402
from mgrpo_tools.faultserver import FAULTS, VIRTUAL_ORIGIN, FaultServer, admit  # noqa: E402

FAULT_ORIGIN = VIRTUAL_ORIGIN
# Slow faults (a timeout, a CPU-heavy inflate, a browser render) are drawn less often.
WEIGHTS = {"/drip": 0.3, "/gzip-bomb": 0.3, "/js-never-settles": 0.15, "/js-busy-loop": 0.08, "/tick": 0.0}
HOSTILE_URLS = [
    "http://127.0.0.1:{port}/ok",  # the fault server's real origin: never allowed by itself
    "http://169.254.169.254/latest/meta-data/",
    "http://[fec0::1]/",
    "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
    "http://localhost:6379/",
    "file:///etc/passwd",
    "gopher://example.org/",
    "http://user:pw@faults.test/ok",
    "javascript:alert(1)",
    "http://faults.test:8080/ok",  # the virtual host on another port
    "http://" + "a" * 3000 + ".test/",
]
BAD_ARGUMENTS: list[dict[str, Any]] = [
    {"url": 5, "goal": "x"},
    {"goal": "no url"},
    {"url": FAULT_ORIGIN + "/ok", "goal": "x", "page": -3},
    {"url": FAULT_ORIGIN + "/ok", "goal": "x", "page": 10**12},
    {"url": FAULT_ORIGIN + "/ok", "goal": ["not", "a", "string"]},
    {"url": FAULT_ORIGIN + "/ok", "goal": "x" * 5000},
]


def tool_call(name: str, arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class Hostile:
    """A scripted hostile agent for both roles; remembers which fault each of its visits asked for."""

    def __init__(self, rng: random.Random, fault_port: int) -> None:
        self.rng = rng
        self.port = fault_port
        paths = [p for p in FAULTS if WEIGHTS.get(p, 1.0) > 0]
        self.paths, self.weights = paths, [WEIGHTS.get(p, 1.0) for p in paths]

    def main(self, turn: int) -> str:
        if turn < 2 and self.rng.random() < 0.9:
            return tool_call("delegate", {"task": "Read the pages at faults.test and report."})
        return "<answer>unknown</answer>"

    def sub(self, turn: int) -> str:
        roll = self.rng.random()
        if turn >= 6 or roll < 0.04:
            return "<result>nothing useful</result>"
        if roll < 0.62:
            fault = self.rng.choices(self.paths, self.weights)[0]
            text = tool_call("visit", {"url": f"{FAULT_ORIGIN}{fault}?n={self.rng.randrange(10**9)}", "goal": "facts"})
        elif roll < 0.74:
            url = self.rng.choice(HOSTILE_URLS).format(port=self.port)
            text = tool_call("visit", {"url": url, "goal": "secrets"})
        elif roll < 0.84:
            text = tool_call("visit", self.rng.choice(BAD_ARGUMENTS))
        elif roll < 0.91:
            text = tool_call("click", {"link": self.rng.choice([0, 99, "no such anchor", None, True, 2.5])})
        elif roll < 0.96:
            text = tool_call("search", {"queries": [self.rng.choice(["river", "\x00\x01", "a" * 400, "'\""])]})
        else:
            text = tool_call(self.rng.choice(["delegate", "shell", "visit "]), {"cmd": "rm -rf /"})
        return text


def fault_path(url: Any) -> str | None:
    """The fault a visit asked for: ``http://faults.test/<fault>?n=...`` exactly, else None."""
    if not isinstance(url, str):
        return None
    parts = urlsplit(url)
    if f"{parts.scheme}://{parts.netloc}" == FAULT_ORIGIN and parts.query.startswith("n=") and parts.path in FAULTS:
        return parts.path
    return None


def kind_of(error: str | None) -> str:
    return "ok" if not error else error.split(":", 1)[0]


def check_record(record: EpisodeRecord) -> list[str]:
    """What is missing from a finished episode's record ([] when complete)."""
    problems = []
    if record.end_reason not in ("answer", "main_turn_limit"):
        problems.append(f"end_reason={record.end_reason!r}")
    agents = [record.main] + list(record.subs) if record.main is not None else []
    if not agents:
        problems.append("no main trajectory")
    for traj in agents:
        if traj.agent not in record.rewards:
            problems.append(f"no reward for {traj.agent}")
        for turn in traj.turns:
            if turn.kind == "tool_call" and turn.tool_call is None:
                problems.append(f"{traj.agent}: a tool_call turn without its record")
            call = turn.tool_call
            if call is not None and not call.ok and (not call.error or ":" not in call.error):
                problems.append(f"{traj.agent}: failed call without 'kind: message' ({call.error!r})")
    try:
        again = EpisodeRecord.from_dict(json.loads(json.dumps(record.to_dict())))
        if again.to_dict() != json.loads(json.dumps(record.to_dict())):
            problems.append("JSON round trip changed the record")
    except Exception as exc:  # noqa: BLE001 - reported as a problem
        problems.append(f"not JSON-serialisable: {exc}")
    return problems


class Soak:
    def __init__(self, scenario: Any, world: Any, fault_port: int, seed: int, *, sample_every: int = 0,
                 apart: tuple[int, ...] = ()) -> None:
        self.scenario, self.world, self.port, self.seed = scenario, world, fault_port, seed
        self.lock = threading.Lock()
        self.calls = 0
        self.main_calls = 0
        self.episodes = 0
        self.exceptions: list[str] = []
        self.incomplete: list[str] = []
        self.outcomes: dict[str, Counter[str]] = defaultdict(Counter)
        self.rss: list[tuple[int, float, float]] = []
        self.sample_every = sample_every
        self.apart = apart  # processes sampled apart (the fault server)
        self.samples: list[dict[str, Any]] = []
        self.started = time.perf_counter()

    def worker(self, index: int, stop: Callable[[], bool]) -> None:
        """Episodes on this thread's env until ``stop()`` (asked under the lock) says enough."""
        env = MGRPOEnv(self.scenario, "stage1", world=self.world, max_main_turns=4, max_sub_turns=8,
                       max_delegations=2)
        rng = random.Random(self.seed * 1000 + index)
        episode = 0
        while True:
            with self.lock:
                if stop():
                    break
            episode += 1
            self.run_episode(env, rng, seed=self.seed * 100_000 + index * 10_000 + episode)
        env.close()

    def sample(self) -> dict[str, Any]:
        """One memory sample, taken by the thread that finished the episode (under the lock)."""
        row = {"episodes": self.episodes, "calls": self.calls, "t_s": round(time.perf_counter() - self.started, 1),
               **tree_sample(apart=self.apart), "malloc_mb": malloc_mb(), "python_objects": len(gc.get_objects())}
        self.samples.append(row)
        return row

    def run_episode(self, env: MGRPOEnv, rng: random.Random, seed: int) -> None:
        hostile = rng.random() < 0.75
        agent_h = Hostile(rng, self.port)
        randoms = {"main": RandomPolicy("main", seed=seed), "sub": RandomPolicy("sub", seed=seed + 1)}
        turns: Counter[str] = Counter()
        try:
            env.reset(seed=seed)
            for agent in env.agent_iter(max_iter=200):
                _obs, _reward, termination, truncation, _info = env.last()
                if termination or truncation:
                    env.step(None)
                    continue
                role = "main" if agent.startswith("main") else "sub"
                if hostile:
                    action = agent_h.main(turns[agent]) if role == "main" else agent_h.sub(turns[agent])
                else:
                    action = randoms[role].space.sample()  # what RandomPolicy answers
                turns[agent] += 1
                env.step(action)
        except Exception:  # noqa: BLE001 - the figure this benchmark exists for
            with self.lock:
                self.exceptions.append(traceback.format_exc(limit=6))
            return
        record = env.record
        assert record is not None
        problems = check_record(record)
        sub_calls = [c for s in record.subs for c in s.tool_calls]
        main_calls = record.main.tool_calls if record.main is not None else []
        with self.lock:
            self.episodes += 1
            self.calls += len(sub_calls) + len(main_calls)
            if self.sample_every and self.episodes % self.sample_every == 0:
                row = self.sample()
                print(f"  {row['episodes']} episodes, {row['calls']} calls, rss {row['rss_mb']:.0f} MB, "
                      f"heap in use {row['malloc_mb'].get('in_use', 0):.0f} MB, {row['threads']} threads, "
                      f"{row['fds']} fds, children {row['children_rss_mb']:.0f} MB", flush=True)
            self.main_calls += len(main_calls)
            if problems:
                self.incomplete.append(f"{record.episode_id}: {problems}")
            if hostile:
                for call in sub_calls:
                    path = fault_path(call.arguments.get("url")) if call.tool == "visit" else None
                    if path is not None:
                        label = kind_of(call.error)
                        browser = call.meta.get("browser_error")
                        if browser:  # the plain page was shown; say why it was not rendered
                            label += f" (browser {kind_of(str(browser))})"
                        self.outcomes[path][label] += 1
                    else:
                        self.outcomes["(hostile, not a fault page)"][kind_of(call.error)] += 1
            else:
                for call in sub_calls + main_calls:
                    self.outcomes["(random agent)"][kind_of(call.error)] += 1


def rss_mb(apart: tuple[int, ...] = ()) -> tuple[float, float]:
    """(this process, its child processes but those in ``apart``: Chromium and its helpers) RSS in MB."""
    row = tree_sample(apart=apart)
    return row["rss_mb"], row["children_rss_mb"]


def _serve_faults(drip_s: float, conn: Any) -> None:
    with FaultServer(drip_s=drip_s) as faults:
        conn.send(faults.origin)
        conn.recv()  # until the soak says stop (or its end of the pipe closes)


@contextlib.contextmanager
def fault_server_process(drip_s: float) -> Iterator[tuple[str, int]]:
    """The fault server in a child process of its own: ``(origin, pid)``. Its thread per connection
    and its 50 MB bodies are then not part of the memory this soak measures."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_serve_faults, args=(drip_s, theirs), daemon=True, name="mgrpo-faults")
    proc.start()
    try:
        if not ours.poll(60):
            raise RuntimeError("the fault server did not start within 60 s")
        yield ours.recv(), int(proc.pid or 0)
    finally:
        with contextlib.suppress(OSError):
            ours.send("stop")
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10_000, help="tool calls to make (at least)")
    parser.add_argument("--episodes", type=int, default=0,
                        help="episodes to run after the warm-up calls instead of --calls (0: stop on --calls)")
    parser.add_argument("--sample-every", type=int, default=50, help="a memory sample every this many episodes")
    parser.add_argument("--warmup-episodes", type=int, default=300,
                        help="episodes before the growth is judged (threads, pools and the page memo filling)")
    parser.add_argument("--max-minutes", type=float, default=0,
                        help="stop starting episodes after this long (0: no limit); the results are written")
    parser.add_argument("--name", default="fault_soak", help="results file: benchmarks/results/<name>.json and .png")
    parser.add_argument("--threads", type=int, default=6, help="envs run at once, one per thread")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=300, help="calls on one thread before the others start")
    args = parser.parse_args()

    from mgrpo_scenarios.wiki_hops import WikiHops
    from mgrpo_tools.browser import BrowserFetcher
    from mgrpo_tools.fetch import HttpFetcher

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mgrpo-soak-") as data, fault_server_process(drip_s=20) as (origin, pid):
        scenario = WikiHops(seed=0, num_entities=300, data_dir=data)
        with scenario.open() as world:
            # The only change to the world's policy: the fault site, by name, as a virtual origin.
            admit(world.policy, origin)
            # Shorter limits than the defaults, so that the drip and the busy page cost seconds,
            # not tens of seconds; the fetchers are otherwise the world's own kind.
            world.http.close()
            world.browser.close()
            world.http = HttpFetcher(world.policy, timeout_s=3.0)
            world.browser = BrowserFetcher(world.policy, timeout_s=10.0, max_idle_wait_s=0.5)
            port = int(origin.rsplit(":", 1)[1])
            soak = Soak(scenario, world, port, args.seed, sample_every=args.sample_every, apart=(pid,))

            warmup = min(args.warmup, args.calls) if not args.episodes else args.warmup
            soak.worker(0, lambda: soak.calls >= warmup)  # warm-up: Chromium started, pools filled
            rss_start = rss_mb((pid,))
            soak.rss.append((soak.calls, *rss_start))
            first_episode = soak.episodes
            deadline = started + 60 * args.max_minutes if args.max_minutes else float("inf")

            def stop() -> bool:
                if time.perf_counter() > deadline:
                    return True
                if args.episodes:
                    return soak.episodes - first_episode >= args.episodes
                return soak.calls >= args.calls
            threads = [threading.Thread(target=soak.worker, args=(i + 1, stop)) for i in range(args.threads)]
            for thread in threads:
                thread.start()
            while any(t.is_alive() for t in threads):
                time.sleep(5)
                soak.rss.append((soak.calls, *rss_mb((pid,))))
                if not args.sample_every:
                    print(f"  {soak.calls} calls, {soak.episodes} episodes, rss {soak.rss[-1][1]:.0f} MB", flush=True)
            for thread in threads:
                thread.join()
            rss_end = rss_mb((pid,))
            soak.rss.append((soak.calls, *rss_end))
            with soak.lock:
                soak.sample()
    wall = time.perf_counter() - started
    return finish(args, soak, rss_start, rss_end, wall)


def finish(args: argparse.Namespace, soak: Soak, rss_start: tuple[float, float], rss_end: tuple[float, float],
           wall: float) -> int:
    """Judge, print and write the results; the exit status."""
    # A fault is stable when every call gave the same outcome; a "timeout" on a fast fault is counted
    # apart (the machine was too loaded to answer within the soak's limits), and shown in the table.
    unstable = {path: dict(c) for path, c in soak.outcomes.items()
                if path in FAULTS and len([k for k in c if k != "timeout" or path == "/drip"]) > 1}
    load_timeouts = sum(c["timeout"] for p, c in soak.outcomes.items() if p in FAULTS and p != "/drip")
    rows: list[tuple[str, Any, str]] = [
        ("tool calls", soak.calls, f"{soak.main_calls} by main agents (delegate), the rest by sub-agents"),
        ("episodes", soak.episodes, f"{args.threads} envs in threads, one shared world"
                                    + (f" (asked for {args.episodes} after the warm-up)" if args.episodes else "")),
        ("exceptions out of env.step", len(soak.exceptions), "must be 0"),
        ("incomplete episode records", len(soak.incomplete), "must be 0"),
        ("faults with more than one outcome", len(unstable), "must be 0 (stable error kinds; timeouts apart)"),
        ("timeouts on faults that are not /drip", load_timeouts, "a loaded machine answering after the soak's 3 s"),
        ("RSS after warm-up", rss_start[0], f"MB (Chromium and helpers: {rss_start[1]:.0f} MB)"),
        ("RSS at the end", rss_end[0], f"MB (Chromium and helpers: {rss_end[1]:.0f} MB)"),
        ("RSS growth", rss_end[0] - rss_start[0], "MB, this process, from the one-thread warm-up"),
        ("wall time", wall, "s"),
    ]
    judged = judge_samples(soak.samples, args.warmup_episodes)
    rss = judged.get("rss_mb", {})
    if rss:
        rows += [
            ("RSS growth after warm-up", rss["growth_pct"],
             f"% from episode {rss['from_x']} ({rss['first']:.0f} MB) to {rss['to_x']} ({rss['last']:.0f} MB); target < 10"),
            ("RSS slope after warm-up", rss["slope_per_1000"], "MB per 1,000 episodes (least squares)"),
            ("RSS projected over 10,000 episodes", rss["projected_pct_per_10000"], "% of the warm-up RSS, from the slope"),
        ]
        for key, label in (("fds", "open files"), ("threads", "threads"), ("children", "child processes")):
            if judged.get(key):
                rows.append((f"{label} after warm-up", f"{judged[key]['first']:.0f} -> {judged[key]['last']:.0f}",
                             f"max {judged[key]['max']:.0f}"))
    for path in sorted(soak.outcomes):
        counts = soak.outcomes[path]
        shown = ", ".join(f"{label} x{n}" for label, n in counts.most_common())
        rows.append((f"  {path}", sum(counts.values()), shown))
    xs = [row["episodes"] for row in soak.samples]
    plot = plot_samples(RESULTS / f"{args.name}.png", xs, {
        "this process (RSS)": [row["rss_mb"] for row in soak.samples],
        "glibc heap in use": [row["malloc_mb"].get("in_use") for row in soak.samples],
        "glibc heap held free": [row["malloc_mb"].get("free") for row in soak.samples],
        "Chromium and helpers (RSS)": [row["children_rss_mb"] for row in soak.samples],
    }, xlabel="episodes", title="fault soak: memory over episodes", warmup=args.warmup_episodes) if xs else None
    report(args.name, rows, {
        "growth_after_warmup": judged,
        "samples": soak.samples,
        "plot": str(plot) if plot else None,
        "outcomes": {p: dict(c) for p, c in soak.outcomes.items()},
        "unstable": unstable,
        "exceptions": soak.exceptions[:20],
        "incomplete": soak.incomplete[:20],
        "rss_mb": [{"calls": c, "process": a, "children": b} for c, a, b in soak.rss],
        "command": " ".join(sys.argv),
    })
    return 0 if not soak.exceptions and not soak.incomplete and not unstable else 1


def judge_samples(samples: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """The growth after ``warmup`` episodes of each sampled figure (see soak_common.growth)."""
    xs = [row["episodes"] for row in samples]
    out = {key: growth(xs, [row[key] for row in samples], warmup)
           for key in ("rss_mb", "fds", "threads", "children", "children_rss_mb", "python_objects")}
    out["heap_in_use_mb"] = growth(xs, [row["malloc_mb"].get("in_use") for row in samples], warmup)
    return out


if __name__ == "__main__":
    sys.exit(main())
