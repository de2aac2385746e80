"""``run_compare``'s orchestration by values, in a second: which models each evaluation reads, which seed
each run gets, and which metric of which run each figure of a row comes from.

The trainer, the model loader, the policies and the evaluation loop are replaced at their boundary by
fakes whose numbers are known: a trained model is ``(start path, steps taken)``, an evaluation's answers
are a fixed function of the models it was given (and of the seed when it samples), the clock advances
by fixed amounts, and every iteration's metrics are distinct per run. So a figure taken from the wrong
model, run, seed or metric shows as a wrong number. The real end-to-end run is tests/test_compare.py.
"""

from __future__ import annotations

import json
import math
import types
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mgrpo_algo.core.config import config_to_dict, load_config
from mgrpo_algo.experiments import compare, report, units
from mgrpo_algo.experiments import intervals as iv
from mgrpo_algo.experiments.report import history_means
from mgrpo_env import strict_json
from mgrpo_env.episode import AgentTrajectory, EpisodeRecord, ToolCall, Turn

ITERATIONS = 3  # per run; iteration i reports 4 + i rollouts (any count: the row sums them)
ROLLOUTS = 4 + 5 + 6
INIT_S, ITER_S, EVAL_S = 5.0, 60.0, 10.0  # fake clock: trainer start, one iteration, one evaluation call
START_S = 7.0  # fake clock: resolving one group's start models
MAX_NEW = {"main": 12, "sub": 13, "single": 14}
# per role, distinct, so a setting passed from another role, or left out, shows
TOP_P = {"main": 0.91, "sub": 0.92, "single": 0.93}
MAX_PROMPT = {"main": 301, "sub": 302, "single": 303}
DEVICE = {"main": "cpu:0", "sub": "cpu:1", "single": "cpu:2"}
DTYPE = {"main": "float32", "sub": "bfloat16", "single": "float16"}
DECODE = {"main": (False, True), "sub": (True, False), "single": (False, False)}  # (fast_prefill, compact)
MAX_WORKERS = 5
MODE_INDEX = {"mgrpo": 0, "frozen-sub": 1, "single-agent": 2}


@dataclass
class Model:
    """A model's identity: the start it was loaded from and the optimizer steps applied to it."""

    path: str
    step: int = 0

    def state(self) -> tuple[str, int]:
        return (Path(self.path).name, self.step)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


@dataclass
class World:
    clock: Clock = field(default_factory=Clock)
    init_s: float = INIT_S  # the fake trainer's start and iteration times (a test may change them)
    iter_s: float = ITER_S
    trainers: list = field(default_factory=list)
    evals: list = field(default_factory=list)  # one dict per evaluation call
    scalars: dict = field(default_factory=dict)  # tb folder -> [(tag, value, step)]
    curves: dict = field(default_factory=dict)
    closed: list = field(default_factory=list)  # out_dir of each trainer compare closed
    bars: list = field(default_factory=list)  # one per training run
    starts: list = field(default_factory=list)  # role_model_paths calls: (seed, data dir, roles)
    plots: list = field(default_factory=list)  # the output folders figures were written into
    bootstrap_seeds: list = field(default_factory=list)  # the seed of every paired difference
    mistake_changes: list = field(default_factory=list)  # (seed, result) of every mistake-rate change


def answers(states: tuple, questions: int, k: int, temperature: float, seed: int) -> list[list[bool]]:
    """The fake evaluation's verdicts: a fixed function of the models (and of the seed when sampling)."""
    key = f"{states}|{temperature}|{seed if temperature > 0 else '-'}"
    return [[zlib.crc32(f"{key}|{q}|{j}".encode()) % 3 == 0 for j in range(k)] for q in range(questions)]


def f1_of(em: float) -> float:
    return 0.5 * em + 0.25  # distinct from EM, so an F1 read where EM belongs shows


def start_states(mode: str) -> tuple:
    roles = ("single",) if mode == "single-agent" else ("main", "sub")
    return tuple((role, (role, 0)) for role in roles)


def trained_states(mode: str, steps: int) -> tuple:
    if mode == "single-agent":
        return (("single", ("single", steps)),)
    return (("main", ("main", steps)), ("sub", ("sub", 0 if mode == "frozen-sub" else steps)))


def metrics_of(seed: int, mode: str, i: int) -> dict:
    """Iteration i's metrics of one run: every value distinct per (seed, mode, iteration)."""
    base = 100 * seed + 10 * MODE_INDEX[mode] + i
    role = "single" if mode == "single-agent" else "main"
    out = {"iteration": i, "rollouts": 4 + i, f"{role}/reward_mean": base / 1000, f"{role}/accuracy": base / 2000}
    if mode != "single-agent":
        out.update({"align/d_k_mean": 0.5 + base / 100, "align/d": 7.0, "sub/reward_mean": base / 3000,
                    "sub/expert_mean": base / 4000})
    return out


