"""Live rollouts against pure decode of the same model at the same rows, and the demo's training speed.

    .venv/bin/python benchmarks/live_decode.py [--quick] [--repeats R] [--iterations N]

On ``configs/demo.yaml`` (wiki-hops tiny profile, the committed warm-start models, the demo's limits,
B = 4 questions x K = 4 rollouts, 1 torch thread), in one process:

**Live against pure decode.** Real collections, interleaved per repeat between two sides that differ
only in the prefill of each decode call: ``before`` runs it through the model's forward, ``after``
through :meth:`~mgrpo_algo.policies.fast_step.FastStep.prefill` (``TransformersPolicy.fast_prefill``).
The two sides sample the same ids up to float rounding (checked: the sampled token counts are
reported side by side). Live tokens/s = sampled tokens / policy time (prompts, KV reuse, prefill,
steps, sampling: all a policy call costs). **Pure decode at the same rows** replays every decode batch
the after side ran (``TransformersPolicy.batch_shapes``: rows, steps, context width) as a decoder fed
perfectly: the same rows and context width, every row sampling at every step, no loop around it and
no prefill (the context is prefilled untimed). The headline is live / pure (target >= 50%). Beside it:
the share of row-steps that sampled a kept token (a row that has stopped still rides along until the
batch's longest row stops), and the issue's first figure (the kernel at 16 rows of 8-token prompts,
64 new tokens), which compared other shapes.

**Schedules.** From the after side's records, the model steps of the synchronous rounds the loop runs
(each round: one call per role, as long as its longest turn) against continuous batching (each
episode's next turn joins its role's running batch at the next step; a step of both roles when both
have rows), computed from each episode's turn lengths in order; the rounds figure is checked against
the steps the collection actually ran. It is why continuous batching was not built (the closing note of
issue 31). One collection at B = 8 x K = 8 (the paper's K) shows what more rollouts in flight do to
the rows per step and tokens/s.

**Training.** M-GRPO iterations of the demo config, before / after alternated with the same seeds:
rollouts per minute, and where an iteration's time goes (collection, update). The update does not
depend on the decode: ``update floor`` is the rollouts/min an iteration would reach with a
collection that took no time.

Writes benchmarks/results/live_decode.json (``--quick``: results/quick/).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import report  # noqa: E402
from generation import Timed  # noqa: E402  (a policy wrapper adding up its calls' time and tokens)

ROOT = Path(__file__).resolve().parent.parent
ROLES = ("main", "sub")
#: side -> (TransformersPolicy.fast_prefill, .compact): the levers of issue 31 off, one by one on
SIDES = {"before": (False, False), "prefill": (True, False), "after": (True, True)}
TRAIN_SIDES = ("before", "after")


def trainer_for(tmp: Path, label: str, b: int, k: int, iterations: int) -> Any:
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.training.trainer import Trainer

    overrides = [
        "mode=mgrpo", f"out_dir={tmp / label}", f"models_dir={tmp / 'models'}",
        f"scenario_kwargs={{num_entities: 300, seed: 0, profile: tiny, data_dir: {tmp / 'data'}, prerender: true}}",
        f"questions_per_iteration={b}", f"group_size={k}", f"stages=[{{split: stage2/train, iterations: {iterations}}}]",
        "torch_threads=1", "checkpoint=false",
    ]
    trainer = Trainer(load_config(ROOT / "configs" / "demo.yaml", overrides))
    for role in ROLES:
        policy = trainer.workers[role].policy
        policy.fast_prefill, policy.compact = SIDES[label]
    return trainer


def collect_timed(trainer: Any, world: Any, tasks: list[Any], k: int, seed: int, side: str) -> dict[str, Any]:
    """One collection: policy seconds, sampled tokens, the decode batches per role and the records."""
    from mgrpo_algo.core.seeding import policy_seed
    from mgrpo_env.rollout import collect

    cfg = trainer.config
    policies = {}
    for role in ROLES:
        policy = trainer.workers[role].policy
        policy.fast_prefill, policy.compact = SIDES[side]
        policy.reseed(policy_seed(0, role, seed))
        policy.batch_shapes.clear()
        policies[role] = Timed(policy)
    records = collect(trainer.scenario, tasks, k, policies, world=world, seed=seed, max_workers=cfg.max_workers,
                      env_kwargs={"limits": cfg.limits, "rewards": trainer.reward_config})
    return {"seconds": sum(p.seconds for p in policies.values()), "tokens": sum(p.tokens for p in policies.values()),
            "shapes": {role: list(trainer.workers[role].policy.batch_shapes) for role in ROLES}, "records": records}


def pure_decode(model: Any, shapes: list[tuple[int, ...]], vocab: int) -> tuple[float, int]:
    """``(seconds, tokens)`` of decoding every ``(rows, steps, width)`` batch with every row busy at every
    step, after an untimed prefill of its context (random ids, no padding, no stop)."""
    import torch

    from mgrpo_algo.policies.decode import decode

    generator = torch.Generator().manual_seed(0)
    seconds, tokens = 0.0, 0
    for rows, steps, width, *_ in shapes:
        ids = torch.randint(5, vocab, (rows, width + 1), generator=generator)
        mask = torch.ones_like(ids)
        with torch.no_grad():
            _, _, cache = decode(model, ids[:, :width], mask[:, :width], None, max_new_tokens=1, stop_ids=[], pad_id=0,
                                 temperature=1.0, top_p=1.0, step="fast", sampler="inverse_cdf")
            t0 = time.perf_counter()
            out, _, _ = decode(model, ids, mask, cache, max_new_tokens=steps, stop_ids=[], pad_id=0, temperature=1.0,
                               top_p=1.0, step="fast", sampler="inverse_cdf")
            seconds += time.perf_counter() - t0
        tokens += out.numel()
    return seconds, tokens


def turn_lengths(record: Any) -> list[tuple[str, int]]:
    """The episode's turns in the order they ran: ``(role, sampled tokens)``; a main turn that delegated
    is followed by its sub-agent's turns."""
    subs, order = iter(record.subs), []
    for turn in record.main.turns:
        order.append(("main", max(1, len(turn.extra.get("completion_ids", [])))))
        if turn.tool_call is not None and turn.tool_call.tool == "delegate":
            sub = next(subs, None)
            if sub is not None:
                order += [("sub", max(1, len(t.extra.get("completion_ids", [])))) for t in sub.turns]
    return order


