"""``mgrpo compare``: M-GRPO against its two baselines at the same rollout budget, over seeds.

For each seed and mode (``mgrpo``, ``frozen-sub``, ``single-agent``)::

    start  = the warm-started (stage-1) models, the same for every seed and mode that uses them
    before = held-out EM / F1 of the start               # mgrpo and frozen-sub share it: once per seed
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

import json
import math
import shutil
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mgrpo_env import strict_json
from mgrpo_env.mistakes import rates_of_counts
from mgrpo_env.roles import ROLES
from mgrpo_env.tool_health import backend_failures_in_files

from ..core.config import MODES, TrainConfig, config_to_dict
from ..core.kernels import kernel_state
from ..core.modes import mode_names
from ..core.seeding import torch_threads
from . import intervals as iv
from . import schedule
from .attribution_stats import attribution_summary
from .mistake_stats import mistake_changes, pool_counts
from .report import differences, format_table, markdown, verdict

# the held-out evaluation and the units of work, here for the callers that import them from compare
from .units import (  # noqa: F401  (_full_evaluation, _trained_policies: benchmarks and tests use them)
    _full_evaluation,
    _trained_policies,
    curve_point,
    eval_figures,
    evaluate_policies,
    evaluation_policies,
    greedy_em,
    log_scalars,
)

__all__ = ["check_compare", "run_compare", "with_start", "format_table", "verdict", "log_scalars", "aggregate",
           "evaluation_policies", "evaluate_policies", "eval_figures", "greedy_em", "curve_point"]

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


def _start_name(mode: str) -> str:
    """The name of a mode's start (``summary.json``'s ``start_models`` keys): its env, and which roles
    play another's model, and the mode's own start folders if it names any ("hierarchy", "single",
    "hierarchy+sub=main", "hierarchy+sub=main@main=configs/shared-warm-start/main")."""
    env, shares, *own = MODES[mode].start_key  # own: the mode's start folders, when it names any
    name = "+".join([env, *(f"{role}={owner}" for role, owner in shares)])
    return name + "".join(f"@{role}={path}" for start in own for role, path in start)


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
    ``jobs`` > 1 spreads the units of work (each group's start evaluation per seed, the reference
    evaluation, each seed and mode's run) over that many processes, longest first (:mod:`.schedule`).
    Each unit is seeded on its own, so the numbers do not depend on ``jobs``.
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
    # units of work (start evaluations, the reference evaluation, each (seed, mode) run) need nothing of
    # each other: `jobs` processes take them longest first as they free up (schedule.longest_first);
    # each is seeded alone, so the numbers do not depend on `jobs`. Each run is joined with its start here.
    groups: dict[str, list[str]] = {}
    for mode in modes:
        groups.setdefault(_start_name(mode), []).append(mode)
    keys = sorted(groups, key=lambda k: -len(groups[k]))  # one process's order: the largest group first
    reference_group = keys[-1] if config.eval.reference else None
    work = schedule.units({key: groups[key] for key in keys}, [config.seed + i for i in range(seeds)], reference_group,
                          start_per_seed=config.eval.temperature > 0)
    # every run's folders emptied before any unit runs (a rerun into the same folder never mixes runs); a
    # start evaluation writes its episodes straight into the eval_before.jsonl of each run it starts
    before_files: dict[tuple[str, int], list[str]] = {}
    for unit in work:
        if unit.mode not in (schedule.START, schedule.REFERENCE):
            for folder in (out / f"seed{unit.seed}" / unit.mode, out / "tb" / f"seed{unit.seed}" / unit.mode):
                shutil.rmtree(folder, ignore_errors=True)
            before_files.setdefault(_start_key(config, unit), []).append(
                str(out / f"seed{unit.seed}" / unit.mode / "eval_before.jsonl"))
    done = _run_units(config, work, starts, out, progress, jobs, scenario, before_files)
    start_of = {(d["unit"].group, d["unit"].seed): d["start"] for d in done if "start" in d}
    if config.eval.greedy and config.eval.temperature > 0:  # the group's one greedy pass, made by its first start
        greedy_of = {d["unit"].group: d["start"]["figures"]["greedy_em"] for d in done if "start" in d and d["unit"].greedy}
        for (group, _), start in start_of.items():
            start["figures"]["greedy_em"] = greedy_of[group]
    per_mode: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    curves: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    counts: dict[str, dict[str, list[Any]]] = {m: {"start": [], "after": []} for m in modes}
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    for d in done:  # in one process's order: the row seeds of the intervals follow it
        if "run" in d:
            unit = d["unit"]
            runs[unit.mode, unit.seed] = with_start(unit, d["run"], start_of[_start_key(config, unit)], out)
    for mode in modes:  # seed by seed, whichever process ran them
        for run in (runs[mode, config.seed + i] for i in range(seeds)):
            per_mode[mode].append(run["row"])
            curves[mode].append(run["curve"])
            scores[mode]["start"].append(run["before_scores"])
            scores[mode]["after"].append(run["after_scores"])
            counts[mode]["start"].append(run["before_counts"])
            counts[mode]["after"].append(run["after_counts"])
    reference = next((d["reference"] for d in done if "reference" in d), None)
    if reference:
        scores["reference"] = {"after": [reference.pop("scores")]}
    # per group, the first unit of it in one process's order (every process is pinned as the controller)
    provenance = {key: next(d["provenance"] for d in done if d["unit"].group == key) for key in keys}
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


def _start_key(config: TrainConfig, unit: schedule.Unit) -> tuple[str, int]:
    """The start evaluation a run is joined with: its group's under its seed (under the config's seed
    when the evaluation is greedy: then one serves every seed)."""
    return unit.group, unit.seed if config.eval.temperature > 0 else config.seed


def _run_units(config: TrainConfig, work: Sequence[schedule.Unit], starts: Mapping[str, Mapping[str, str]],
               out: Path, progress: bool, jobs: int, scenario: Any,
               before_files: Mapping[tuple[str, int], Sequence[str]]) -> list[dict[str, Any]]:
    """Every unit's result, in ``work``'s order: here one after another with ``jobs`` 1 (on the caller's
    ``scenario``), else in a pool of ``jobs`` processes that take them longest first (the dearest unit
    shows its progress bars). ``before_files``: per start evaluation, the files it writes its episodes to."""
    from .units import run_unit

    def files(unit: schedule.Unit) -> Sequence[str]:
        return before_files.get((unit.group, unit.seed), ()) if unit.mode == schedule.START else ()

    if jobs <= 1 or len(work) == 1:
        return [run_unit(config, unit, starts, str(out), progress, files(unit), scenario) for unit in work]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    queue = schedule.longest_first(work)
    with ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {unit: pool.submit(run_unit, config, unit, starts, str(out), progress and n == 0, files(unit))
                   for n, unit in enumerate(queue)}
        return [futures[unit].result() for unit in work]


def with_start(unit: schedule.Unit, run: Mapping[str, Any], start: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """A run's figures joined with its start evaluation's: the row's start figures and deltas (their
    interval and the mistake change seeded by the run's seed), the curve's first point and TensorBoard's
    step 0 (the start wrote the run's ``eval_before.jsonl`` itself)."""
    tb_dir = out / "tb" / f"seed{unit.seed}" / unit.mode
    before = {k: v for k, v in start["figures"].items() if k not in ("scores", "mistake_counts")}
    before_scores, before_counts = start["figures"]["scores"], start["figures"]["mistake_counts"]
    after, own = run["row"]["after"], dict(run["row"])
    curve = ([{"step": 0, **start["curve_start"]}] if start["curve_start"] else []) + own.pop("curve")
    row = {
        "seed": unit.seed,
        "before": before,
        "after": after,
        "before_em": before["em"], "before_f1": before["f1"], "after_em": after["em"], "after_f1": after["f1"],
        "delta_em": after["em"] - before["em"],
        "delta_f1": after["f1"] - before["f1"],
        "before_pass_k": before["pass_k"], "after_pass_k": after["pass_k"],
        "before_greedy": before["greedy_em"], "after_greedy": after["greedy_em"],
        "delta_interval": iv.paired_difference(run["after_scores"], before_scores, seed=unit.seed),
        **{k: v for k, v in own.items() if k not in ("seed", "after")},
        "eval_seconds": own["eval_seconds"] + start["seconds"],
        "curve": curve,
        "mistake_change": mistake_changes(run["after_counts"], before_counts, seed=unit.seed),
    }
    step0 = {"eval/em": before["em"], "eval/f1": before["f1"]}
    if start["curve_start"]:
        step0.update({"eval/curve_em": start["curve_start"]["em"], "eval/curve_f1": start["curve_start"]["f1"]})
    _tensorboard_with_start(tb_dir, step0)
    curve_data = {"history": run["history"], "eval": [{"step": 0, **before}, {"step": run["total"], **after}],
                  "curve": curve}
    return {"row": row, "curve": curve_data, "before_scores": before_scores, "after_scores": run["after_scores"],
            "before_counts": before_counts, "after_counts": run["after_counts"]}


def _tensorboard_with_start(tb_dir: Path, step0: Mapping[str, float]) -> None:
    """The run's TensorBoard scalars rewritten in one event file with the start's at step 0 first: a
    second file for step 0, written after the run's, would be read after it (TensorBoard reads a folder's
    files in name order, a timestamp) and draw the curve from its last point back to its first."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    old = sorted(tb_dir.glob("events.out.tfevents.*"))
    scalars = []
    if old:
        acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})  # 0: keep every value
        acc.Reload()
        scalars = sorted(((e.step, e.wall_time, tag, e.value) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)),
                         key=lambda x: (x[0], x[1]))
    writer = SummaryWriter(log_dir=str(tb_dir))
    start_time = scalars[0][1] if scalars else None
    for tag, value in step0.items():
        writer.add_scalar(tag, value, 0, walltime=start_time)
    for step, wall_time, tag, value in scalars:
        writer.add_scalar(tag, value, step, walltime=wall_time)
    writer.close()
    for file in old:
        file.unlink()


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


def _reproduce(out: Path, seeds: int, modes: Sequence[str], program: str) -> str:
    return f"{program} compare --config {out / 'config.yaml'} --seeds {seeds} --out {out} --modes {','.join(modes)}"


def _yaml(config: TrainConfig) -> str:
    import yaml

    plain = json.loads(json.dumps(config_to_dict(config), default=str))  # tuples -> lists, paths -> str
    return "# written by mgrpo compare: the config it ran\n" + yaml.safe_dump(plain, sort_keys=False)