@pytest.fixture()
def fake(monkeypatch, tmp_path):
    import torch.utils.tensorboard
    import tqdm

    import mgrpo_algo.experiments.evaluate as evaluate
    import mgrpo_algo.experiments.plots as plots
    import mgrpo_algo.policies.hf_policy as hf_policy
    import mgrpo_algo.training.trainer as trainer_module

    world = World()
    clock = world.clock
    starts = tmp_path / "starts"

    def role_model_paths(config, scenario, roles):
        world.starts.append((config.seed, getattr(scenario, "data_dir", None), list(roles)))
        clock.now += START_S
        out = {}
        for role in roles:
            folder = starts / role
            folder.mkdir(parents=True, exist_ok=True)
            record = {"key": {"config": {"epochs": 1, "role": role}}, "counts": {"sequences": len(role)},
                      "metrics": {"loss": 0.5}}
            if role == "single":  # a record without the warm start's key (its config not known)
                del record["key"]
            (folder / "warm_start.json").write_text(json.dumps(record))
            out[role] = str(folder)
        return out

    class Policy:
        def __init__(self, model, tokenizer, *, role, max_new_tokens, temperature, top_p, max_prompt_tokens,
                     device, dtype, seed, fast_prefill, compact):
            self.model = model if isinstance(model, Model) else Model(str(model))
            self.tokenizer, self.role, self.max_new_tokens, self.temperature = tokenizer, role, max_new_tokens, temperature
            self.seed = seed
            self.settings = (role, top_p, max_prompt_tokens, device, dtype, fast_prefill, compact)

    class Handle:
        """A role worker's handle as compare sees it: ``begin_eval`` builds the evaluation policy over the
        worker's current model (the learner's, or the start for a frozen role), as RoleWorker does."""

        def __init__(self, cfg, role, model):
            self.cfg, self.role, self.model, self.eval_policy = cfg, role, model, None

        def call(self, name, *args):
            assert name == "begin_eval", name
            from mgrpo_algo.policies.factory import make_policy

            seed, temperature, max_new_tokens = args
            spec = getattr(self.cfg, self.role)
            self.eval_policy = make_policy(self.role, self.model, spec.model, spec, seed=seed, temperature=temperature,
                                           max_new_tokens=max_new_tokens, served=False, evaluation=True)

    class Learner:
        def __init__(self, path):
            self.model = Model(path)

    class Trainer:
        def __init__(self, cfg, *, log, heldout=None):
            clock.now += world.init_s
            self.cfg, self.log, self.heldout = cfg, log, heldout
            roles = ["single"] if cfg.mode == "single-agent" else ["main", "sub"]
            trained = ["main"] if cfg.mode == "frozen-sub" else roles
            self.learners = {r: Learner(getattr(cfg, r).model) for r in trained}
            self.policies = {r: Policy(self.learners[r].model if r in self.learners else getattr(cfg, r).model,
                                       None, role=r, max_new_tokens=0, temperature=1.0, top_p=1.0,
                                       max_prompt_tokens=0, device="cpu", dtype=None, seed=0, fast_prefill=True,
                                       compact=True) for r in roles}
            # the workers' handles: a trained role evaluates its learner's model, a frozen one its start
            self.handles = {r: Handle(cfg, r, self.learners[r].model if r in self.learners else getattr(cfg, r).model)
                            for r in roles}
            self.snapshot = {"seed": cfg.seed, "mode": cfg.mode, "out_dir": cfg.out_dir,
                             "models": {r: getattr(cfg, r).model for r in roles}}
            world.trainers.append(self.snapshot)

        def close(self):
            world.closed.append(self.snapshot["out_dir"])

        def run(self):
            # the run's episodes: one with a browser that failed to render (a backend failure, counted)
            Path(self.cfg.out_dir).mkdir(parents=True, exist_ok=True)
            (Path(self.cfg.out_dir) / "episodes.jsonl").write_text(json.dumps({"main": {"turns": [{"tool_call": {
                "tool": "visit", "ok": True, "meta": {"browser_error": "timeout: 30 s"}}}]}}) + "\n")
            history = []
            for i in range(sum(s.iterations for s in self.cfg.stages)):
                for learner in self.learners.values():
                    learner.model.step += 1  # in place, as an optimizer step is
                clock.now += world.iter_s
                metrics = metrics_of(self.cfg.seed, self.cfg.mode, i)
                point = self.heldout(i + 1) if self.heldout is not None else {}  # as the real loop: before its line
                metrics.update({f"heldout/{name}": value for name, value in point.items()})
                history.append(metrics)
                self.log(dict(metrics))
            return history

    class Bar:
        """tqdm's bar by its arguments and calls. A real one is not used: tqdm's lock is a multiprocessing
        lock shared by forked processes, and a mutation run forks one process per mutant (one killed while
        holding it would leave every later one blocked)."""

        def __init__(self, *, total, desc, unit, disable):
            self.args, self.updates, self.postfix, self.closed = (total, desc, unit, disable), 0, [], 0
            world.bars.append(self)

        def set_postfix(self, **values):
            self.postfix.append(values)

        def update(self, n):
            self.updates += n

        def close(self):
            self.closed += 1

    def fake_eval():
        def run(scenario, split, policies, *, env, agent_name, k, limit, seed, progress, max_workers, on_episode,
                previous, env_kwargs):
            kind = {"hierarchy": "hierarchy", "single": "single"}[env]
            # a trained model is evaluated through its worker's handle: read the policy it built
            policies = {r: p.worker.handle.eval_policy if hasattr(p, "worker") else p for r, p in policies.items()}
            states = tuple((r, p.model.state()) for r, p in sorted(policies.items()))
            temperature = {p.temperature for p in policies.values()}
            assert len(temperature) == 1
            temperature = temperature.pop()
            verdicts = answers(states, limit, k, temperature, seed)
            records = [EpisodeRecord(episode_id=f"{q}-{j}", task={"id": f"q{q}"}, seed=seed + q * k + j, correct=c)
                       for q, row in enumerate(verdicts) for j, c in enumerate(row)]
            # one search backend failure in a start's episodes, one of the fetcher in any other's
            tool = "search" if agent_name.startswith("start") else "fetch"
            records[0].main = AgentTrajectory("main", "main", turns=[Turn("", "tool_call", tool_call=ToolCall(
                tool, {}, ok=False, error="backend: down"))])
            em = sum(r.correct for r in records) / len(records)
            world.evals.append({"name": agent_name, "kind": kind, "states": states, "k": k, "limit": limit,
                                "seed": seed, "split": split, "temperature": temperature,
                                "policies": {r: (p.tokenizer, p.max_new_tokens, p.seed) for r, p in policies.items()},
                                "settings": {r: p.settings for r, p in policies.items()},
                                "scenario": getattr(scenario, "data_dir", None), "progress": progress,
                                "passed": (max_workers, on_episode, previous), "env_kwargs": sorted(env_kwargs),
                                "env_values": dict(env_kwargs)})
            clock.now += EVAL_S
            return types.SimpleNamespace(exact_match=em, f1=f1_of(em), num_tasks=limit), records
        return run

    class Writer:
        def __init__(self, log_dir):
            self.rows = world.scalars.setdefault(str(Path(log_dir).relative_to(tmp_path / "out")), [])

        def add_scalar(self, tag, value, step, walltime=None):
            self.rows.append((tag, value, step))

        def close(self):
            pass

    monkeypatch.setattr(compare, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(units, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))  # the units' clock
    monkeypatch.setattr(tqdm, "tqdm", Bar)
    paired_difference = iv.paired_difference

    def recorded_paired_difference(a, b, *, seed, **kwargs):
        # over these few questions the bootstrap's interval hardly depends on its seed: record the seed
        world.bootstrap_seeds.append(seed)
        return paired_difference(a, b, seed=seed, **kwargs)

    monkeypatch.setattr(iv, "paired_difference", recorded_paired_difference)
    mistake_changes = compare.mistake_changes

    def recorded_mistake_changes(after, before, *, seed):
        result = mistake_changes(after, before, seed=seed)
        world.mistake_changes.append((seed, result))
        return result

    monkeypatch.setattr(compare, "mistake_changes", recorded_mistake_changes)
    monkeypatch.setattr(trainer_module, "role_model_paths", role_model_paths)
    monkeypatch.setattr(trainer_module, "Trainer", Trainer)
    monkeypatch.setattr(hf_policy, "TransformersPolicy", Policy)
    monkeypatch.setattr(evaluate, "evaluate_agents", fake_eval())
    monkeypatch.setattr(torch.utils.tensorboard, "SummaryWriter", Writer)
    monkeypatch.setattr(plots, "write_figures", lambda curves, summary, out: (world.curves.update(curves), world.plots.append(out)))
    return world, tmp_path


