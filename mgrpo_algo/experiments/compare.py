"""``mgrpo compare``: M-GRPO against its two baselines at the same rollout budget, over seeds.

For each seed and mode (``mgrpo``, ``frozen-sub``, ``single-agent``)::

    start  = the warm-started (stage-1) models, the same for every seed and mode that uses them
    before = held-out EM / F1 of the start               # mgrpo and frozen-sub share it: once per process
    train  = the config's RL stages (iterations x B x K rollouts, identical across modes)
    after  = held-out EM / F1 of the trained in-memory models

Output folder::

    summary.json              per mode: per seed and mean / std / min / max over seeds
    report.md                 the table, the curves, the command that reproduces it, the verdict
    headline.png              held-out mean@k start -> after, the held-out curve, who lost the answers
    training.png, endings.png, mistakes.png, attribution.png   the details by topic (plots.DETAILS)
    config.yaml               the config the comparison ran (``--config`` it to reproduce)
    seed<S>/<mode>/           the trainer's run (metrics.jsonl, episodes.jsonl, checkpoints) and
                              eval_before.jsonl / eval_after.jsonl (``mgrpo view`` reads them)
    tb/seed<S>/<mode>/        TensorBoard scalars: every numeric metric, eval/em and eval/f1

The start models are resolved once, with the config's own seed, and pinned (``<role>.model``) in
every run: the tiny models' folders are keyed on the seed that built them, so letting the seed vary
would rebuild them (or refuse the folder), and the comparison would no longer start from one point.
Only the RL seed (sampling, question order, minibatch shuffles) varies between seeds.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mgrpo_env import strict_json
from mgrpo_env.attribution import attribution_counts_by_question, attribution_rates
from mgrpo_env.mistakes import counts_by_question, rates_of_counts
from mgrpo_env.roles import ROLE_TABLE, ROLES
from mgrpo_env.tool_health import backend_failures_in_files

from ..core.config import MODES, TrainConfig, config_to_dict
from ..core.kernels import check_in_force, kernel_state
from ..core.modes import mode_names
from ..core.seeding import torch_threads
from . import intervals as iv
from . import schedule
from .attribution_stats import attribution_summary, has_attribution
from .mistake_stats import mistake_changes, pool_counts
from .report import differences, format_table, history_means, markdown, verdict

__all__ = ["check_compare", "run_compare", "format_table", "verdict", "log_scalars", "aggregate",
           "evaluation_policies", "evaluate_policies", "eval_figures", "greedy_em"]

#: The per-seed numbers aggregated over seeds (mean, population std, min, max). ``*_em`` is mean@k
#: (plain EM with one greedy sample); ``*_greedy`` is NaN when the evaluation did not add a greedy pass.
AGGREGATED = ("before_em", "before_f1", "after_em", "after_f1", "delta_em", "delta_f1", "before_pass_k",
              "after_pass_k", "before_greedy", "after_greedy", "rollouts", "rollouts_per_minute",
              "train_seconds", "eval_seconds")


def check_compare(config: TrainConfig, seeds: int, modes: Sequence[str]) -> Any:
    """Raise ValueError naming the field for anything that would fail later; returns the scenario."""
    import mgrpo_scenarios

    if not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"--seeds must be an integer >= 1, got {seeds!r}")
    if not modes:
        raise ValueError("config field 'modes' (--modes) names no mode")
    for mode in modes:
        MODES.check(mode, "modes (--modes)")
    if len(set(modes)) != len(modes):
        raise ValueError(f"config field 'modes' (--modes) repeats a mode: {list(modes)}")
    try:
        scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
    except KeyError as exc:
        raise ValueError(f"config field 'scenario': {exc.args[0]}") from None
    except TypeError as exc:
        raise ValueError(f"config field 'scenario_kwargs': {exc}") from None
    import torch

    for field_name, device in [("warm_start.device", config.warm_start.device)] + [
        (f"{role}.learner.device", getattr(config, role).learner.device) for role in ROLES
    ]:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"config field '{field_name}' is {device!r} but torch sees no CUDA device")
    unknown = [part for part in mgrpo_scenarios.split_parts(config.eval.split) if part not in scenario.splits()]
    if unknown:
        raise ValueError(f"config field 'eval.split': {unknown[0]!r} is not a split of {config.scenario} "
                         f"({', '.join(scenario.splits())}; join several with '+')")
    return scenario


def aggregate(values: Sequence[float]) -> dict[str, float]:
    """Mean, population standard deviation, min and max (the spread over seeds); all NaN when a value
    is NaN (a figure not measured, e.g. greedy EM with ``eval.greedy: false``)."""
    values = [float(v) for v in values]
    if any(math.isnan(v) for v in values):  # statistics.pstdev raises AttributeError on NaN
        return dict.fromkeys(("mean", "std", "min", "max"), float("nan"))
    return {"mean": statistics.fmean(values), "std": statistics.pstdev(values), "min": min(values), "max": max(values)}


def log_scalars(writer: Any, metrics: Mapping[str, Any], step: int) -> None:
    """Every numeric metric (not the iteration counter) as a TensorBoard scalar at ``step``."""
    for key, value in metrics.items():
        if key != "iteration" and isinstance(value, (int, float)) and not isinstance(value, bool):
            writer.add_scalar(key, float(value), step)


def _start_name(mode: str) -> str:
    """The name of a mode's start (``summary.json``'s ``start_models`` keys): its env, and which roles
    play another's model, and the mode's own start folders if it names any ("hierarchy", "single",
    "hierarchy+sub=main", "hierarchy+sub=main@main=configs/shared-warm-start/main")."""
    env, shares, *own = MODES[mode].start_key  # own: the mode's start folders, when it names any
    name = "+".join([env, *(f"{role}={owner}" for role, owner in shares)])
    return name + "".join(f"@{role}={path}" for start in own for role, path in start)


def evaluation_policies(config: TrainConfig, models: Mapping[str, Any], tokenizers: Mapping[str, str],
                        seed: int) -> dict[str, Any]:
    """Evaluation policies: eval temperature and token budget, the role's top-p and prompt limit."""
    from ..core.seeding import eval_seed
    from ..policies.factory import make_policy

    return {role: make_policy(role, model, tokenizers[role], config.role(role), seed=eval_seed(seed, role),
                              temperature=config.eval.temperature, max_new_tokens=config.eval.max_new_tokens,
                              served=False, evaluation=True)
            for role, model in models.items()}


