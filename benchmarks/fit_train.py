"""Can RL fit its own training questions? M-GRPO and frozen-sub on a small fixed set, before vs after.

    .venv/bin/python benchmarks/fit_train.py [--quick] [--recipe fit|paper] [--questions 4] [--set KEY=VALUE ...]

The sanity check of issue 23: train on the first N ``stage2/train`` questions of the demo's world
(``split_sizes: {stage2/train: N}``, so the set is fixed; by default every iteration sees all of it,
K = 16 rollouts each) from the committed warm start, then evaluate **the same questions** with k
samples at the rollout temperature: mean@k before and after, its paired bootstrap interval, pass@k
(what sampling reaches at all: RL cannot fit a question none of its samples solves), and the
sub-agents' own accuracy (the expert score of their reports) before and after. ``mgrpo`` trains both roles,
``frozen-sub`` only the main agent: the difference isolates what the sub learner adds.

Recipes (every field is a ``mgrpo_algo.core.config.TrainConfig`` override; the comparison runs
through ``mgrpo compare``, so the same numbers come out of the CLI):

* ``paper``: the paper's rewards (format pays) and its "seq-mean" normaliser over every sample;
* ``fit``: correctness-only main reward (a guess in the right format earns nothing) and
  ``informative_only`` learners (groups without spread leave the batch, as DAPO's dynamic
  sampling drops them); the sweep in docs/results/fitting.md says why.

Writes benchmarks/results/fit_train.json (and the comparison folder under runs/fit_train/).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, report  # noqa: E402

from mgrpo_env import strict_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

def settings(recipe: str, questions: int, batch: int, group: int, iterations: int, samples: int) -> list[str]:
    """The TrainConfig overrides of a run: the fixed question set, the budget, the recipe."""
    common = [
        f"scenario_kwargs={{num_entities: 300, seed: 0, profile: tiny, split_sizes: {{stage2/train: {questions}}}}}",
        f"stages=[{{split: stage2/train, iterations: {iterations}}}]",
        f"questions_per_iteration={batch}",
        f"group_size={group}",
        "main.learner.minibatches=4",
        "sub.learner.minibatches=4",
        "main.learner.lr=3e-4",
        "sub.learner.lr=3e-4",
        "eval.split=stage2/train",
        f"eval.limit={questions}",
        f"eval.samples={samples}",
        "eval.temperature=1.0",
        "eval.greedy=false",
        "checkpoint=false",
    ]
    return common + RECIPES[recipe]


#: What each recipe adds to the common settings (measured side by side in docs/results/fitting.md).
RECIPES: dict[str, list[str]] = {
    "paper": [],
    "fit": ["main_weights=[0.0, 1.0]", "main.learner.informative_only=true", "sub.learner.informative_only=true"],
}


def sub_accuracy(path: Path) -> float:
    """Mean expert score of every sub-agent report in an eval JSONL (the sub's own accuracy)."""
    from mgrpo_env.episode import read_jsonl

    scores = [s.expert for r in read_jsonl(path) for s in r.subs if s.expert is not None]
    return sum(scores) / len(scores) if scores else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="2 questions, 2 iterations of 2 x 2 (CI smoke run)")
    parser.add_argument("--recipe", default="fit", choices=sorted(RECIPES))
    parser.add_argument("--questions", type=int, default=4, help="the first N stage2/train questions")
    parser.add_argument("--batch", type=int, default=0, help="questions per iteration (default: all N)")
    parser.add_argument("--group-size", type=int, default=16, help="K rollouts per question")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--samples", type=int, default=16, help="k of the before/after mean@k")
    parser.add_argument("--modes", default="mgrpo,frozen-sub")
    parser.add_argument("--out", default=str(ROOT / "runs" / "fit_train"))
    parser.add_argument("--set", action="append", default=[], help="more TrainConfig overrides (after the recipe's)")
    args = parser.parse_args()

    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.experiments.compare import run_compare

    if args.quick:
        args.questions, args.batch, args.group_size, args.iterations, args.samples = 2, 2, 2, 2, 2
    questions = args.questions
    overrides = [*settings(args.recipe, questions, args.batch or questions, args.group_size, args.iterations, args.samples),
                 *args.set]
    config = load_config(str(ROOT / "configs" / "demo.yaml"), overrides)
    modes = [m for m in args.modes.split(",") if m]
    out = Path(args.out) / ("quick" if args.quick else args.recipe)
    t0 = time.perf_counter()
    summary = run_compare(config, seeds=1, out_dir=out, modes=modes, progress=False,
                          command=" ".join(["benchmarks/fit_train.py", *sys.argv[1:]]))
    minutes = (time.perf_counter() - t0) / 60
    k = config.eval.samples
    rows, per_mode = [], {}
    for mode in modes:
        run = summary["results"][mode]["per_seed"][0]
        iv = summary["intervals"][f"{mode}: after - start"]
        run_dir = out / "seed0" / mode
        subs = (sub_accuracy(run_dir / "eval_before.jsonl"), sub_accuracy(run_dir / "eval_after.jsonl"))
        per_mode[mode] = {"before_mean_k": run["before_em"], "after_mean_k": run["after_em"], "interval": iv,
                          "before_pass_k": run["before_pass_k"], "after_pass_k": run["after_pass_k"],
                          "sub_accuracy": subs, "rollouts": run["rollouts"], "train_minutes": run["train_seconds"] / 60}
        rows += [
            (f"{mode}: mean@{k} before", run["before_em"] * 100, "% of the training questions"),
            (f"{mode}: mean@{k} after", run["after_em"] * 100, "%"),
            (f"{mode}: after - before", iv["diff"] * 100, f"points, 95% CI [{iv['low'] * 100:+.1f}, {iv['high'] * 100:+.1f}]"),
            (f"{mode}: pass@{k} before -> after", f"{run['before_pass_k'] * 100:.1f} -> {run['after_pass_k'] * 100:.1f}", "%"),
            (f"{mode}: sub-agent accuracy before -> after", f"{subs[0] * 100:.1f} -> {subs[1] * 100:.1f}",
             "% of sub-agent reports the expert scores correct"),
            (f"{mode}: training", run["train_seconds"] / 60, f"minutes for {run['rollouts']} rollouts"),
        ]
    rows.append(("total", minutes, "minutes, evaluations included"))
    name = "fit_train" if args.recipe == "fit" else f"fit_train_{args.recipe}"
    report(name, rows, {"recipe": args.recipe, "questions": questions, "overrides": overrides,
                               "modes": per_mode, "quick": args.quick})
    (RESULTS / f"{name}_summary.json").write_text(strict_json.dumps(summary, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