def config(small_scenario, *extra):
    return load_config(None, [
        f"scenario_kwargs={{num_entities: 300, data_dir: {small_scenario.data_dir}}}",
        f"stages=[{{split: stage2/train, iterations: {ITERATIONS}}}]", "questions_per_iteration=2", "group_size=2",
        "seed=3", "eval.limit=3", "eval.every=2", "eval.curve_limit=2",
        *(f"{r}.generation.max_new_tokens={n}" for r, n in MAX_NEW.items()),
        *(f"{r}.generation.top_p={TOP_P[r]}" for r in TOP_P), *(f"{r}.generation.max_prompt_tokens={MAX_PROMPT[r]}" for r in TOP_P),
        *(f"{r}.learner.device={DEVICE[r]}" for r in TOP_P), *(f"{r}.learner.dtype={DTYPE[r]}" for r in TOP_P),
        *(f"{r}.generation.fast_prefill={str(DECODE[r][0]).lower()}" for r in TOP_P),
        *(f"{r}.generation.compact={str(DECODE[r][1]).lower()}" for r in TOP_P),
        f"max_workers={MAX_WORKERS}", *extra])


def expected(states, limit, k, temperature, seed):
    verdicts = answers(states, limit, k, temperature, seed)
    scores = {f"q{q}": row for q, row in enumerate(verdicts)}
    em = sum(map(sum, verdicts)) / (limit * k)
    return em, scores