def evaluate_policies(config: TrainConfig, scenario: Any, policies: Mapping[str, Any], *, limit: int, seed: int,
                      progress: bool, name: str, on_episode: Any = None,
                      previous: list[Any] | None = None) -> tuple[Any, list[Any]]:
    """The one held-out evaluation: a hierarchy ({"main", "sub"}) or a single agent ({"single"}) on
    ``config.eval.split`` under the config's limits and rewards, ``eval.samples`` per question, batched.

    ``compare`` (start, after, curve points) and ``mgrpo eval`` both run it, so the same models and
    config give the same episodes. ``on_episode`` / ``previous``: see :func:`mgrpo_algo.experiments.evaluate.evaluate_agents`.
    Returns the :class:`EvalReport` and the episode records.
    """
    from ..training.trainer import env_options, reward_config
    from .evaluate import evaluate_agents

    e = config.eval
    env = ROLE_TABLE[next(iter(policies))].env  # the env the given roles act in
    rewards = reward_config(config, scenario)
    return evaluate_agents(scenario, e.split, dict(policies), env=env, agent_name=name, k=e.samples,
                           limit=limit or None, seed=seed, progress=progress, max_workers=config.max_workers,
                           on_episode=on_episode, previous=previous,
                           env_kwargs=env_options(config, rewards))


def eval_figures(report: Any, records: Sequence[Any], scores: Mapping[str, Sequence[bool]] | None = None
                 ) -> dict[str, float]:
    """EM, F1, tasks, mean@k and pass@k of one evaluation (``scores``: its :func:`intervals.per_question`,
    when the caller has it already)."""
    scores = iv.per_question(records) if scores is None else scores
    return {"em": report.exact_match, "f1": report.f1, "tasks": report.num_tasks, "mean_k": iv.mean_at_k(scores),
            "pass_k": iv.pass_at_k(scores)}


