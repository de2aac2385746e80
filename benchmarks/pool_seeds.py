"""Pool the seeds of several `mgrpo compare` folders into one table with paired intervals over seeds.

`mgrpo compare --seeds 3` pools its own seeds; this does the same for seeds run as separate
comparisons (e.g. the demo's seed 0 beside `--set seed=1 --seeds 2`, run side by side on two cores).
Every figure is recomputed from the episode files (`seed*/<mode>/eval_before.jsonl`, `eval_after.jsonl`):
per question the share correct of its samples, pooled over seeds; differences with a paired percentile
bootstrap over questions (`mgrpo_algo.experiments.intervals`), mistake rates as in report.md.

    .venv/bin/python benchmarks/pool_seeds.py runs/demo runs/demo-seeds12 --out benchmarks/results/demo_3seeds.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mgrpo_algo.experiments import intervals as iv
from mgrpo_algo.experiments.mistake_stats import mistake_changes, pool_counts
from mgrpo_env import strict_json
from mgrpo_env.episode import read_jsonl
from mgrpo_env.mistakes import counts_by_question, rates_of_counts

MODES = ("mgrpo", "frozen-sub", "single-agent")


def load(folders: list[Path]) -> dict[str, dict[int, dict[str, list]]]:
    """{mode: {seed: {"start": records, "after": records}}} over every folder (a seed seen twice is refused)."""
    runs: dict[str, dict[int, dict[str, list]]] = {}
    for folder in folders:
        for run in sorted(folder.glob("seed*/*")):
            if run.name not in MODES or not (run / "eval_after.jsonl").is_file():
                continue
            seed = int(run.parent.name.removeprefix("seed"))
            if seed in runs.get(run.name, {}):
                raise SystemExit(f"seed {seed} of {run.name} appears twice ({run})")
            runs.setdefault(run.name, {})[seed] = {"start": list(read_jsonl(run / "eval_before.jsonl")),
                                                   "after": list(read_jsonl(run / "eval_after.jsonl"))}
    return runs


def pooled(runs: dict[str, dict[int, dict[str, list]]], max_delegations: int = 3) -> dict:
    scores = {mode: {when: iv.pool_runs([iv.per_question(s[when]) for _, s in sorted(seeds.items())])
                     for when in ("start", "after")} for mode, seeds in runs.items()}
    out: dict = {"seeds": {mode: sorted(seeds) for mode, seeds in runs.items()}, "modes": {}, "differences": {}}
    for mode, s in scores.items():
        per_seed = [iv.mean_at_k(iv.per_question(runs[mode][seed]["after"])) for seed in sorted(runs[mode])]
        counts = {when: pool_counts([counts_by_question(runs[mode][seed][when], max_delegations)
                                     for seed in sorted(runs[mode])]) for when in ("start", "after")}
        out["modes"][mode] = {
            "start_mean_k": iv.mean_at_k(s["start"]), "after_mean_k": iv.mean_at_k(s["after"]),
            "after_mean_k_per_seed": per_seed,
            "after_minus_start": iv.paired_difference(s["after"], s["start"]),
            "mistakes": {"start": rates_of_counts(counts["start"]), "after": rates_of_counts(counts["after"]),
                         "change": mistake_changes(counts["after"], counts["start"], seed=0)},
        }
    for a, b in (("mgrpo", "frozen-sub"), ("frozen-sub", "single-agent"), ("mgrpo", "single-agent")):
        if a in scores and b in scores and out["seeds"][a] == out["seeds"][b]:
            out["differences"][f"after: {a} - {b}"] = iv.paired_difference(scores[a]["after"], scores[b]["after"])
    return out


def table(result: dict) -> str:
    def ci(d: dict) -> str:
        return f"{d['diff'] * 100:+.1f} [{d['low'] * 100:+.1f}, {d['high'] * 100:+.1f}]"

    lines = ["| mode | seeds | start mean@k | after mean@k (per seed) | after - start [95% CI] |", "|---|---|---:|---|---|"]
    for mode, m in result["modes"].items():
        seeds = ", ".join(str(s) for s in result["seeds"][mode])
        per = " / ".join(f"{v * 100:.1f}" for v in m["after_mean_k_per_seed"])
        lines.append(f"| {mode} | {seeds} | {m['start_mean_k'] * 100:.1f} | {m['after_mean_k'] * 100:.1f} ({per}) | "
                     f"{ci(m['after_minus_start'])} |")
    lines += ["", "| difference (pooled over seeds) | points [95% CI] |", "|---|---|"]
    lines += [f"| {name} | {ci(d)} |" for name, d in result["differences"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="mgrpo compare output folders")
    parser.add_argument("--out", type=Path, default=None, help="write the pooled figures here (JSON)")
    args = parser.parse_args(argv)
    runs = load(args.folders)
    if not runs:
        print("no finished runs (seed*/<mode>/eval_after.jsonl) in " + ", ".join(map(str, args.folders)), file=sys.stderr)
        return 2
    result = pooled(runs)
    print(table(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(strict_json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