def schedules(records: list[Any]) -> dict[str, int]:
    """Model steps (and calls / prefills) of the synchronous rounds and of continuous batching."""
    episodes = [turn_lengths(r) for r in records]
    position, rounds_steps, rounds_calls = [0] * len(episodes), 0, 0
    while any(p < len(e) for p, e in zip(position, episodes, strict=True)):
        longest: dict[str, int] = {}
        for i, turns in enumerate(episodes):
            if position[i] < len(turns):
                role, n = turns[position[i]]
                longest[role] = max(longest.get(role, 0), n)
                position[i] += 1
        rounds_steps += sum(longest.values())
        rounds_calls += len(longest)
    position = [0] * len(episodes)
    left = [e[0][1] if e else 0 for e in episodes]
    joining = [True] * len(episodes)
    ticks = steps = prefills = 0
    while any(p < len(e) for p, e in zip(position, episodes, strict=True)):
        active, joined = set(), set()
        for i, turns in enumerate(episodes):
            if position[i] >= len(turns):
                continue
            role = turns[position[i]][0]
            active.add(role)
            if joining[i]:
                joined.add(role)
                joining[i] = False
            left[i] -= 1
            if left[i] == 0:
                position[i] += 1
                joining[i] = True
                if position[i] < len(turns):
                    left[i] = turns[position[i]][1]
        ticks += 1
        steps += len(active)
        prefills += len(joined)
    return {"rounds_steps": rounds_steps, "rounds_calls": rounds_calls, "continuous_steps": steps,
            "continuous_ticks": ticks, "continuous_prefills": prefills,
            "longest_episode": max(sum(n for _, n in e) for e in episodes)}