def greedy_em(config: TrainConfig, scenario: Any, make_policies: Any, *, seed: int, name: str) -> float:
    """EM of one greedy answer per question (``eval.temperature`` 0, one sample) on the config's split:
    what compare and ``mgrpo eval`` report beside a sampled mean@k. ``make_policies(cfg)`` builds the
    policies for the greedy config."""
    greedy = copy.deepcopy(config)
    greedy.eval.temperature, greedy.eval.samples = 0.0, 1
    report, _ = evaluate_policies(greedy, scenario, make_policies(greedy), limit=config.eval.limit, seed=seed,
                                  progress=False, name=f"{name} greedy")
    return float(report.exact_match)


def _full_evaluation(config: TrainConfig, scenario: Any, make_policies: Any, *, seed: int, progress: bool,
                     name: str, greedy_cache: dict[Any, float] | None = None, greedy_key: Any = None,
                     greedy_seed: int | None = None) -> tuple[dict[str, Any], list[Any], float]:
    """The held-out evaluation of one set of models: ``eval.samples`` at ``eval.temperature``, plus a
    greedy pass when that samples and ``eval.greedy`` is on. ``make_policies(cfg)`` builds the policies
    for a config (the greedy pass needs temperature 0). Returns (figures, records, seconds); figures
    carry ``scores`` ({question: [correct, ...]}), kept in memory for the paired intervals. A greedy
    pass does not depend on the seed: with ``greedy_cache`` it runs once per ``greedy_key`` (the start
    models), not once per seed, under ``greedy_seed`` when given (the same episodes in any process)."""
    t = time.perf_counter()
    report, records = evaluate_policies(config, scenario, make_policies(config), limit=config.eval.limit, seed=seed,
                                        progress=progress, name=name)
    scores = iv.per_question(records)
    figures: dict[str, Any] = {**eval_figures(report, records, scores), "scores": scores}
    # the decision mistakes (rates for the summary; per-question counts, kept in memory, for the intervals)
    figures["mistake_counts"] = counts_by_question(records, config.limits.max_delegations)
    # which role lost each answer (mgrpo_env.attribution), where the scenario can say: the same per-question counts
    for question, figures_of in attribution_counts_by_question(records, scenario).items():
        figures["mistake_counts"].setdefault(question, {}).update(figures_of)
    figures["mistakes"] = rates_of_counts(figures["mistake_counts"])  # one pass over the records
    if config.eval.temperature == 0:  # the evaluation is greedy already
        figures["greedy_em"] = figures["em"]
    elif config.eval.greedy:
        cache = {} if greedy_cache is None or greedy_key is None else greedy_cache
        if greedy_key not in cache:
            cache[greedy_key] = greedy_em(config, scenario, make_policies, name=name,
                                          seed=seed if greedy_seed is None else greedy_seed)
        figures["greedy_em"] = cache[greedy_key]
    else:
        figures["greedy_em"] = float("nan")
    return figures, records, time.perf_counter() - t


def _warm_record(paths: Mapping[str, str]) -> dict[str, Any]:
    """What the warm start of each start model recorded (its config, counts, SFT metrics), if any."""
    out = {}
    for role, path in paths.items():
        file = Path(path) / "warm_start.json"
        if file.is_file():
            data = json.loads(file.read_text())
            out[role] = {"path": str(path), "config": data.get("key", {}).get("config"), "counts": data.get("counts"),
                         "metrics": data.get("metrics")}
    return out


