"""The units of work of ``mgrpo compare`` and the held-out evaluation they share.

A unit (:class:`mgrpo_algo.experiments.schedule.Unit`) is one of:

* a start evaluation: one start model set (a group: the modes that share their start models) under one
  seed, sampled, with the greedy pass for the group's first seed;
* the reference evaluation (``eval.reference``, the oracle clone);
* a training run: one (seed, mode) from its group's start models, its held-out curve points and the
  evaluation after training.

No unit needs another's result: a run's figures that compare it with its start (before, deltas, the
curve's first point) are joined by the caller (:func:`mgrpo_algo.experiments.compare.run_compare`)
once every unit is done, so ``compare --jobs`` hands them to processes as they free up. Each unit is
seeded on its own: where and when it runs changes no number.
"""

from __future__ import annotations

import copy
import shutil
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mgrpo_env.attribution import attribution_counts_by_question, attribution_rates
from mgrpo_env.mistakes import counts_by_question, rates_of_counts
from mgrpo_env.roles import ROLE_TABLE

from ..core.config import MODES, TrainConfig
from ..core.kernels import check_in_force, kernel_state
from . import intervals as iv
from . import schedule
from .attribution_stats import has_attribution
from .report import history_means

__all__ = ["log_scalars", "evaluation_policies", "evaluate_policies", "eval_figures", "greedy_em", "curve_point",
           "run_unit"]

def log_scalars(writer: Any, metrics: Mapping[str, Any], step: int) -> None:
    """Every numeric metric (not the iteration counter) as a TensorBoard scalar at ``step``."""
    for key, value in metrics.items():
        if key != "iteration" and isinstance(value, (int, float)) and not isinstance(value, bool):
            writer.add_scalar(key, float(value), step)


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
                     name: str, greedy_seed: int | None = None) -> tuple[dict[str, Any], list[Any], float]:
    """The held-out evaluation of one set of models: ``eval.samples`` at ``eval.temperature``, plus a
    greedy pass when that samples and ``eval.greedy`` is on. ``make_policies(cfg)`` builds the policies
    for a config (the greedy pass needs temperature 0). Returns (figures, records, seconds); figures
    carry ``scores`` ({question: [correct, ...]}), kept in memory for the paired intervals. A greedy
    pass does not depend on the seed: it runs under ``greedy_seed`` when given (the same episodes for
    every seed, in any process; compare makes it once per start group)."""
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
        figures["greedy_em"] = greedy_em(config, scenario, make_policies, name=name,
                                         seed=seed if greedy_seed is None else greedy_seed)
    else:
        figures["greedy_em"] = float("nan")
    return figures, records, time.perf_counter() - t


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
    progress: bool,
) -> dict[str, Any]:
    """One training run from the pinned start models, its TensorBoard log, curve points and the after-eval.

    What compares the run with its start (the row's start figures and deltas, the curve's first point,
    TensorBoard's step 0) is joined later from the start evaluation (``compare.with_start``)."""
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    from mgrpo_env.episode import write_jsonl

    from ..training.trainer import Trainer

    cfg = copy.deepcopy(config)
    cfg.mode, cfg.seed, cfg.out_dir = mode, seed, str(run_dir)
    for role, path in paths.items():
        getattr(cfg, role).model = path
    role = MODES[mode].roles[0]  # the main (or single) agent
    total = sum(s.iterations for s in cfg.stages)
    writer = SummaryWriter(log_dir=str(tb_dir))
    bar = tqdm(total=total, desc=f"seed {seed} {mode}", unit="iter", disable=not progress)
    holder: list[Any] = []
    curve: list[dict[str, float]] = []
    curve_seconds = 0.0
    subset = _curve_subset(cfg)

    def add_point(step: int, point: Mapping[str, float]) -> None:
        if point:
            curve.append({"step": step, **point})
            writer.add_scalar("eval/curve_em", point["em"], step)
            writer.add_scalar("eval/curve_f1", point["f1"], step)

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
    rollouts = sum(int(h["rollouts"]) for h in history)
    row = {  # the run's own figures; compare.with_start adds the start's
        "seed": seed,
        "after": after,
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
    }
    numeric = [{k: v for k, v in h.items() if isinstance(v, (int, float))} for h in history]
    return {"row": row, "history": numeric, "total": total, "after_scores": after_scores, "after_counts": after_counts}


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