#: The order compare runs (seed, mode) in: by start group (the hierarchy's modes share theirs), seeds inside.
RUN_ORDER = [(s, m) for s in (3, 4) for m in ("mgrpo", "frozen-sub")] + [(s, "single-agent") for s in (3, 4)]


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_every_figure_comes_from_the_right_models_run_seed_and_metric(fake, small_scenario, sampled):
    world, tmp = fake
    extra = ["eval.temperature=0.5", "eval.samples=2", "eval.max_new_tokens=9"] if sampled else []
    cfg = config(small_scenario, *extra)
    temperature, k = (0.5, 2) if sampled else (0.0, 1)
    progress = sampled  # the bars on in one case, off in the other: each evaluation's own setting shows
    given = config_to_dict(cfg)
    summary = compare.run_compare(cfg, seeds=2, out_dir=tmp / "out", progress=progress, command="mgrpo compare x")
    assert cfg.seed == 3 and cfg.mode == "mgrpo" and cfg.out_dir != str(tmp / "out")  # the caller's config untouched
    assert config_to_dict(cfg) == given  # its role models too (each run pins the start models in its own copy)
    # the start models resolved once per group, with the caller's seed and the config's scenario, timed
    assert world.starts == [(3, small_scenario.data_dir, ["main", "sub"]), (3, small_scenario.data_dir, ["single"])]
    assert summary["start_seconds"] == 2 * START_S
    # each row's interval bootstraps with its run's seed, the pooled ones with the config's (before the
    # checks below compute their own)
    # runs go by start group (the hierarchy's modes, then the single agent's), seeds inside a group; the
    # reference difference is not computed (no eval.reference)
    assert world.bootstrap_seeds == [s for s, _ in RUN_ORDER] + [3] * (len(report.DIFFERENCES) - 1)
    # each run's mistake-rate change is seeded by its seed, each mode's pooled one by the config's
    assert [seed for seed, _ in world.mistake_changes] == [s for s, _ in RUN_ORDER] + [3] * len(compare.MODES)
    starts = {r: str(tmp / "starts" / r) for r in ("main", "sub", "single")}

    # each (seed, mode) trained once, with its own seed and folder, from the pinned start models
    assert world.trainers == [
        {"seed": s, "mode": m, "out_dir": str(tmp / "out" / f"seed{s}" / m),
         "models": {r: starts[r] for r in (("single",) if m == "single-agent" else ("main", "sub"))}}
        for s, m in RUN_ORDER]

    assert sorted(world.closed) == sorted(t["out_dir"] for t in world.trainers)  # every run's workers stopped
    starts_evaluated = [e for e in world.evals if e["name"].startswith("start")]
    for e in world.evals:  # every evaluation: the config's split, the eval budget, the role's tokenizer and seed
        assert e["split"] == "stage2/test" and e["env_kwargs"] == ["limits", "rewards"]  # both envs take a RewardConfig
        greedy_pass = e["name"].endswith("greedy")
        assert (e["temperature"], e["k"]) == ((0.0, 1) if greedy_pass else (temperature, k)), e["name"]
        assert e["limit"] == (2 if e["name"].endswith("curve") else 3), e["name"]
        assert e["policies"] == {r: (starts[r], 9 if sampled else MAX_NEW[r], e["seed"] + {"main": 0, "sub": 1,
                                                                                          "single": 2}[r])
                                 for r in e["policies"]}
        # each role's policy with its own top-p, prompt limit, device and dtype
        assert e["settings"] == {r: (r, TOP_P[r], MAX_PROMPT[r], DEVICE[r], DTYPE[r], *DECODE[r]) for r in e["policies"]}
        assert sorted(e["policies"]) == (["single"] if e["kind"] == "single" else ["main", "sub"])
        # the config's scenario (its world), the bars only where the caller asked and not on the extra
        # passes, the config's workers, no episode callback or earlier episodes
        assert e["scenario"] == small_scenario.data_dir, e["name"]
        assert e["progress"] is (progress and not e["name"].endswith(("greedy", "curve"))), e["name"]
        assert e["passed"] == (MAX_WORKERS, None, None), e["name"]
        assert e["env_values"]["limits"] == cfg.limits
        rewards = e["env_values"]["rewards"]
        assert (rewards.main_weights, rewards.sub_weights) == (cfg.main_weights, cfg.sub_weights)
        assert rewards.expert is not None  # the hop-answer expert (no judge in compare)
    # one bar per run, on when the caller asked, ticked per iteration with the run's own reward and accuracy
    assert [b.args for b in world.bars] == [(ITERATIONS, f"seed {s} {m}", "iter", not progress)
                                            for s, m in RUN_ORDER]
    for bar, (s, m) in zip(world.bars, RUN_ORDER, strict=True):
        role = "single" if m == "single-agent" else "main"
        assert bar.updates == ITERATIONS and bar.closed >= 1
        assert bar.postfix == [{"reward": f"{metrics_of(s, m, i)[f'{role}/reward_mean']:.3f}",
                                "acc": f"{metrics_of(s, m, i)[f'{role}/accuracy']:.3f}"} for i in range(ITERATIONS)]
    # the start is evaluated once per start group when greedy (the same episodes for every seed), else per
    # seed; its greedy pass runs once per start group either way
    assert sorted((e["name"], e["kind"], e["seed"]) for e in starts_evaluated) == sorted(
        [("start seed3", "hierarchy", 3), ("start seed3", "single", 3)]
        + ([("start seed4", "hierarchy", 4), ("start seed4", "single", 4), ("start seed3 greedy", "hierarchy", 3),
            ("start seed3 greedy", "single", 3)] if sampled else []))
    assert all(e["states"] == start_states("single-agent" if e["kind"] == "single" else "mgrpo")
               for e in starts_evaluated)

    for mode in compare.MODES:
        rows = summary["results"][mode]["per_seed"]
        assert [r["seed"] for r in rows] == [3, 4]
        for row in rows:
            seed = row["seed"]
            start_seed = seed if sampled else 3
            before_em, before_scores = expected(start_states(mode), 3, k, temperature, start_seed)
            after_em, after_scores = expected(trained_states(mode, ITERATIONS), 3, k, temperature, seed)
            before_greedy = expected(start_states(mode), 3, 1, 0.0, 0)[0]
            after_greedy = expected(trained_states(mode, ITERATIONS), 3, 1, 0.0, 0)[0]
            curve_em = expected(trained_states(mode, 2), 2, k, temperature, seed)[0]
            history = [metrics_of(seed, mode, i) for i in range(ITERATIONS)]
            role = "single" if mode == "single-agent" else "main"
            # the figures of the row, each from its own model / run / metric
            for when in ("before", "after"):  # the held-out mistake rates ride along, counted over every sample
                assert row[when]["mistakes"]["episodes"] == 3 * k, when
            assert {key: v for key, v in row["before"].items() if key != "mistakes"} == {"em": before_em, "f1": f1_of(before_em), "tasks": 3,
                                     "mean_k": iv.mean_at_k(before_scores), "pass_k": iv.pass_at_k(before_scores),
                                     "greedy_em": before_greedy}
            assert {key: v for key, v in row["after"].items() if key != "mistakes"} == {"em": after_em, "f1": f1_of(after_em), "tasks": 3,
                                    "mean_k": iv.mean_at_k(after_scores), "pass_k": iv.pass_at_k(after_scores),
                                    "greedy_em": after_greedy}
            assert (row["before_em"], row["after_em"], row["before_f1"], row["after_f1"]) == (
                before_em, after_em, f1_of(before_em), f1_of(after_em))
            assert row["delta_em"] == pytest.approx(after_em - before_em)
            assert row["delta_f1"] == pytest.approx(f1_of(after_em) - f1_of(before_em))
            assert (row["before_pass_k"], row["after_pass_k"]) == (iv.pass_at_k(before_scores), iv.pass_at_k(after_scores))
            assert (row["before_greedy"], row["after_greedy"]) == (before_greedy, after_greedy)
            assert row["delta_interval"] == iv.paired_difference(after_scores, before_scores, seed=seed)
            assert (seed, row["mistake_change"]) in world.mistake_changes  # the run's own, seeded by it
            # eval.every=2 of 3: the start and the end from the full evaluations' first 2 questions, step 2
            # evaluated on them (its EM and F1 from its report); each with how its episodes ended
            first2 = [[float(c) for c in row] for row in answers(start_states(mode), 3, k, temperature, start_seed)[:2]]
            last2 = [[float(c) for c in row] for row in answers(trained_states(mode, ITERATIONS), 3, k, temperature, seed)[:2]]
            assert [(p["step"], p["em"], p["episodes"]) for p in row["curve"]] == [
                (0, sum(map(sum, first2)) / (2 * k), 2 * k), (2, curve_em, 2 * k), (3, sum(map(sum, last2)) / (2 * k), 2 * k)]
            assert row["curve"][1]["f1"] == f1_of(curve_em)
            assert all("malformed_main_episodes" in p for p in row["curve"])
            # the curve point rides in its iteration's metrics (heldout/...: iteration 1 is the 2nd update), and only there
            logged = [dict(h) for h in history]
            logged[1].update({f"heldout/{name}": v for name, v in row["curve"][1].items() if name != "step"})
            assert row["rollouts"] == ROLLOUTS and row["iterations"] == ITERATIONS
            train_s = INIT_S + ITERATIONS * ITER_S  # the curve evaluation's time is not training time
            assert row["train_seconds"] == pytest.approx(train_s)
            assert row["rollouts_per_minute"] == pytest.approx(ROLLOUTS / train_s * 60)
            after_calls = 1 + (1 if sampled else 0)  # the after-evaluation and, when sampling, its greedy pass
            start_calls = 1 + (1 if sampled and seed == 3 else 0)  # the shared greedy start pass: seed 3's
            assert row["eval_seconds"] == pytest.approx(EVAL_S * (after_calls + 1 + start_calls))
            d_k = [h["align/d_k_mean"] for h in history] if mode != "single-agent" else [0.0]
            assert row["d_k_mean"] == pytest.approx(sum(d_k) / len(d_k))
            for figure, key in (("sub_reward", "sub/reward_mean"), ("sub_expert", "sub/expert_mean")):
                if mode == "single-agent":  # no sub-agents: not measured
                    assert all(math.isnan(v) for v in row[figure])
                else:  # first and last quarter of the run's own metric (one value each of 3)
                    assert tuple(row[figure]) == (history[0][key], history[2][key]) == history_means(history, key)
            assert tuple(row["train_accuracy"]) == history_means(history, f"{role}/accuracy")
            assert tuple(row["train_accuracy"]) == (history[0][f"{role}/accuracy"], history[2][f"{role}/accuracy"])
            # the episodes written are the evaluations of those models
            folder = tmp / "out" / f"seed{seed}" / mode
            for name, scores in (("eval_before.jsonl", before_scores), ("eval_after.jsonl", after_scores)):
                lines = [json.loads(line) for line in (folder / name).read_text().splitlines()]
                assert iv.per_question(types.SimpleNamespace(**d) for d in lines) == scores, (mode, seed, name)
            # TensorBoard: start and after at steps 0 and ITERATIONS, the curve at 2, every numeric metric per step
            tb = world.scalars[f"tb/seed{seed}/{mode}"]
            first, middle, last = row["curve"]
            # (the run writes its own steps; step 0, the start, is written when the run is joined with its start)
            assert [(t, v, s) for t, v, s in tb if t.startswith("eval/")] == [
                ("eval/curve_em", curve_em, 2), ("eval/curve_f1", f1_of(curve_em), 2),
                ("eval/curve_em", last["em"], ITERATIONS), ("eval/curve_f1", last["f1"], ITERATIONS),
                ("eval/em", after_em, ITERATIONS), ("eval/f1", f1_of(after_em), ITERATIONS),
                ("eval/em", before_em, 0), ("eval/f1", f1_of(before_em), 0),
                ("eval/curve_em", first["em"], 0), ("eval/curve_f1", first["f1"], 0)]
            assert sorted((t, v, s) for t, v, s in tb if not t.startswith("eval/")) == sorted(
                (key, float(value), h["iteration"]) for h in logged for key, value in h.items() if key != "iteration")
        # the means over seeds are of these rows
        for key in compare.AGGREGATED:
            values = [r[key] for r in rows]
            assert summary["results"][mode]["mean"][key] == pytest.approx(sum(values) / 2, nan_ok=True)
            assert summary["results"][mode]["max"][key] == max(values)
        curves = world.curves[mode]
        assert [c["curve"] for c in curves] == [r["curve"] for r in rows]
        assert [[e["step"] for e in c["eval"]] for c in curves] == [[0, ITERATIONS]] * 2
        assert [c["eval"][1]["em"] for c in curves] == [r["after_em"] for r in rows]
        assert [c["eval"][0]["em"] for c in curves] == [r["before_em"] for r in rows]
        assert [[h["iteration"] for h in c["history"]] for c in curves] == [[0, 1, 2]] * 2
        assert all("scores" not in e for c in curves for e in c["eval"])

    # paired differences pool each mode's seeds per question
    def pooled(mode, side):
        if side == "start":
            return iv.pool_runs([expected(start_states(mode), 3, k, temperature, s if sampled else 3)[1] for s in (3, 4)])
        return iv.pool_runs([expected(trained_states(mode, ITERATIONS), 3, k, temperature, s)[1] for s in (3, 4)])

    assert summary["intervals"]["mgrpo: after - start"] == iv.paired_difference(
        pooled("mgrpo", "after"), pooled("mgrpo", "start"), seed=3)
    assert summary["intervals"]["after: mgrpo - frozen-sub"] == iv.paired_difference(
        pooled("mgrpo", "after"), pooled("frozen-sub", "after"), seed=3)
    assert summary["intervals"]["after: frozen-sub - single-agent"] == iv.paired_difference(
        pooled("frozen-sub", "after"), pooled("single-agent", "after"), seed=3)
    # each mode's mean@k with its own interval, pooled over seeds the same way (the headline figure's)
    assert summary["accuracy"]["mgrpo"] == {"start": iv.mean_interval(pooled("mgrpo", "start"), seed=3),
                                            "after": iv.mean_interval(pooled("mgrpo", "after"), seed=3)}
    assert summary["accuracy"]["single-agent"]["after"]["mean"] == pytest.approx(
        summary["results"]["single-agent"]["mean"]["after_em"])
    # the summary's own fields
    assert summary["seeds"] == [3, 4] and summary["modes"] == list(compare.MODES)
    assert summary["budget"] == {"iterations": 3, "questions_per_iteration": 2, "group_size": 2, "rollouts": 12}  # the budget: 3 x 2 x 2
    assert summary["start_models"] == {"hierarchy": {"main": starts["main"], "sub": starts["sub"]},
                                       "single": {"single": starts["single"]}}
    assert summary["warm_start"]["hierarchy"]["sub"] == {"path": starts["sub"], "config": {"epochs": 1, "role": "sub"},
                                                         "counts": {"sequences": 3}, "metrics": {"loss": 0.5}}
    # backend failures counted over every run's start, training and after episodes (6 runs each)
    assert summary["command"] == "mgrpo compare x" and summary["tool_backend_failures"] == {
        "browser timeout": 6, "fetch backend": 6, "search backend": 6}
    assert world.plots == [tmp / "out"]
    text = (tmp / "out" / "summary.json").read_text()
    # indented, paths and the like as text, a figure not measured (NaN in memory) as null: strict JSON
    assert text == strict_json.dumps(summary, indent=2, default=str) + "\n" and strict_json.loads_strict(text)
    assert summary["reproduce"] == (f"mgrpo compare --config {tmp / 'out' / 'config.yaml'} --seeds 2 "
                                    f"--out {tmp / 'out'} --modes mgrpo,frozen-sub,single-agent")
    assert json.loads(text)["results"]["mgrpo"]["mean"]["after_em"] == \
        pytest.approx(summary["results"]["mgrpo"]["mean"]["after_em"])
    assert load_config(str(tmp / "out" / "config.yaml")).eval.temperature == temperature
    assert summary["verdict"]["text"] in (tmp / "out" / "report.md").read_text()