def run_compare(
    config: TrainConfig,
    *,
    seeds: int,
    out_dir: str | Path,
    modes: Sequence[str] | None = None,
    progress: bool = True,
    command: str | None = None,
    jobs: int = 1,
    program: str = "mgrpo",
) -> dict[str, Any]:
    """Run every mode for ``seeds`` seeds (``config.seed + i``) and write the comparison under ``out_dir``.

    Returns the summary (also ``out_dir/summary.json``). A mode's seed folders are replaced, so a
    rerun into the same folder never mixes runs. ``command`` (the CLI's) is recorded in the report;
    ``program`` starts the command line the report gives to reproduce the run (a script that registers
    a mode names itself: the installed ``mgrpo`` does not know that mode).
    ``jobs`` > 1 spreads the units of work (each seed and mode's run, the reference evaluation) over that
    many processes, longest first (:mod:`.schedule`); a process evaluates the start of each group it
    runs (once per seed). Each unit is seeded on its own, so the numbers do not depend on ``jobs``.
    """
    import transformers

    transformers.utils.logging.disable_progress_bar()  # per-shard bars of every model load drown the bars here

    # The start evaluations run before any role worker sets its threads: without this they ran on torch's
    # default (every core), which on a shared 2-core machine made a start evaluation ~8x slower than the
    # same evaluation at config.torch_threads (tiny models are overhead-bound; contended threads spin).
    with torch_threads(config.torch_threads):
        return _run_compare(config, seeds=seeds, out_dir=out_dir, modes=modes, progress=progress, command=command,
                            jobs=jobs, program=program)


def _run_compare(config: TrainConfig, *, seeds: int, out_dir: str | Path, modes: Sequence[str] | None, progress: bool,
                 command: str | None, jobs: int, program: str) -> dict[str, Any]:

    from ..training.trainer import mode_model_paths
    from .plots import write_figures

    modes = list(modes if modes is not None else mode_names())
    scenario = check_compare(config, seeds, modes)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(_yaml(config))
    t0 = time.perf_counter()
    scores: dict[str, dict[str, list[dict[str, list[bool]]]]] = {m: {"start": [], "after": []} for m in modes}
    starts: dict[str, dict[str, str]] = {}
    for mode in modes:
        key = _start_name(mode)  # the modes of one env (and one model per role) share their start models
        if key not in starts:
            starts[key] = mode_model_paths(config, scenario, mode)  # a mode's own start included
    start_seconds = time.perf_counter() - t0
    # One group per start model set (the hierarchy's modes share theirs, and its start evaluation). The
    # units of work (each (seed, mode) run, the reference evaluation) are spread over `jobs` processes,
    # longest first (schedule.assign); each is seeded alone, so the numbers do not depend on `jobs`.
    groups: dict[str, list[str]] = {}
    for mode in modes:
        groups.setdefault(_start_name(mode), []).append(mode)
    keys = sorted(groups, key=lambda k: -len(groups[k]))  # one process's order: the largest group first
    reference_group = keys[-1] if config.eval.reference else None
    work = schedule.units({key: groups[key] for key in keys}, [config.seed + i for i in range(seeds)], reference_group)
    plan = schedule.assign(work, jobs)
    outcome: list[dict[str, Any]] = []
    if len(plan) == 1:
        outcome.append(run_units(config, plan[0], starts, str(out), progress))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=len(plan) - 1, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(run_units, config, units, starts, str(out), False) for units in plan[1:]]
            outcome.append(run_units(config, plan[0], starts, str(out), progress))  # here: the longest unit, the bars
            outcome += [future.result() for future in futures]
    runs = {(run["mode"], run["seed"]): run for result in outcome for run in result["runs"]}
    per_mode: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    curves: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    counts: dict[str, dict[str, list[Any]]] = {m: {"start": [], "after": []} for m in modes}
    for mode in modes:  # seed by seed, whichever process ran them
        for run in (runs[mode, config.seed + i] for i in range(seeds)):
            per_mode[mode].append(run["row"])
            curves[mode].append(run["curve"])
            scores[mode]["start"].append(run["before_scores"])
            scores[mode]["after"].append(run["after_scores"])
            counts[mode]["start"].append(run["before_counts"])
            counts[mode]["after"].append(run["after_counts"])
    reference = next((result["reference"] for result in outcome if result.get("reference")), None)
    if reference:
        scores["reference"] = {"after": [reference.pop("scores")]}
    # per group, the first process that ran a unit of it (every process is pinned as the controller)
    provenance = {key: next(result["provenance"] for result, units in zip(outcome, plan, strict=True)
                            if any(unit.group == key for unit in units)) for key in keys}
    results = {}
    for mode, rows in per_mode.items():
        stats = {key: aggregate([r[key] for r in rows]) for key in AGGREGATED}
        results[mode] = {
            "per_seed": rows,
            **{name: {key: stats[key][name] for key in AGGREGATED} for name in ("mean", "std", "min", "max")},
        }
    iterations = sum(s.iterations for s in config.stages)
    summary: dict[str, Any] = {
        "scenario": config.scenario,
        "seeds": [config.seed + i for i in range(seeds)],
        "modes": modes,
        "eval": config_to_dict(config.eval),
        "budget": {"iterations": iterations, "questions_per_iteration": config.questions_per_iteration,
                   "group_size": config.group_size,
                   "rollouts": iterations * config.questions_per_iteration * config.group_size},
        "start_models": starts,
        "start_seconds": start_seconds,
        "warm_start": {key: _warm_record(paths) for key, paths in starts.items()},
        "results": results,
        "intervals": _intervals(scores, config.seed),
        # each mode's held-out mean@k, start and after (the reference: its one evaluation, "after"), pooled
        # over seeds, with its 95% bootstrap interval
        "accuracy": {name: {side: iv.mean_interval(iv.pool_runs(s[side]), seed=config.seed)
                            for side in ("start", "after") if s.get(side)} for name, s in scores.items()},
        "reference": reference,
        # each mode's held-out mistake rates before -> after, pooled over seeds, with intervals
        "mistakes": {mode: {"start": rates_of_counts(pool_counts(c["start"])),
                            "after": rates_of_counts(pool_counts(c["after"])),
                            "change": mistake_changes(pool_counts(c["after"]), pool_counts(c["start"]), seed=config.seed)}
                     for mode, c in counts.items()},
        # which role lost each held-out answer, start -> after (a scenario with the attribution hook only)
        "attribution": {mode: summary_of for mode, c in counts.items()
                        if (summary_of := attribution_summary(pool_counts(c["start"]), pool_counts(c["after"]),
                                                              seed=config.seed)) is not None},
        "command": command,
        "reproduce": _reproduce(out, seeds, modes, program),
        # what decides the float rounding (CPU, kernels in force, versions, threads), per process of the run
        "provenance": {"controller": kernel_state(), "groups": provenance},
    }
    # a missing browser or search backend lowers every number: counted over every episode file of the run
    summary["tool_backend_failures"] = backend_failures_in_files(
        sorted(p for name in ("eval_before.jsonl", "episodes.jsonl", "eval_after.jsonl") for p in out.glob(f"seed*/*/{name}")))
    summary["verdict"] = verdict(summary)
    write_figures(curves, summary, out)
    (out / "summary.json").write_text(strict_json.dumps(summary, indent=2, default=str) + "\n")
    (out / "report.md").write_text(markdown(summary))
    return summary


