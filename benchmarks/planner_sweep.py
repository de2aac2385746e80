"""The planner sweep of issue 51: M-GRPO runs of the demo's config with one lever each, side by side.

Each run is ``mgrpo compare --config configs/demo.yaml --seeds 1 --modes mgrpo --set eval.greedy=false
--set eval.every=0 [--set "eval.reference=''"] --set <lever> --out runs/planner/<name>`` (seed 0, 2,048
rollouts, 224 held-out questions x 4 at T = 1). This script reads the folders and prints, per run: held-out
mean@4 start -> after with its paired interval, after - the oracle clone (paired over questions, from the
``--reference`` run's ``eval_reference.jsonl``), which role lost each held-out answer (mgrpo_env.attribution:
the main agent never asked a needed hop / failed to combine; a sub-agent reported a hop wrong / without a
result), the delegations that ask a needed hop (per question, averaged; start -> after with its paired
interval), the sub-agents' accuracy on exactly delegated hops, and the aggregation questions answered right.
A folder with several seeds (``--seeds 2 --set seed=1``) gives a row per seed; ``--pool NAME=DIR,DIR`` adds a
row pooling every seed of those folders (per question, as compare pools seeds); ``--earlier sweep.json`` puts
an earlier sweep's rows first (runs no longer on disk). It writes the table and the figures to ``--out``
(``sweep.json``, ``sweep.md``).

    python benchmarks/planner_sweep.py runs/planner/* --reference runs/planner/base \
        --pool deleg10=runs/planner/deleg10,runs/planner/deleg10_seeds12 --out benchmarks/results/planner_sweep
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import mgrpo_scenarios
from mgrpo_algo.core.config import load_config
from mgrpo_algo.experiments import intervals as iv
from mgrpo_algo.experiments.attribution_stats import attribution_summary
from mgrpo_algo.experiments.percent import interval_text as _ci
from mgrpo_algo.experiments.percent import pct as _pct
from mgrpo_env import strict_json
from mgrpo_env.attribution import attribution_counts_by_question
from mgrpo_env.episode import read_jsonl

LEVER_FIELDS = ("delegation_credit", "stages", "turn_format_penalty", "success_likelihood", "step_advantage_weight",
                "sub_outcome_groups", "group_size", "questions_per_iteration", "model_sizes")


def seed_runs(folder: Path) -> list[Path]:
    """A compare folder's M-GRPO runs, one per seed (``seed<S>/mgrpo``), in seed order."""
    return sorted((p for p in folder.glob("seed*/mgrpo") if (p / "eval_after.jsonl").is_file()),
                  key=lambda p: int(p.parent.name[4:]))


def run_figures(name: str, runs: list[Path], reference: list[Any] | None, scenario: Any) -> dict[str, Any]:
    """One row (the figures of the module docstring) over M-GRPO runs: one seed, or several pooled as compare
    pools seeds (per question, every seed's samples together; the oracle clone's one evaluation against each)."""
    starts = [list(read_jsonl(run / "eval_before.jsonl")) for run in runs]
    afters = [list(read_jsonl(run / "eval_after.jsonl")) for run in runs]
    start = iv.pool_runs([iv.per_question(r) for r in starts])
    after = iv.pool_runs([iv.per_question(r) for r in afters])
    attribution = attribution_summary(attribution_counts_by_question([e for r in starts for e in r], scenario),
                                      attribution_counts_by_question([e for r in afters for e in r], scenario), seed=0)
    config = json.loads((runs[0] / "config.json").read_text())
    return {
        "name": name,
        "seeds": [int(run.parent.name[4:]) for run in runs],
        "levers": {k: config[k] for k in LEVER_FIELDS if k in config},
        "start_mean_k": iv.mean_at_k(start), "after_mean_k": iv.mean_at_k(after),
        "after_mean_k_per_seed": [iv.mean_at_k(iv.per_question(r)) for r in afters],
        "delta": iv.paired_difference(after, start, seed=0),
        "vs_reference": (iv.paired_difference(after, iv.pool_runs([iv.per_question(reference)] * len(runs)), seed=0)
                         if reference else None),
        "attribution": attribution,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| run | mean@4 start -> after | Δ [95% CI] | after - oracle clone [95% CI] | lost by main: not asked / "
             "combine / no answer | lost by sub-agents: wrong / no result | delegations asking a needed hop (per "
             "question) start -> after, Δ [95% CI] | sub-agents right on exactly delegated hops | aggregation right |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a = r["attribution"]
        s, f, c = a["start"], a["after"], a["change"]
        key = "delegation/asks_hop_per_question"
        lines.append(
            f"| {r['name']} | {_pct(r['start_mean_k'])} -> {_pct(r['after_mean_k'])} | {_ci(r['delta'])} "
            f"| {_ci(r['vs_reference'])} "
            f"| {_pct(f['outcome/main_not_asked'])} / {_pct(f['outcome/main_combine'])} / {_pct(f['outcome/no_answer'])} "
            f"| {_pct(f['outcome/sub_wrong'])} / {_pct(f['outcome/sub_no_result'])} "
            f"| {_pct(s[key])} -> {_pct(f[key])}, {_ci(c[key])} "
            f"| {_pct(s['exact_hop/right'])} -> {_pct(f['exact_hop/right'])} "
            f"| {_pct(s.get('outcome/aggregation/right'))} -> {_pct(f.get('outcome/aggregation/right'))}, "
            f"{_ci(c.get('outcome/aggregation/right'))} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="compare output folders (one M-GRPO seed each)")
    parser.add_argument("--reference", type=Path, default=None,
                        help="a run folder holding eval_reference.jsonl (the oracle clone), or the file itself")
    parser.add_argument("--config", default="configs/demo.yaml", help="the config whose scenario the runs used")
    parser.add_argument("--pool", action="append", default=[], metavar="NAME=DIR[,DIR...]",
                        help="one more row pooling every seed of these folders (e.g. a winner's 3 seeds)")
    parser.add_argument("--earlier", type=Path, default=None,
                        help="an earlier sweep.json whose rows come first (runs no longer on disk; read as written)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = load_config(args.config, [])
    scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
    ref_file = args.reference / "eval_reference.jsonl" if args.reference and args.reference.is_dir() else args.reference
    reference = list(read_jsonl(ref_file)) if ref_file else None
    rows = json.loads(args.earlier.read_text()) if args.earlier else []
    for folder in args.runs:
        for run in seed_runs(folder):
            seed = run.parent.name[4:]
            rows.append(run_figures(folder.name if seed == "0" else f"{folder.name} seed {seed}", [run], reference,
                                    scenario))
    for spec in args.pool:
        name, _, dirs = spec.partition("=")
        runs = [run for folder in dirs.split(",") for run in seed_runs(Path(folder))]
        rows.append(run_figures(f"{name} ({len(runs)} seeds pooled)", runs, reference, scenario))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep.json").write_text(strict_json.dumps(rows, indent=2, default=str) + "\n")
    text = table(rows)
    (args.out / "sweep.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