def test_a_rerun_replaces_the_seed_folders_and_one_mode_runs_alone(fake, small_scenario):
    world, tmp = fake
    stale = tmp / "out" / "seed3" / "single-agent" / "from_an_earlier_run.jsonl"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an earlier run\n")
    cfg = config(small_scenario, "eval.greedy=false", "eval.temperature=0.5")
    summary = compare.run_compare(cfg, seeds=1, out_dir=tmp / "out", modes=["single-agent"])  # bars on by default
    assert not stale.exists() and (stale.parent / "eval_after.jsonl").is_file()
    assert [(e["name"], e["progress"]) for e in world.evals] == [
        ("start seed3", True), ("single-agent curve", False), ("single-agent seed3", True)]
    assert summary["warm_start"]["single"]["single"] == {
        "path": str(tmp / "starts" / "single"), "config": None, "counts": {"sequences": 6}, "metrics": {"loss": 0.5}}
    assert [t["mode"] for t in world.trainers] == ["single-agent"] and summary["modes"] == ["single-agent"]
    assert summary["start_models"] == {"single": {"single": str(tmp / "starts" / "single")}}
    row = summary["results"]["single-agent"]["per_seed"][0]
    assert math.isnan(row["before_greedy"]) and math.isnan(row["after_greedy"])  # eval.greedy off: not measured
    assert not any(e["name"].endswith("greedy") for e in world.evals)
    assert list(summary["intervals"]) == ["single-agent: after - start"]
    assert [p["step"] for p in row["curve"]] == [0, 2, 3]  # the start, every=2 of 3, the end
    assert row["curve"][1]["f1"] == f1_of(row["curve"][1]["em"])  # an evaluated point's F1 from its report
    # an output folder whose parents do not exist yet is made with them; a run of no iterations that took
    # no time: no rate, no d_k
    nested = tmp / "out" / "new" / "nested"
    world.init_s = 0.0
    none = config(small_scenario, "eval.greedy=false", "eval.temperature=0.5",
                  "stages=[{split: stage2/train, iterations: 0}]")
    again = compare.run_compare(none, seeds=1, out_dir=nested, modes=["single-agent"], progress=False)
    assert json.loads((nested / "summary.json").read_text())["seeds"] == again["seeds"] == [3]
    row = again["results"]["single-agent"]["per_seed"][0]
    assert (row["iterations"], row["rollouts"], row["train_seconds"], row["rollouts_per_minute"], row["d_k_mean"]) == (
        0, 0, 0.0, 0.0, 0.0)
    # under a second of training, a curve point every iteration: each point's time is evaluation time
    world.init_s, world.iter_s = 0.2, 0.1
    every = config(small_scenario, "eval.greedy=false", "eval.temperature=0.5", "eval.every=1")
    row = compare.run_compare(every, seeds=1, out_dir=tmp / "out" / "every", modes=["single-agent"],
                              progress=False)["results"]["single-agent"]["per_seed"][0]
    assert [c["step"] for c in row["curve"]] == [0, 1, 2, 3]
    assert row["train_seconds"] == pytest.approx(0.5) and row["rollouts_per_minute"] == pytest.approx(ROLLOUTS / 0.5 * 60)
    # the start, two curve points evaluated (the last point is the after-evaluation's), the after
    assert row["eval_seconds"] == pytest.approx(4 * EVAL_S)


