"""The planner sweep of issue 51: M-GRPO runs of the demo's config with one lever each, side by side.

Each run is ``mgrpo compare --config configs/demo.yaml --seeds 1 --modes mgrpo --set eval.greedy=false
--set eval.every=0 [--set "eval.reference=''"] --set <lever> --out runs/planner/<name>`` (seed 0, 2,048
rollouts, 224 held-out questions x 4 at T = 1). This script reads the folders and prints, per run: held-out
mean@4 start -> after with its paired interval, after - the oracle clone (paired over questions, from the
``--reference`` run's ``eval_reference.jsonl``), which role lost each held-out answer (mgrpo_env.attribution:
the main agent never asked a needed hop / failed to combine; a sub-agent reported a hop wrong / without a
result), the delegations that ask a needed hop (per question, averaged; start -> after with its paired
interval), the sub-agents' accuracy on exactly delegated hops, and the aggregation questions answered right.
It writes the table and the figures to ``--out`` (``sweep.json``, ``sweep.md``).

    python benchmarks/planner_sweep.py runs/planner/* --reference runs/planner/base \
        --out benchmarks/results/planner_sweep
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


def run_figures(folder: Path, reference: list[Any] | None, scenario: Any) -> dict[str, Any]:
    """One run's row (the figures of the module docstring), from its folder."""
    summary = json.loads((folder / "summary.json").read_text())
    run = folder / "seed0" / "mgrpo"
    start = list(read_jsonl(run / "eval_before.jsonl"))
    after = list(read_jsonl(run / "eval_after.jsonl"))
    config = json.loads((run / "config.json").read_text())
    row = summary["results"]["mgrpo"]["per_seed"][0]
    attribution = attribution_summary(attribution_counts_by_question(start, scenario),
                                      attribution_counts_by_question(after, scenario), seed=0)
    return {
        "name": folder.name,
        "levers": {k: config[k] for k in LEVER_FIELDS if k in config},
        "start_mean_k": row["before"]["mean_k"], "after_mean_k": row["after"]["mean_k"],
        "delta": summary["intervals"]["mgrpo: after - start"],
        "vs_reference": (iv.paired_difference(iv.per_question(after), iv.per_question(reference), seed=0)
                         if reference else None),
        "attribution": attribution,
        "minutes": row.get("minutes"),
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
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = load_config(args.config, [])
    scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
    ref_file = args.reference / "eval_reference.jsonl" if args.reference and args.reference.is_dir() else args.reference
    reference = list(read_jsonl(ref_file)) if ref_file else None
    rows = [run_figures(folder, reference, scenario) for folder in args.runs if (folder / "summary.json").is_file()]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep.json").write_text(strict_json.dumps(rows, indent=2, default=str) + "\n")
    text = table(rows)
    (args.out / "sweep.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
