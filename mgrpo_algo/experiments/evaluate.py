"""Evaluate agents on a scenario split: accuracy (exact match, F1), per-kind breakdown, timings.

Two ways to run an agent:

* :func:`evaluate_agents` - policies through one of the envs (``collect``): the multi-agent system
  in the AEC env (one policy per role, e.g. the scripted :class:`~mgrpo_env.scripted.OraclePolicy`
  or learned ones) or the single-agent baseline in the Gymnasium env, reported the same way; the
  episodes are kept for ``mgrpo view``. :func:`evaluate_single` names the env.
* :func:`evaluate` - a plain function ``agent(task, tools) -> (answer, steps)``, e.g. the
  scenario's own oracle calling the tools directly.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from mgrpo_env import strict_json
from mgrpo_env.tool_health import call_failure
from mgrpo_scenarios import NeedsBuilding, Scenario, ShipsOracle, Task, Verdict, split_tasks
from mgrpo_scenarios.verifiers import token_f1

__all__ = ["TaskOutcome", "EvalReport", "evaluate", "evaluate_agents", "evaluate_single", "oracle_agent",
           "write_report"]

# An agent gets a task and a fresh set of tools and returns (answer, trace of tool steps).
Agent = Callable[[Task, dict[str, Any]], tuple[str, list[dict[str, Any]]]]


@dataclass
class TaskOutcome:
    """One task's result: the prediction, its verdict and what the tool calls cost."""

    task_id: str
    kind: str
    question: str
    gold: str
    prediction: str
    correct: bool
    f1: float
    seconds: float
    steps: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


@dataclass
class EvalReport:
    """Aggregate figures over a split; ``outcomes`` keeps every task (nothing is dropped)."""

    scenario: str
    split: str
    agent: str
    num_tasks: int
    exact_match: float
    f1: float
    by_kind: dict[str, dict[str, float]]
    build_seconds: float
    open_seconds: float
    eval_seconds: float
    seconds_per_task_median: float
    tool_calls: dict[str, int]
    tool_errors: dict[str, int]
    tool_latency_ms_median: dict[str, float]
    browser_visits: int | None
    tool_backend_failures: dict[str, int] = field(default_factory=dict)
    """Per kind (``mgrpo_env.tool_health``): the browser or a tool backend failed, results are degraded."""
    outcomes: list[TaskOutcome] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("outcomes")
        return data

    def table(self) -> str:
        from mgrpo_env.tool_health import backend_failure_line

        # a degraded run says so first, not only deep inside its episodes
        lines = [backend_failure_line(self.tool_backend_failures)] if self.tool_backend_failures else []
        lines += [
            f"{self.scenario} {self.split} - agent: {self.agent} - {self.num_tasks} tasks",
            f"{'kind':<14}{'n':>6}{'EM':>8}{'F1':>8}",
        ]
        for kind, row in sorted(self.by_kind.items()):
            lines.append(f"{kind:<14}{int(row['n']):>6}{row['exact_match']:>8.3f}{row['f1']:>8.3f}")
        lines.append(f"{'all':<14}{self.num_tasks:>6}{self.exact_match:>8.3f}{self.f1:>8.3f}")
        lines.append(
            f"world build {self.build_seconds:.1f}s, open {self.open_seconds:.2f}s, "
            f"eval {self.eval_seconds:.1f}s ({self.seconds_per_task_median * 1000:.0f} ms/task median)"
        )
        calls = ", ".join(
            f"{name} {n} calls ({self.tool_latency_ms_median.get(name, 0):.1f} ms median, {self.tool_errors.get(name, 0)} errors)"
            for name, n in sorted(self.tool_calls.items())
        )
        shown = "not recorded" if self.browser_visits is None else self.browser_visits
        lines.append(f"tools: {calls}; browser-rendered visits: {shown}")
        lines.append(backend_failure_line(self.tool_backend_failures))
        return "\n".join(lines)