def test_a_greedy_pass_runs_under_its_own_seed_when_given(fake, small_scenario):
    """``_full_evaluation``'s greedy pass: under ``greedy_seed`` when given (compare: the config's, for
    every start unit, so the group's one greedy pass is the same whichever seed's unit makes it), else
    under the evaluation's seed; with ``eval.greedy`` off, none (NaN)."""
    world, _ = fake
    cfg = config(small_scenario, "eval.temperature=0.5")
    scenario = compare.check_compare(cfg, 1, ["mgrpo"])
    paths = {"main": "m", "sub": "s"}

    def evaluate(c, **kwargs):
        return compare._full_evaluation(c, scenario, lambda c: compare.evaluation_policies(c, paths, paths, 3),
                                        seed=4, progress=False, name="x", **kwargs)[0]

    greedy = expected((("main", ("m", 0)), ("sub", ("s", 0))), 3, 1, 0.0, 3)[0]
    assert evaluate(cfg, greedy_seed=9)["greedy_em"] == greedy
    assert evaluate(cfg)["greedy_em"] == greedy
    assert [(e["name"], e["seed"]) for e in world.evals] == [("x", 4), ("x greedy", 9), ("x", 4), ("x greedy", 4)]
    off = config(small_scenario, "eval.temperature=0.5", "eval.greedy=false")
    assert math.isnan(evaluate(off, greedy_seed=9)["greedy_em"]) and len(world.evals) == 5