def curve_point(records: Sequence[Any], *, questions: int, samples: int, max_delegations: int,
                report: Any = None) -> dict[str, float]:
    """The held-out curve's figures on its fixed subset (the split's first ``questions``, ``samples`` each:
    the episodes an evaluation seeded ``s`` runs with seeds ``s + i * samples + j``, ``s`` its smallest)
    from any evaluation's records that cover it: the start and
    the after-training evaluations give the curve's first and last points on the same questions the
    points between them were evaluated on. mean@k (``em``) and F1 (the evaluation's ``report`` when it
    evaluated exactly the subset) with the 95% bootstrap band of mean@k over the subset's questions
    (``em_low``, ``em_high``), and how the episodes end (``mgrpo_env.mistakes.ENDING_RATE_KEYS``)."""
    from mgrpo_env.mistakes import ENDING_RATE_KEYS, mistake_rates
    from mgrpo_scenarios.verifiers import token_f1

    seeded = [r for r in records if r.seed is not None]
    base = min((r.seed for r in seeded), default=0)  # a greedy start is evaluated once, under its first seed
    subset = [r for r in seeded if r.seed < base + questions * samples]
    if not subset:
        return {}
    rates = mistake_rates(subset, max_delegations)
    if report is not None:
        em, f1 = float(report.exact_match), float(report.f1)
    else:
        em = sum(bool(r.correct) for r in subset) / len(subset)
        f1 = sum(token_f1(r.final_answer or "", r.task.get("answer", ""), r.task.get("aliases", ())) for r in subset) / len(subset)
    band = iv.mean_interval(iv.per_question(subset))  # the curve's 95% band: a bootstrap over its questions
    point = {"em": em, "em_low": band["low"], "em_high": band["high"], "f1": f1, "episodes": float(len(subset))}
    point.update({k: float(rates[k]) for k in ENDING_RATE_KEYS if rates.get(k) is not None})
    return point