def _curve_subset(config: TrainConfig) -> dict[str, int]:
    """:func:`curve_point`'s subset of a config: its questions, samples each, and the delegation limit."""
    return {"questions": config.eval.curve_limit, "samples": config.eval.samples,
            "max_delegations": config.limits.max_delegations}


def _start_evaluation(config: TrainConfig, scenario: Any, unit: schedule.Unit, paths: Mapping[str, str],
                      before_files: Sequence[str], progress: bool) -> dict[str, Any]:
    """A group's start evaluated under the unit's seed, its episodes in the ``eval_before.jsonl`` of every run
    it is the start of (``before_files``). A greedy pass gives the same episodes under any seed: it runs
    under the config's seed, only where ``unit.greedy`` (the caller gives the group's other seeds its figure)."""
    from mgrpo_env.episode import write_jsonl

    cfg = config
    if not unit.greedy and config.eval.greedy and config.eval.temperature > 0:
        cfg = copy.deepcopy(config)
        cfg.eval.greedy = False  # the group's greedy pass is made by its first start unit
    figures, records, seconds = _full_evaluation(
        cfg, scenario, lambda c, s=unit.seed: evaluation_policies(c, paths, paths, config.seed if c.eval.temperature == 0 else s),
        seed=unit.seed, progress=progress, name=f"start seed{unit.seed}", greedy_seed=config.seed)
    if before_files:  # written once, copied to the group's other runs
        write_jsonl(before_files[0], records)
        for file in before_files[1:]:
            Path(file).parent.mkdir(parents=True, exist_ok=True)  # the run has not started yet
            shutil.copyfile(before_files[0], file)
    # the curve starts at the start evaluation, on the subset's questions
    curve_start = curve_point(records, **_curve_subset(config)) if config.eval.every else {}
    return {"figures": figures, "seconds": seconds, "curve_start": curve_start}


_SCENARIOS: dict[str, Any] = {}


def _scenario(config: TrainConfig) -> Any:
    """One scenario object per config in a ``compare --jobs`` worker, which runs many units."""
    import mgrpo_scenarios

    key = repr((config.scenario, sorted(config.scenario_kwargs.items())))
    if key not in _SCENARIOS:
        _SCENARIOS[key] = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
    return _SCENARIOS[key]


def run_unit(config: TrainConfig, unit: schedule.Unit, starts: Mapping[str, Mapping[str, str]], out_dir: str,
             progress: bool, before_files: Sequence[str] = (), scenario: Any = None) -> dict[str, Any]:
    """One unit of work, in the caller's process or in a ``compare --jobs`` worker; returns plain data
    (figures, per-question scores, file paths) with the kernels it ran under (``provenance``).

    A start evaluation writes its episodes into ``before_files`` (the caller emptied the runs' folders
    before any unit ran, so a rerun into the same folder never mixes runs). ``scenario``: the caller's
    (one process), else one per worker and config."""
    import torch

    torch.set_num_threads(config.torch_threads)
    check_in_force()  # a --jobs worker pinned as its parent, or stopped
    scenario = _scenario(config) if scenario is None else scenario
    out = Path(out_dir)
    result: dict[str, Any] = {"unit": unit, "provenance": kernel_state()}
    if unit.mode == schedule.REFERENCE:
        result["reference"] = _reference(config, scenario, out, progress)
    elif unit.mode == schedule.START:
        result["start"] = _start_evaluation(config, scenario, unit, starts[unit.group], before_files, progress)
    else:
        run_dir, tb_dir = out / f"seed{unit.seed}" / unit.mode, out / "tb" / f"seed{unit.seed}" / unit.mode
        result["run"] = _train_and_evaluate(config, scenario, unit.mode, unit.seed, starts[unit.group], run_dir,
                                            tb_dir, progress)
    return result