def test_mgrpo_eval_passes_its_episode_callback_and_earlier_episodes_through(fake, small_scenario):
    """``mgrpo eval`` resumes through evaluate_policies: the callback and the episodes kept so far reach the
    evaluation loop as given (compare passes none)."""
    world, _ = fake
    cfg = config(small_scenario)
    kept, seen = [EpisodeRecord(episode_id="0-0", task={"id": "q0"}, seed=0, correct=True)], []
    policies = compare.evaluation_policies(cfg, {"main": "m", "sub": "s"}, {"main": "m", "sub": "s"}, 0)
    compare.evaluate_policies(cfg, small_scenario, policies, limit=3, seed=0, progress=False, name="resume",
                              on_episode=seen.append, previous=kept)
    assert world.evals[-1]["passed"] == (MAX_WORKERS, seen.append, kept)


def test_evaluation_policies_run_in_process_even_for_a_served_role(fake, small_scenario):
    """A role trained against a served engine is still evaluated in process, on its own model."""
    cfg = config(small_scenario, "sub.served={base_url: 'http://127.0.0.1:9/v1'}")
    assert cfg.sub.served.enabled
    policies = compare.evaluation_policies(cfg, {"main": "m", "sub": "s"}, {"main": "m", "sub": "s"}, 0)
    assert {type(p).__name__ for p in policies.values()} == {"Policy"}  # the fake TransformersPolicy
    assert policies["sub"].model.path == "s"


