"""Issue 42, part 3: TRL's frozen-sub against ours, from the same start, the same rewards and the same
rollout budget, evaluated on the demo's held-out questions (stage2/test + stage2/heldout, 224) x 4.

    python benchmarks/trl_crosscheck.py --iterations 128     # the demo's budget (2,048 rollouts per side)
    python benchmarks/trl_crosscheck.py --iterations 16      # a reduced budget, both sides alike

Runs, one after another (each a subprocess, its command recorded): TRL's planner training
(``examples/trl_frozen_sub.py``), ours (``mgrpo train --config configs/demo.yaml --set mode=frozen-sub``),
then ``mgrpo eval`` of each trained planner with the frozen start sub-agents (mean@4 at the rollouts'
temperature; greedy off). The start is the demo's committed start evaluation when ``--start-episodes``
names its episodes (the same models, config and seeds give the same episodes), else evaluated here.
Writes ``benchmarks/results/trl_crosscheck.json``: mean@4 of each, after - start for each, and TRL -
ours, each with its paired 95% bootstrap interval over questions (``mgrpo_algo.experiments.intervals``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mgrpo_env import strict_json

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/demo.yaml"
OUT_JSON = ROOT / "benchmarks" / "results" / "trl_crosscheck.json"


def run(command: list[str], log: Path, threads: int) -> float:
    """``command`` from the repository root, its output in ``log``; minutes taken."""
    started = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}  # both sides alike
    with log.open("w") as fh:
        done = subprocess.run(command, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: see {log}")
    return (time.perf_counter() - started) / 60


def scores(episodes: Path) -> dict[str, list[bool]]:
    """``{question: [correct of each sample]}`` from an ``episodes.jsonl``."""
    out: dict[str, list[bool]] = {}
    for line in episodes.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            out.setdefault(record["task"]["id"], []).append(bool(record["correct"]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=128, help="iterations (TRL: optimizer steps) per side")
    ap.add_argument("--out", default="runs/trl_crosscheck", help="run folders and logs")
    ap.add_argument("--start-episodes", default=None,
                    help="the start's held-out episodes (a compare run's eval_before.jsonl); default: evaluate it")
    ap.add_argument("--skip-done", action="store_true", help="keep the steps whose output exists")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every step (1: a shared machine)")
    ap.add_argument("--eval-limit", type=int, default=0,
                    help="held-out questions evaluated (0: all 224; fewer only to try the script out)")
    ap.add_argument("--json", default=str(OUT_JSON), help="where the figures go")
    ap.add_argument("--note", default="", help="a sentence kept with the figures (the machine, the load)")
    args = ap.parse_args(argv)
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    stages = f"stages=[{{split: stage2/train, iterations: {args.iterations}}}]"
    evaluate = [py, "-m", "mgrpo_algo", "eval", "--config", CONFIG, "--set", "eval.greedy=false",
                "--set", f"eval.limit={args.eval_limit}", "--quiet"]
    steps = {
        "trl_train": [py, "examples/trl_frozen_sub.py", "--config", CONFIG, "--steps", str(args.iterations),
                      "--out", str(out / "trl")],
        "ours_train": [py, "-m", "mgrpo_algo", "train", "--config", CONFIG, "--set", "mode=frozen-sub",
                       "--set", stages, "--set", "eval.every=0", "--set", f"out_dir={out / 'ours'}"],
        "trl_eval": [*evaluate, "--agent", f"main={out / 'trl' / 'main'},sub=configs/demo-warm-start/sub",
                     "--out", str(out / "eval_trl")],
        "ours_eval": [*evaluate, "--agent", str(out / "ours" / "final"), "--out", str(out / "eval_ours")],
    }
    if args.start_episodes is None:
        steps["start_eval"] = [*evaluate, "--agent", "configs/demo-warm-start", "--out", str(out / "eval_start")]
    done_marks = {"trl_train": out / "trl" / "main" / "model.safetensors", "ours_train": out / "ours" / "final",
                  "trl_eval": out / "eval_trl" / "summary.json", "ours_eval": out / "eval_ours" / "summary.json",
                  "start_eval": out / "eval_start" / "summary.json"}
    minutes = {}
    for name, command in steps.items():
        if args.skip_done and done_marks[name].exists():
            continue
        print(f"{name}: {' '.join(command)}", flush=True)
        minutes[name] = round(run(command, out / f"{name}.log", args.threads), 1)
        print(f"{name}: {minutes[name]} min", flush=True)

    from mgrpo_algo.experiments import intervals as iv

    start = scores(Path(args.start_episodes) if args.start_episodes else out / "eval_start" / "episodes.jsonl")
    trl, ours = scores(out / "eval_trl" / "episodes.jsonl"), scores(out / "eval_ours" / "episodes.jsonl")
    start = {q: start[q] for q in trl}  # a reused start evaluation may hold more questions than a limited one

    def pct(d: dict[str, float]) -> dict[str, float]:
        return {"points": round(100 * d["diff"], 1), "low": round(100 * d["low"], 1), "high": round(100 * d["high"], 1)}

    trl_log = json.loads((out / "trl" / "log.json").read_text())
    result = {
        "note": args.note,
        "budget": {"iterations": args.iterations, "rollouts_per_side": args.iterations * 16,
                   "demo_budget_iterations": 128, "reduced": args.iterations < 128},
        "questions": len(start), "samples": 4,
        "mean_at_4": {"start": round(100 * iv.mean_at_k(start), 1), "trl": round(100 * iv.mean_at_k(trl), 1),
                      "ours": round(100 * iv.mean_at_k(ours), 1)},
        "paired_95": {"trl_after_minus_start": pct(iv.paired_difference(trl, start)),
                      "ours_after_minus_start": pct(iv.paired_difference(ours, start)),
                      "trl_minus_ours": pct(iv.paired_difference(trl, ours))},
        "trl_episodes_cut": trl_log.get("episodes_cut_by_trl"),
        "commands": {name: " ".join(str(c) for c in command).replace(py, "python").replace(f"{ROOT}/", "")
                     for name, command in steps.items()},
        "start_episodes": args.start_episodes, "omp_num_threads": args.threads,
        "minutes": minutes,
        "trl_minutes_per_step": round(trl_log["minutes"] / max(1, trl_log["steps"]), 2),
    }
    Path(args.json).write_text(strict_json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