def oracle_agent(scenario: Scenario) -> Agent:
    """The scenario's scripted oracle as an agent (it must define ``oracle(task, tools)``)."""
    if not isinstance(scenario, ShipsOracle):
        raise ValueError(f"scenario {scenario.name!r} ships no oracle")

    def run(task: Task, tools: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        result = scenario.oracle(task, tools)
        steps = [{"tool": name, "ok": ok, "latency_s": latency} for name, _args, ok, latency in result.steps]
        return result.answer, steps

    return run


def _run_one(scenario: Scenario, agent: Agent, task: Task, tools: dict[str, Any]) -> TaskOutcome:
    start = time.perf_counter()
    try:
        prediction, steps = agent(task, tools)
        error = None
    except Exception as exc:  # an agent bug is reported per task; the evaluation goes on
        prediction, steps, error = "", [], f"{type(exc).__name__}: {exc}"
    verdict: Verdict = scenario.verify(task, prediction)
    return TaskOutcome(
        task_id=task.id,
        kind=task.kind,
        question=task.question,
        gold=task.answer,
        prediction=prediction,
        correct=bool(verdict.correct),
        f1=token_f1(prediction, task.answer, task.aliases),
        seconds=time.perf_counter() - start,
        steps=steps,
        error=error,
    )


def evaluate(
    scenario: Scenario,
    split: str,
    agent: Agent,
    *,
    agent_name: str = "agent",
    limit: int | None = None,
    workers: int = 4,
    progress: bool = True,
) -> EvalReport:
    """Run ``agent`` on every task of ``split`` (or the first ``limit``), ``workers`` tasks at a time."""
    t0 = time.perf_counter()
    if isinstance(scenario, NeedsBuilding):
        scenario.build()
    build_seconds = time.perf_counter() - t0
    tasks = split_tasks(scenario, split)
    if limit is not None:
        tasks = tasks[:limit]
    if not tasks:
        raise ValueError(f"split {split!r} of {scenario.name!r} has no tasks")
    t1 = time.perf_counter()
    outcomes: list[TaskOutcome] = []
    with scenario.open() as world:
        open_seconds = time.perf_counter() - t1
        t2 = time.perf_counter()
        bar = tqdm(total=len(tasks), desc=f"{scenario.name} {split}", unit="task", disable=not progress)
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            futures = [pool.submit(_run_one, scenario, agent, task, world.make_tools()) for task in tasks]
            for future in as_completed(futures):
                outcomes.append(future.result())
                bar.update(1)
                bar.set_postfix(acc=f"{sum(o.correct for o in outcomes) / len(outcomes):.3f}")
        bar.close()
        eval_seconds = time.perf_counter() - t2
    order = {task.id: i for i, task in enumerate(tasks)}
    outcomes.sort(key=lambda o: order[o.task_id])
    return _report(scenario.name, split, agent_name, outcomes, build_seconds, open_seconds, eval_seconds)


def evaluate_agents(
    scenario: Scenario,
    split: str,
    policies: dict[str, Any],
    *,
    env: str = "hierarchy",
    agent_name: str = "agent",
    k: int = 1,
    limit: int | None = None,
    batch_size: int = 32,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    progress: bool = True,
    on_episode: Callable[[Any], None] | None = None,
    previous: list[Any] | None = None,
    max_workers: int = 8,
) -> tuple[EvalReport, list[Any]]:
    """Run ``policies`` on ``split`` through ``env``: the hierarchy ({"main", "sub"}, the AEC env) or
    the single agent ({"single"}, the Gymnasium env), one collect loop for both, reported alike.

    Returns the report and the episode records (for JSONL and ``mgrpo view``). ``on_episode`` gets
    each record as its episode ends; ``previous`` records (an interrupted run's, read back) count as
    done: their episodes (by seed) are not run again and they are part of the report. ``max_workers``:
    threads stepping the envs (tool calls); it changes the speed, not the episodes. Pass
    ``env_kwargs={"limits": limits, "rewards": ...}`` as the trainer does (the single agent's turn
    budget is ``limits.single_agent_turns``).
    """
    from mgrpo_env.rollout import collect

    def run(batch: list[Task], world: Any, batch_seed: int) -> list[Any]:
        return collect(scenario, batch, k, policies, world=world, seed=batch_seed, env_kwargs=env_kwargs,
                       on_episode=on_episode, max_workers=max_workers, env=env)

    desc = f"{scenario.name} {split}" + (" (single)" if env == "single" else "")
    return _evaluate_records(scenario, split, run, agent_name=agent_name, k=k, limit=limit, batch_size=batch_size,
                             seed=seed, progress=progress, desc=desc, previous=previous)


def evaluate_single(scenario: Scenario, split: str, policy: Any, **kwargs: Any) -> tuple[EvalReport, list[Any]]:
    """:func:`evaluate_agents` of one single-agent ``policy``."""
    return evaluate_agents(scenario, split, {"single": policy}, env="single", **{"agent_name": "single-agent", **kwargs})


def _evaluate_records(
    scenario: Scenario, split: str, run: Callable[[list[Task], Any, int], list[Any]], *, agent_name: str, k: int,
    limit: int | None, batch_size: int, seed: int, progress: bool, desc: str, previous: list[Any] | None = None,
) -> tuple[EvalReport, list[Any]]:
    """Build, open the world once, ``run`` the tasks in batches (K rollouts each), report.

    Task i's rollout j resets with seed ``seed + i*k + j`` wherever it runs, so a resumed evaluation
    (``previous``: records already done, matched by seed) runs the same episodes the first one would have.
    """
    t0 = time.perf_counter()
    if isinstance(scenario, NeedsBuilding):
        scenario.build()
    build_seconds = time.perf_counter() - t0
    tasks = split_tasks(scenario, split)[:limit]
    if not tasks:
        raise ValueError(f"split {split!r} of {scenario.name!r} has no tasks")
    wanted = set(range(seed, seed + len(tasks) * k))
    by_seed = {r.seed: r for r in previous or [] if r.seed in wanted}  # the last copy of an episode wins
    records: list[Any] = list(by_seed.values())
    done = set(by_seed)
    todo = [i for i in range(len(tasks)) if not all(seed + i * k + j in done for j in range(k))]
    rerun = set(todo)
    records = [r for r in records if (r.seed - seed) // k not in rerun]  # a task half done runs again whole
    # batches of consecutive task indices (so that the seeds are the ones of an uninterrupted run)
    batches: list[list[int]] = []
    for i in todo:
        if batches and batches[-1][-1] == i - 1 and len(batches[-1]) < batch_size:
            batches[-1].append(i)
        else:
            batches.append([i])
    t1 = time.perf_counter()
    with scenario.open() as world:
        open_seconds = time.perf_counter() - t1
        t2 = time.perf_counter()
        bar = tqdm(total=len(tasks) * k, initial=len(records), desc=desc, unit="task", disable=not progress)
        for batch in batches:
            records += run([tasks[i] for i in batch], world, seed + batch[0] * k)
            bar.update(len(batch) * k)
            bar.set_postfix(acc=f"{sum(r.correct for r in records) / len(records):.3f}")
        bar.close()
        eval_seconds = time.perf_counter() - t2
    records.sort(key=lambda r: r.seed if r.seed is not None else 0)
    outcomes = [_record_outcome(r) for r in records]
    return _report(scenario.name, split, agent_name, outcomes, build_seconds, open_seconds, eval_seconds), records


def _record_outcome(r: Any) -> TaskOutcome:
    """An episode record as a task outcome (tool calls of every agent in it)."""
    return TaskOutcome(
        task_id=r.task["id"],
        kind=r.task.get("kind", ""),
        question=r.task["question"],
        gold=r.task["answer"],
        prediction=r.final_answer or "",
        correct=r.correct,
        f1=token_f1(r.final_answer or "", r.task["answer"], r.task.get("aliases", ())),
        seconds=r.wall_s,
        steps=[
            {"tool": c.tool, "ok": c.ok, "latency_s": c.latency_s, "via": c.meta.get("via"),
             **({"failure": kind} if (kind := call_failure(c.tool, c.ok, c.error, c.meta)) else {})}
            for traj in [r.main, *r.subs]
            for c in traj.tool_calls
        ],
    )


def _report(
    scenario: str, split: str, agent: str, outcomes: list[TaskOutcome], build: float, opened: float, spent: float
) -> EvalReport:
    by_kind_rows: dict[str, list[TaskOutcome]] = defaultdict(list)
    for o in outcomes:
        by_kind_rows[o.kind or "-"].append(o)
    by_kind = {
        kind: {
            "n": float(len(rows)),
            "exact_match": sum(o.correct for o in rows) / len(rows),
            "f1": sum(o.f1 for o in rows) / len(rows),
        }
        for kind, rows in by_kind_rows.items()
    }
    calls: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    latencies: dict[str, list[float]] = defaultdict(list)
    browser = 0
    recorded_via = any("via" in step for o in outcomes for step in o.steps)
    for o in outcomes:
        for step in o.steps:
            name = str(step.get("tool", "?"))
            calls[name] += 1
            if not step.get("ok", True):
                errors[name] += 1
            if "latency_s" in step:
                latencies[name].append(float(step["latency_s"]) * 1000)
            if step.get("via") == "browser":
                browser += 1
            if step.get("failure"):
                failures[str(step["failure"])] += 1
    n = len(outcomes)
    return EvalReport(
        scenario=scenario,
        split=split,
        agent=agent,
        num_tasks=n,
        exact_match=sum(o.correct for o in outcomes) / n,
        f1=sum(o.f1 for o in outcomes) / n,
        by_kind=by_kind,
        build_seconds=build,
        open_seconds=opened,
        eval_seconds=spent,
        seconds_per_task_median=statistics.median(o.seconds for o in outcomes),
        tool_calls=dict(calls),
        tool_errors=dict(errors),
        tool_latency_ms_median={k: statistics.median(v) for k, v in latencies.items()},
        browser_visits=browser if recorded_via else None,
        tool_backend_failures=dict(sorted(failures.items())),
        outcomes=outcomes,
    )


def write_report(report: EvalReport, out_dir: str | Path, *, extra: dict[str, Any] | None = None) -> Path:
    """Write ``summary.json`` (the report's figures and ``extra``: mean@k, pass@k, the settings) and
    ``outcomes.jsonl`` (one line per task) under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(strict_json.dumps({**report.summary(), **(extra or {})}, indent=2) + "\n")
    with (out / "outcomes.jsonl").open("w") as fh:
        for o in report.outcomes:
            fh.write(strict_json.dumps(asdict(o), ensure_ascii=False) + "\n")
    return out
