"""The credit sweep of issue 40: M-GRPO runs of the demo's config with one lever each, side by side.

Each run is ``mgrpo compare --config configs/demo.yaml --seeds 1 --modes mgrpo --set eval.greedy=false
--set "eval.reference=''" --set <lever> --out runs/sweep/<name>`` (seed 0, 2,048 rollouts, 224 held-out
questions x 4 at T = 1). This script reads the folders and prints, per run: held-out mean@4 start -> after
with its paired interval, how held-out episodes end (malformed main episodes, sub-agents without a result,
turn-limit episodes, accuracy of the answered ones, mgrpo_env.mistakes), the decision mistakes, the
sub-agents' hop skill (per question, the mean expert score of every delegated sub-agent, no result = 0;
after - start with a paired interval), and the training format rates per role over the first 16 and the
last 32 iterations. It writes the table and the figures to ``--out`` (JSON and Markdown).

    python benchmarks/credit_sweep.py runs/sweep/* --reference runs/sweep_reference/eval_reference.jsonl \
        --out benchmarks/results/credit_sweep
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mgrpo_algo.experiments import intervals as iv
from mgrpo_env import strict_json
from mgrpo_env.episode import read_jsonl
from mgrpo_env.mistakes import mistake_rates


def hop_skill(records: list[Any]) -> dict[str, list[float]]:
    """Per question, the expert score of every delegated sub-agent (a sub-agent without a result, or
    without a score, counts 0)."""
    out: dict[str, list[float]] = {}
    for r in records:
        for sub in r.subs:
            score = sub.expert if (sub.final is not None and sub.expert is not None) else 0.0
            out.setdefault(str(r.task.get("id")), []).append(float(score))
    return out


def _paired(after: dict[str, list[float]], start: dict[str, list[float]]) -> dict[str, float]:
    common = sorted(set(after) & set(start))
    return iv.paired_difference({q: after[q] for q in common}, {q: start[q] for q in common}, seed=0)


def _train_means(metrics: list[dict[str, Any]], key: str) -> tuple[float | None, float | None]:
    def mean(rows: list[dict[str, Any]]) -> float | None:
        values = [r[key] for r in rows if key in r]
        return sum(values) / len(values) if values else None
    return mean(metrics[:16]), mean(metrics[-32:])


def run_figures(folder: Path, reference: list[Any] | None = None) -> dict[str, Any]:
    summary = json.loads((folder / "summary.json").read_text())
    run = folder / "seed0" / "mgrpo"
    start = list(read_jsonl(run / "eval_before.jsonl"))
    after = list(read_jsonl(run / "eval_after.jsonl"))
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    row = summary["results"]["mgrpo"]["per_seed"][0]
    skill_start, skill_after = hop_skill(start), hop_skill(after)
    config = json.loads((run / "config.json").read_text())
    return {
        "name": folder.name,
        "levers": {k: config[k] for k in ("turn_format_penalty", "success_likelihood", "sub_outcome_groups",
                                          "sub_weights", "main_weights") if k in config},
        "learners": {role: {k: config[role]["learner"][k] for k in ("lr", "kl_coef")} for role in ("main", "sub")},
        "start_mean_k": row["before"]["mean_k"], "after_mean_k": row["after"]["mean_k"],
        "delta": summary["intervals"]["mgrpo: after - start"],
        "start": mistake_rates(start), "after": mistake_rates(after),
        "hop_skill": {"start": sum(map(sum, skill_start.values())) / max(1, sum(map(len, skill_start.values()))),
                      "after": sum(map(sum, skill_after.values())) / max(1, sum(map(len, skill_after.values()))),
                      "change": _paired(skill_after, skill_start)},
        "train_format": {role: _train_means(metrics, f"{role}/format_ok") for role in ("main", "sub")},
        "train_expert": _train_means(metrics, "sub/expert_mean"),
        "iterations": len(metrics),
        # after RL minus the oracle clone (the reference start), paired over questions
        "vs_reference": (iv.paired_difference(iv.per_question(after), iv.per_question(reference), seed=0)
                         if reference else None),
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _ci(c: dict[str, float]) -> str:
    return f"{100 * c['diff']:+.1f} [{100 * c['low']:+.1f}, {100 * c['high']:+.1f}]"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| run | mean@4 start -> after | Δ [95% CI] | after - oracle clone [95% CI] | malformed main episodes | sub-agents without a result "
             "| turn-limit episodes | answered accuracy | answer early (per decision) | hop skill start -> after, Δ [95% CI] "
             "| training format main, first 16 / last 32 | sub | training expert score |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, a = r["start"], r["after"]
        fm, fs, ex = r["train_format"]["main"], r["train_format"]["sub"], r["train_expert"]
        lines.append(
            f"| {r['name']} | {_pct(r['start_mean_k'])} -> {_pct(r['after_mean_k'])} | {_ci(r['delta'])} "
            f"| {_ci(r['vs_reference']) if r['vs_reference'] else '-'} "
            f"| {_pct(s['malformed_main_episodes'])} -> {_pct(a['malformed_main_episodes'])} "
            f"| {_pct(s['sub_no_result'])} -> {_pct(a['sub_no_result'])} "
            f"| {_pct(s['turn_limit_episodes'])} -> {_pct(a['turn_limit_episodes'])} "
            f"| {_pct(s['answered_accuracy'])} -> {_pct(a['answered_accuracy'])} "
            f"| {_pct(s['answer_early'])} -> {_pct(a['answer_early'])} "
            f"| {r['hop_skill']['start']:.3f} -> {r['hop_skill']['after']:.3f}, {_ci(r['hop_skill']['change'])} "
            f"| {fm[0]:.2f} / {fm[1]:.2f} | {fs[0]:.2f} / {fs[1]:.2f} | {ex[0]:.3f} / {ex[1]:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="mgrpo compare folders (one mode: mgrpo)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/credit_sweep"))
    parser.add_argument("--reference", type=Path, default=None,
                        help="the oracle clone's eval_reference.jsonl under the same evaluation (compare's reference)")
    args = parser.parse_args()
    reference = list(read_jsonl(args.reference)) if args.reference else None
    rows = [run_figures(folder, reference) for folder in args.runs if (folder / "summary.json").is_file()]
    text = table(rows)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep.json").write_text(strict_json.dumps(rows, indent=2) + "\n")
    (args.out / "sweep.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
