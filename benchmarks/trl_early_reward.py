"""Issue 53, item 4: why TRL's training reward over its first 32 steps (0.080) sat below ours (0.143).

Both sides start from the same planner and frozen sub-agent and pay the same reward, but they do not
draw the same questions: ours draws B questions per iteration with ``iteration_rngs(seed, t)`` (with
replacement across iterations), TRL's ``RepeatSampler`` walks a ``torch.randperm`` of the split seeded
with ``args.seed``. This script lists each side's questions for the first N steps (no model needed) and
then measures the START policy (the demo's frozen-sub start, our env and policy, the rollouts'
temperature) on every distinct question of either side, ``--samples`` rollouts each: the reward each
side's question draw would pay before any update.

    .venv/bin/python benchmarks/trl_early_reward.py --steps 32 --samples 4

Writes benchmarks/results/trl_early_reward.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def question_draws(config, ids: list[str], steps: int) -> dict[str, list[list[str]]]:
    """Each side's questions per step: ours (``Trainer.train_iteration``), TRL's (``RepeatSampler``)."""
    import torch

    from mgrpo_algo.core.seeding import iteration_rngs

    b = config.questions_per_iteration
    ours = []
    for t in range(steps):
        rng, _ = iteration_rngs(config.seed, t)
        ours.append([ids[i] for i in rng.choice(len(ids), size=min(b, len(ids)), replace=False)])
    generator = torch.Generator()
    generator.manual_seed(config.seed)
    trl: list[list[str]] = []
    while len(trl) < steps:  # one permutation per epoch, whole chunks of b only (RepeatSampler.__iter__)
        perm = torch.randperm(len(ids), generator=generator).tolist()
        trl += [[ids[i] for i in perm[j:j + b]] for j in range(0, len(perm) - b + 1, b)]
    return {"ours": ours, "trl": trl[:steps]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--split", default="stage2/train")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4, help="rollouts of the start per distinct question")
    ap.add_argument("--seed", type=int, default=12345, help="the measurement's own episode seeds")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "trl_early_reward.json"))
    args = ap.parse_args(argv)

    import mgrpo_scenarios
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.core.seeding import policy_seed
    from mgrpo_algo.policies.factory import make_policy
    from mgrpo_algo.training.trainer import env_options, reward_config
    from mgrpo_env import strict_json
    from mgrpo_env.rollout import collect

    config = load_config(args.config)
    scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
    tasks = {t.id: t for t in scenario.tasks(args.split)}
    draws = question_draws(config, list(tasks), args.steps)
    distinct = sorted({q for side in draws.values() for step in side for q in step})
    policies = {role: make_policy(role, str(config.role(role).model), str(config.role(role).model), config.role(role),
                                  seed=policy_seed(args.seed, role, 0)) for role in ("main", "sub")}
    started = time.perf_counter()
    with scenario.open() as world:
        records = collect(scenario, [tasks[q] for q in distinct], args.samples, policies, world=world, seed=args.seed,
                          max_workers=config.max_workers, env_kwargs=env_options(config, reward_config(config, scenario)))
    minutes = (time.perf_counter() - started) / 60
    paid: dict[str, list[float]] = {}
    ends: dict[str, int] = {}
    for record in records:
        paid.setdefault(record.task["id"], []).append(record.rewards["main_0"])
        ends[record.end_reason] = ends.get(record.end_reason, 0) + 1
    p = {q: statistics.fmean(v) for q, v in paid.items()}

    def side(name: str, n: int) -> dict[str, float]:
        drawn = [q for step in draws[name][:n] for q in step]
        return {"draws": len(drawn), "distinct": len(set(drawn)), "start_reward": statistics.fmean(p[q] for q in drawn)}

    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "split": args.split, "steps": args.steps, "samples_per_question": args.samples,
        "distinct_questions_measured": len(distinct), "episodes": len(records), "minutes": round(minutes, 1),
        "end_reasons": ends,
        "start_reward_on_each_sides_questions": {name: side(name, args.steps) for name in draws},
        "first_10_steps": {name: side(name, min(10, args.steps)) for name in draws},
        "common_distinct_questions": len({q for s in draws["ours"] for q in s} & {q for s in draws["trl"] for q in s}),
        "per_question_start_reward": p,
        "draws": draws,
    }
    Path(args.out).write_text(strict_json.dumps(result, indent=1) + "\n")
    for name, figures in result["start_reward_on_each_sides_questions"].items():
        print(f"{name}: first {args.steps} steps draw {figures['draws']} questions ({figures['distinct']} distinct); "
              f"the start policy pays {figures['start_reward']:.3f} on them")
    print(f"{len(records)} episodes in {minutes:.1f} min; end reasons {ends}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