def train(tmp: Path, b: int, k: int, iterations: int, warmup: int) -> dict[str, dict[str, float]]:
    """M-GRPO iterations per side, alternated, same seeds: summed times after ``warmup`` uncounted ones."""
    keys = ("time/iteration", "time/collect", "time/generation", "time/update")
    sides = {label: trainer_for(tmp, label, b, k, warmup + iterations) for label in TRAIN_SIDES}
    totals = {label: dict.fromkeys(keys, 0.0) for label in sides}
    worlds = {label: trainer.scenario.open() for label, trainer in sides.items()}
    try:
        tasks = list(sides["before"].scenario.tasks("stage2/train"))
        for it in range(warmup + iterations):
            for label, trainer in (list(sides.items()) if it % 2 == 0 else list(reversed(sides.items()))):
                metrics = trainer.train_iteration(worlds[label], tasks, "stage2/train")
                if it >= warmup:
                    for key in keys:
                        totals[label][key] += float(metrics[key])
    finally:
        for world in worlds.values():
            world.close()
    for label in sides:
        totals[label]["rollouts"] = float(b * k * iterations)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None, help="live collections per side (default 4; quick: 1)")
    parser.add_argument("--iterations", type=int, default=None, help="training iterations per side (default 8; quick: 1)")
    args = parser.parse_args()
    b, k = 4, 4
    repeats = args.repeats or (1 if args.quick else 4)
    iterations = args.iterations or (1 if args.quick else 8)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        trainer = trainer_for(tmp, "after", b, k, 1)
        tasks = list(trainer.scenario.tasks("stage2/train"))
        live: dict[str, list[dict[str, Any]]] = {label: [] for label in SIDES}
        with trainer.scenario.open() as world:
            for r in range(repeats + 1):  # repeat 0 warms both sides up (first visits, allocations): not counted
                batch = tasks[(r * b) % len(tasks):][:b]
                order = list(SIDES)[r % len(SIDES):] + list(SIDES)[: r % len(SIDES)]  # rotating order
                for label in order:
                    out = collect_timed(trainer, world, batch, k, r, label)
                    if r:
                        live[label].append(out)
            wide = {label: collect_timed(trainer, world, tasks[:8], 8, 99, label)  # more rollouts in flight
                    for label in ("prefill", "after")}
        pure_s = pure_n = 0.0
        for role in ROLES:
            model = trainer.workers[role].policy.model
            seconds, tokens = pure_decode(model, [s for out in live["after"] for s in out["shapes"][role]],
                                          model.config.vocab_size)
            pure_s, pure_n = pure_s + seconds, pure_n + tokens
        kernel_s, kernel_n = pure_decode(trainer.workers["main"].policy.model, [(16, 64, 8)] * 3,
                                         trainer.workers["main"].policy.model.config.vocab_size)
        sim = [schedules(out["records"]) for out in live["after"]]
        ran_steps = sum(steps for out in live["after"] for shapes in out["shapes"].values() for _, steps, *_ in shapes)
        training = train(tmp, b, k, iterations, warmup=1)

    rate = {label: sum(o["tokens"] for o in outs) / sum(o["seconds"] for o in outs) for label, outs in live.items()}
    pure = pure_n / pure_s
    row_steps = sum(run for out in live["after"] for shapes in out["shapes"].values() for *_, run in shapes)
    kept = sum(o["tokens"] for o in live["after"])
    per_min = {label: 60 * t["rollouts"] / t["time/iteration"] for label, t in training.items()}
    floor = 60 * training["after"]["rollouts"] / training["after"]["time/update"]
    total = {key: sum(s[key] for s in sim) for key in sim[0]}

    def rows_per_step(out: dict[str, Any]) -> float:
        shapes = [s for role in out["shapes"].values() for s in role]
        return sum(run for *_, run in shapes) / sum(n for _, n, *_ in shapes)

    seconds = {label: sum(o["seconds"] for o in outs) for label, outs in live.items()}
    tokens = {label: sum(o["tokens"] for o in outs) for label, outs in live.items()}
    rows = [
        ("live tokens/s, before", rate["before"], f"{tokens['before']} tokens in {seconds['before']:.2f} s policy time, "
         f"{repeats} collections of B={b} x K={k}: prefill through the model's forward, stopped rows ride along"),
        ("live tokens/s, + fast prefill", rate["prefill"], f"{tokens['prefill']} tokens in {seconds['prefill']:.2f} s"),
        ("live tokens/s, + stopped rows leave (after)", rate["after"], f"{tokens['after']} tokens in {seconds['after']:.2f} s"),
        ("fast prefill speed-up", rate["prefill"] / rate["before"], "live tokens/s"),
        ("stopped rows leave: speed-up", rate["after"] / rate["prefill"], "live tokens/s"),
        ("pure decode tokens/s, same rows", pure, f"the after side's {sum(len(s) for o in live['after'] for s in o['shapes'].values())} "
         f"decode batches replayed: {int(pure_n)} row-steps, same rows and context width"),
        ("live / pure, after", rate["after"] / pure, "target >= 0.5"),
        ("live / pure, before", rate["before"] / pure, ""),
        ("row-steps kept, after", kept / row_steps, "sampled tokens / rows the model ran at each step, summed"),
        ("row-steps kept, + fast prefill", tokens["prefill"] / sum(run for o in live["prefill"] for sh in o["shapes"].values()
                                                                    for *_, run in sh), "stopped rows ride along"),
        ("mean rows per step, after", row_steps / ran_steps, f"{ran_steps} decode steps"),
        ("kernel tokens/s, 16 rows x 8-token prompts", kernel_n / kernel_s, "the issue's first figure (other shapes)"),
        ("live / kernel at 16 rows, after", rate["after"] / (kernel_n / kernel_s), "the issue's 15% (other shapes)"),
        ("rounds: model steps", float(total["rounds_steps"]), "simulated from the turns (the loop ran "
         f"{sum(steps for o in live['prefill'] for sh in o['shapes'].values() for _, steps, *_ in sh)} without compaction)"),
        ("continuous batching: model steps", float(total["continuous_steps"]),
         f"{total['continuous_prefills']} prefills against the rounds' {total['rounds_calls']}; "
         f"critical path {max(s['longest_episode'] for s in sim)} tokens"),
        ("B=8 x K=8: live tokens/s, + fast prefill", wide["prefill"]["tokens"] / wide["prefill"]["seconds"],
         f"one collection, {rows_per_step(wide['prefill']):.1f} rows per step"),
        ("B=8 x K=8: live tokens/s, after", wide["after"]["tokens"] / wide["after"]["seconds"],
         f"the same collection, {rows_per_step(wide['after']):.1f} rows per step"),
        ("training rollouts/min, after", per_min["after"], f"{iterations} M-GRPO iterations of B={b} x K={k} after 1 warm-up"),
        ("training rollouts/min, before", per_min["before"], "alternated with the after side, same seeds"),
        ("training speed-up", per_min["after"] / per_min["before"], "target >= 3"),
        ("collection share of an iteration, after", training["after"]["time/collect"] / training["after"]["time/iteration"], ""),
        ("update floor, rollouts/min", floor, "the after side's iterations with a collection of no time"),
    ]
    report("live_decode", rows, {"live": {label: [{"seconds": o["seconds"], "tokens": o["tokens"], "shapes": o["shapes"]}
                                                  for o in outs] for label, outs in live.items()},
                                 "schedules": sim, "training": training, "B": b, "K": k})


if __name__ == "__main__":
    main()