class InProcessPool:
    """``ProcessPoolExecutor``'s stand-in: a submitted call runs at once in this process (where the fakes
    are), so a ``--jobs`` run's units show in ``world`` as its worker would have run them."""

    def __init__(self, max_workers, mp_context):
        self.max_workers = max_workers

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, *args):
        result = fn(*args)
        return types.SimpleNamespace(result=lambda: result)


def _without_clock(value):
    """``value`` less what the (fake) clock decides: what must not depend on how units were spread."""
    if isinstance(value, dict):
        return {k: _without_clock(v) for k, v in value.items() if not k.endswith(("seconds", "per_minute", "out_dir",
                                                                                "reproduce"))}
    if isinstance(value, (list, tuple)):
        return [_without_clock(v) for v in value]
    return "nan" if isinstance(value, float) and math.isnan(value) else value


def _start_evaluation(e: dict) -> tuple:
    """A start evaluation as the numbers see it: greedy pass or not, its models' kind, seed and policies."""
    return e["name"].endswith("greedy"), e["kind"], e["seed"], sorted(e["policies"].items())


def test_two_jobs_spread_the_units_and_give_the_one_process_figures(fake, small_scenario, monkeypatch):
    """--jobs 2, 2 seeds, sampled, with the reference: the pool takes the units longest first (the runs,
    then the start evaluations and the reference); each start is evaluated once per group and seed and
    its greedy pass once per group, as in one process; every figure and every start episode file equal
    to one process's."""
    import concurrent.futures

    world, tmp = fake
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", InProcessPool)
    cfg = config(small_scenario, "eval.temperature=0.5", "eval.samples=2", f"eval.reference={tmp / 'oracle'}")
    two = compare.run_compare(cfg, seeds=2, out_dir=tmp / "out" / "two", progress=True, jobs=2)
    starts_two = [_start_evaluation(e) for e in world.evals if e["name"].startswith("start")]
    order_two = [(e["name"], e["seed"]) for e in world.evals if not e["name"].endswith(("greedy", "curve"))]
    bars_two = [b.args[1:] for b in world.bars]
    ref_two = [(e["seed"], e["progress"]) for e in world.evals if e["name"] == "reference"]
    world.evals.clear(), world.trainers.clear(), world.bars.clear()
    one = compare.run_compare(cfg, seeds=2, out_dir=tmp / "out" / "one", progress=True, jobs=1)
    starts_one = [_start_evaluation(e) for e in world.evals if e["name"].startswith("start")]

    # longest first (InProcessPool runs each unit as it is submitted): the runs by cost, then the four
    # start evaluations, then the reference; the bars only on the dearest unit
    assert order_two == [("mgrpo seed3", 3), ("mgrpo seed4", 4), ("frozen-sub seed3", 3), ("frozen-sub seed4", 4),
                         ("single-agent seed3", 3), ("single-agent seed4", 4), ("start seed3", 3), ("start seed4", 4),
                         ("start seed3", 3), ("start seed4", 4), ("reference", 3)]
    assert bars_two == [("seed 3 mgrpo", "iter", False)] + [(f"seed {s} {m}", "iter", True) for s, m in [
        (4, "mgrpo"), (3, "frozen-sub"), (4, "frozen-sub"), (3, "single-agent"), (4, "single-agent")]]
    assert ref_two == [(3, False)]  # once, under the config's seed
    # one start evaluation per group and seed, one greedy pass per group under the config's seed: as one process
    assert sorted(starts_two) == sorted(starts_one)
    assert sorted((s[1], s[2]) for s in starts_two if s[0]) == [("hierarchy", 3), ("single", 3)]
    assert _without_clock(two) == _without_clock(one)
    for seed in (3, 4):
        for mode in compare.MODES:
            assert (tmp / "out" / "two" / f"seed{seed}" / mode / "eval_before.jsonl").read_text() == \
                   (tmp / "out" / "one" / f"seed{seed}" / mode / "eval_before.jsonl").read_text(), (seed, mode)
    assert (tmp / "out" / "two" / "eval_reference.jsonl").read_text() == (tmp / "out" / "one" / "eval_reference.jsonl").read_text()