def _train_and_evaluate(
    config: TrainConfig, scenario: Any, mode: str, seed: int, paths: Mapping[str, str], run_dir: Path, tb_dir: Path,
    before: dict[str, Any], progress: bool, before_records: Sequence[Any] = (),
) -> tuple[dict[str, Any], dict[str, Any], dict[str, list[bool]]]:
    """One training run from the pinned start models, its TensorBoard log, curve points and the after-eval."""
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    from mgrpo_env.episode import write_jsonl

    from ..training.trainer import Trainer

    before_scores = before["scores"]
    cfg = copy.deepcopy(config)
    cfg.mode, cfg.seed, cfg.out_dir = mode, seed, str(run_dir)
    for role, path in paths.items():
        getattr(cfg, role).model = path
    role = MODES[mode].roles[0]  # the main (or single) agent
    total = sum(s.iterations for s in cfg.stages)
    writer = SummaryWriter(log_dir=str(tb_dir))
    writer.add_scalar("eval/em", before["em"], 0)
    writer.add_scalar("eval/f1", before["f1"], 0)
    bar = tqdm(total=total, desc=f"seed {seed} {mode}", unit="iter", disable=not progress)
    holder: list[Any] = []
    curve: list[dict[str, float]] = []
    curve_seconds = 0.0
    subset = {"questions": cfg.eval.curve_limit, "samples": cfg.eval.samples,
              "max_delegations": cfg.limits.max_delegations}

    def add_point(step: int, point: Mapping[str, float]) -> None:
        if point:
            curve.append({"step": step, **point})
            writer.add_scalar("eval/curve_em", point["em"], step)
            writer.add_scalar("eval/curve_f1", point["f1"], step)

    if cfg.eval.every:  # the curve starts at the start evaluation, on the subset's questions
        add_point(0, curve_point(before_records, **subset))

    def heldout(done: int) -> dict[str, float]:
        """A curve point after ``done`` updates (every ``eval.every``, not at the end: the after-training
        evaluation gives that one): into this iteration's metrics.jsonl line, before it is written."""
        nonlocal curve_seconds
        if not cfg.eval.every or done % cfg.eval.every or done >= total:
            return {}
        t = time.perf_counter()
        report, records = evaluate_policies(cfg, scenario, _trained_policies(cfg, holder[0], seed),
                                            limit=cfg.eval.curve_limit, seed=seed, progress=False, name=f"{mode} curve")
        point = curve_point(records, **subset, report=report)
        add_point(done, point)
        curve_seconds += time.perf_counter() - t
        return point

    def on_iteration(metrics: dict[str, Any]) -> None:
        log_scalars(writer, metrics, int(metrics["iteration"]))
        bar.set_postfix(reward=f"{metrics[f'{role}/reward_mean']:.3f}", acc=f"{metrics[f'{role}/accuracy']:.3f}")
        bar.update(1)

    try:
        t = time.perf_counter()
        trainer = Trainer(cfg, log=on_iteration, heldout=heldout)
        holder.append(trainer)
        history = trainer.run()
        bar.close()
        train_seconds = time.perf_counter() - t - curve_seconds
        after, records, after_seconds = _full_evaluation(
            cfg, scenario, lambda c: _trained_policies(c, trainer, seed), seed=seed, progress=progress,
            name=f"{mode} seed{seed}")
        write_jsonl(run_dir / "eval_after.jsonl", records)
        if cfg.eval.every:
            add_point(total, curve_point(records, **subset))
        writer.add_scalar("eval/em", after["em"], total)
        writer.add_scalar("eval/f1", after["f1"], total)
    finally:
        bar.close()  # closing twice is a no-op
        writer.close()
        for trainer in holder:  # its role workers (processes, Ray actors) end with it
            trainer.close()
    after_scores = after.pop("scores")
    after_counts = after.pop("mistake_counts")
    before_counts = before["mistake_counts"]
    before = {k: v for k, v in before.items() if k not in ("scores", "mistake_counts")}
    rollouts = sum(int(h["rollouts"]) for h in history)
    row = {
        "seed": seed,
        "before": before,
        "after": after,
        "before_em": before["em"], "before_f1": before["f1"], "after_em": after["em"], "after_f1": after["f1"],
        "delta_em": after["em"] - before["em"],
        "delta_f1": after["f1"] - before["f1"],
        "before_pass_k": before["pass_k"], "after_pass_k": after["pass_k"],
        "before_greedy": before["greedy_em"], "after_greedy": after["greedy_em"],
        "delta_interval": iv.paired_difference(after_scores, before_scores, seed=seed),
        "rollouts": rollouts,
        "rollouts_per_minute": rollouts / train_seconds * 60 if train_seconds > 0 else 0.0,
        "iterations": len(history),
        "train_seconds": train_seconds,
        "eval_seconds": after_seconds + curve_seconds,
        "curve": curve,
        "d_k_mean": statistics.fmean(float(h.get("align/d_k_mean", 0.0)) for h in history) if history else 0.0,
        "sub_reward": history_means(history, "sub/reward_mean"),
        "sub_expert": history_means(history, "sub/expert_mean"),
        "train_accuracy": history_means(history, f"{role}/accuracy"),
        "mistake_change": mistake_changes(after_counts, before_counts, seed=seed),
    }
    numeric = [{k: v for k, v in h.items() if isinstance(v, (int, float))} for h in history]
    curve_data = {"history": numeric, "eval": [{"step": 0, **before}, {"step": total, **after}], "curve": curve}
    return row, curve_data, (after_scores, after_counts)


def run_units(config: TrainConfig, units: Sequence[schedule.Unit], starts: Mapping[str, Mapping[str, str]],
              out_dir: str, progress: bool) -> dict[str, Any]:
    """The given units of work, in order: each (seed, mode) run from its group's start models
    (``starts[unit.group]``), and the reference start's evaluation. A group's start evaluation is done
    once per seed in this process, for the first of its runs here (seeded alone, it gives the same
    episodes in any process). Runs in the caller's process or in a worker process of ``compare --jobs``;
    returns plain data (rows, curves, per-question scores)."""
    import torch

    import mgrpo_scenarios
    from mgrpo_env.episode import write_jsonl

    torch.set_num_threads(config.torch_threads)
    check_in_force()  # a --jobs worker pinned as its parent, or stopped
    scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
    out = Path(out_dir)
    result: dict[str, Any] = {"runs": [], "provenance": kernel_state()}
    before_cache: dict[Any, tuple[dict[str, Any], list[Any], float]] = {}
    greedy_starts: dict[Any, float] = {}  # greedy EM of a group's start: the same for every seed
    for unit in units:
        if unit.mode == schedule.REFERENCE:
            result["reference"] = _reference(config, scenario, out, progress)
            continue
        mode, seed, paths = unit.mode, unit.seed, starts[unit.group]
        run_dir, tb_dir = out / f"seed{seed}" / mode, out / "tb" / f"seed{seed}" / mode
        for folder in (run_dir, tb_dir):
            shutil.rmtree(folder, ignore_errors=True)
        # a greedy evaluation of a start (the evaluation itself, or its greedy pass) gives the same episodes
        # for every seed: done once per group, under the config's seed, whichever seed a process meets first
        start_seed = config.seed if config.eval.temperature == 0 else seed
        if (unit.group, start_seed) not in before_cache:
            before_cache[unit.group, start_seed] = _full_evaluation(
                config, scenario, lambda c, p=paths, s=start_seed: evaluation_policies(
                    c, p, p, config.seed if c.eval.temperature == 0 else s), seed=start_seed, progress=progress,
                name=f"start seed{start_seed}", greedy_cache=greedy_starts, greedy_key=unit.group,
                greedy_seed=config.seed)
        before, records, before_seconds = before_cache[unit.group, start_seed]
        write_jsonl(run_dir / "eval_before.jsonl", records)
        row, curve_data, (after_scores, after_counts) = _train_and_evaluate(config, scenario, mode, seed, paths,
                                                                            run_dir, tb_dir, before, progress, records)
        row["eval_seconds"] += before_seconds
        result["runs"].append({"mode": mode, "seed": seed, "row": row, "curve": curve_data,
                               "before_scores": before["scores"], "after_scores": after_scores,
                               "before_counts": before["mistake_counts"], "after_counts": after_counts})
    return result


def _reference(config: TrainConfig, scenario: Any, out: Path, progress: bool) -> dict[str, Any]:
    """The reference start (``eval.reference``, the oracle clone) evaluated beside the runs: sampled like
    the starts under the config's seed, no greedy pass; its episodes in ``eval_reference.jsonl``."""
    from mgrpo_env.episode import write_jsonl

    ref_paths = {role: str(Path(config.eval.reference) / role) for role in ("main", "sub")}
    ref_config = copy.deepcopy(config)
    ref_config.eval.greedy = False
    figures, ref_records, _ = _full_evaluation(
        ref_config, scenario, lambda c: evaluation_policies(c, ref_paths, ref_paths, config.seed), seed=config.seed,
        progress=progress, name="reference")
    write_jsonl(out / "eval_reference.jsonl", ref_records)
    reference_counts = figures.pop("mistake_counts")
    if has_attribution(reference_counts):
        figures["attribution"] = attribution_rates(reference_counts)
    return {"path": config.eval.reference, "name": Path(config.eval.reference).name, **figures}


def _intervals(scores: Mapping[str, Mapping[str, list[dict[str, list[bool]]]]], seed: int) -> dict[str, Any]:
    """The report's paired differences (:func:`mgrpo_algo.experiments.report.differences`), each pooled
    over seeds: a mode's after - start, and one mode's after minus another's (where both ran)."""
    out: dict[str, Any] = {}
    for name, a, b in differences():
        first = scores.get(a, {}).get("after")
        second = scores[a]["start"] if b == "start" and first else scores.get(b, {}).get("after")
        if first and second:
            out[name] = iv.paired_difference(iv.pool_runs(first), iv.pool_runs(second), seed=seed)
    return out


def _trained_policies(cfg: TrainConfig, trainer: Any, seed: int) -> dict[str, Any]:
    """Evaluation policies over the trainer's current models, through its role handles: each worker
    builds the evaluation policy over its own model (a frozen role keeps its start), wherever it runs."""
    from ..core.seeding import eval_seed
    from ..training.service import RoleClient
    from ..training.workers import WorkerPolicy

    policies: dict[str, Any] = {}
    for role, handle in trainer.handles.items():
        client = RoleClient(handle)
        client.begin_eval(eval_seed(seed, role), cfg.eval.temperature, cfg.eval.max_new_tokens)
        policies[role] = WorkerPolicy(client)
    spec = MODES[cfg.mode]
    for role in spec.roles:  # a shared role acts through its owner's evaluation policy
        policies.setdefault(role, policies[spec.owner(role)])
    return policies


def _reproduce(out: Path, seeds: int, modes: Sequence[str], program: str) -> str:
    return f"{program} compare --config {out / 'config.yaml'} --seeds {seeds} --out {out} --modes {','.join(modes)}"


def _yaml(config: TrainConfig) -> str:
    import yaml

    plain = json.loads(json.dumps(config_to_dict(config), default=str))  # tuples -> lists, paths -> str
    return "# written by mgrpo compare: the config it ran\n" + yaml.safe_dump(plain, sort_keys=False)
