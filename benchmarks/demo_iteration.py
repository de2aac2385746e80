"""The demo's training iteration, before and after the speed work, in rollouts per second.

    .venv/bin/python benchmarks/demo_iteration.py [--quick] [--iterations N] [--warmup W]

M-GRPO iterations of ``configs/demo.yaml`` (wiki-hops tiny profile, 300 entities, the committed
warm-start models, the demo's limits, B = 4 questions x K = 4 rollouts, Chromium for the JavaScript
pages when it is installed) run on two sides in one process with the same seeds:

- **before**: transformers' ``generate`` (``generation.decode=generate``), a browser that renders
  every JavaScript page at every visit and a fetcher that fetches every page at every visit
  (``scenario_kwargs.render_cache=false``), and every token of every sample through the learner
  (``learner.share_prefix=false``);
- **after**: the demo's settings: the lean decode loop with one-token steps through FastStep and
  one uniform per row for each draw (:mod:`mgrpo_algo.policies.decode`,
  :mod:`mgrpo_algo.policies.fast_step`, ``generation.sampler=inverse_cdf``), the render cache
  kept in the world folder (:mod:`mgrpo_tools.render_cache`) and every script page prerendered when
  the world opens (``scenario_kwargs.prerender``; its one-time cost is reported, not counted), and
  shared prefixes run once in the learner (``learner.share_prefix``).

The after side draws its own ids (the same distribution, another sampler), so the two sides collect
different rollouts of the same policy: the figure is rollouts per second, and both sides' mean
rewards are reported beside it. ``--exact`` makes the after side sample as ``generate`` does
(LeanStep, multinomial): the two sides then collect identical rollouts, and the benchmark checks each
iteration's rewards equal (their updates agree up to float rounding: prefix sharing sums in another
order, which could flip a later sample) and stops if they part. Each side runs in its own open world; their iterations are interleaved so that a busy
machine slows both alike, and the figures are ratios of sums. ``W`` warm-up iterations per side are
not counted (the steady state of a run: by its training iterations the start evaluation has visited
most pages); the renders the after side still makes in the measured iterations are reported. Also
reported: the share of collection time spent in env steps. Writes benchmarks/results/demo_iteration.json
(``--exact``: demo_iteration_exact.json).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def trainer_for(tmp: Path, label: str, b: int, k: int, iterations: int, fast: bool, exact: bool = False):
    """A demo trainer with one setting (both sides: same config, seeds and start models)."""
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.training.trainer import Trainer

    overrides = [
        "mode=mgrpo", f"out_dir={tmp / label}", f"models_dir={tmp / 'models'}",
        f"scenario_kwargs={{num_entities: 300, seed: 0, profile: tiny, data_dir: {tmp / 'data'}, "
        f"render_cache: {'true' if fast else 'false'}, prerender: {'true' if fast else 'false'}}}",
        f"questions_per_iteration={b}", f"group_size={k}", f"stages=[{{split: stage2/train, iterations: {iterations}}}]",
        "torch_threads=1", "checkpoint=false",
    ]
    for role in ("main", "sub"):
        if not fast:
            overrides.append(f"{role}.generation.decode=generate")
        elif exact:  # generate's draws: identical rollouts on both sides
            overrides += [f"{role}.generation.decode=lean", f"{role}.generation.sampler=multinomial"]
        overrides.append(f"{role}.learner.share_prefix={'true' if fast else 'false'}")
    return Trainer(load_config(ROOT / "configs" / "demo.yaml", overrides))


KEYS = ("time/iteration", "time/collect", "time/generation", "time/env_steps", "time/update")


def run(tmp: Path, b: int, k: int, iterations: int, warmup: int, exact: bool = False) -> dict[str, dict[str, float]]:
    """Both sides, their iterations interleaved (before, after, before, ...) so that a busy machine
    slows both alike; summed timings over the measured iterations (after ``warmup`` uncounted ones),
    the rollout count and the summed mean rewards per side. With ``exact`` both sides sample the same
    ids and read the same pages, so they train on identical rollouts: the per-iteration rewards are
    checked equal."""
    sides = {"before": trainer_for(tmp, "before", b, k, warmup + iterations, fast=False),
             "after": trainer_for(tmp, "after", b, k, warmup + iterations, fast=True, exact=exact)}
    totals: dict[str, dict[str, float]] = {label: dict.fromkeys(KEYS, 0.0) for label in sides}
    worlds, opened = {}, {}
    for label, trainer in sides.items():  # the after side's open prerenders its script pages (reported)
        t0 = time.perf_counter()
        worlds[label] = trainer.scenario.open()
        opened[label] = time.perf_counter() - t0
    try:
        tasks = list(sides["before"].scenario.tasks("stage2/train"))
        for it in range(warmup + iterations):  # train_iteration advances each trainer's iteration (seeds, tasks)
            cache = getattr(worlds["after"], "render_cache", None)
            renders_before = cache.stats.misses if cache else 0
            rewards = {}
            for label, trainer in sides.items():
                m = trainer.train_iteration(worlds[label], tasks, "stage2/train")
                rewards[label] = (m.get("main/reward_mean"), m.get("sub/reward_mean"))
                if it >= warmup:
                    for key in KEYS:
                        totals[label][key] += float(m[key])
                    for key, value in zip(("main reward", "sub reward"), rewards[label], strict=True):
                        totals[label][key] = totals[label].get(key, 0.0) + float(value or 0.0) / iterations
            if exact and rewards["before"] != rewards["after"]:
                raise SystemExit(f"iteration {it}: the two sides trained on different rollouts {rewards}")
            if it >= warmup and cache is not None:
                totals["after"]["renders"] = totals["after"].get("renders", 0.0) + cache.stats.misses - renders_before
        totals["after"]["renders_saved"] = float(cache.stats.hits + cache.stats.joined) if cache else 0.0
        totals["after"].setdefault("renders", 0.0)
    finally:
        for world in worlds.values():
            world.close()
    for label in sides:
        totals[label]["rollouts"] = float(b * k * iterations)
        totals[label]["open_s"] = opened[label]
    return totals


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="B=1, K=2, one iteration a side, no warm-up")
    parser.add_argument("--iterations", type=int, default=3, help="measured iterations per side")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted iterations per side first")
    parser.add_argument("--exact", action="store_true",
                        help="the after side samples generate's ids (LeanStep, multinomial): identical rollouts, checked")
    args = parser.parse_args()
    b, k, iterations, warmup = (1, 2, 1, 0) if args.quick else (4, 4, args.iterations, args.warmup)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sides = run(tmp, b, k, iterations, warmup, exact=args.exact)
    before, after = sides["before"], sides["after"]
    rows = []
    for label, t in (("before", before), ("after", after)):
        rows.append((f"rollouts/s {label}", t["rollouts"] / t["time/iteration"],
                     f"B={b} x K={k}, {iterations} iteration(s) after {warmup} warm-up; s: iteration {t['time/iteration']:.1f}, "
                     f"generation {t['time/generation']:.1f}, env steps {t['time/env_steps']:.1f}, update {t['time/update']:.1f}"))
        rows.append((f"env steps / collection {label}", t["time/env_steps"] / t["time/collect"], "share of collection time"))
        rows.append((f"mean rewards {label}", t.get("main reward", 0.0), f"main (sub {t.get('sub reward', 0.0):.3f}), "
                     "over the measured iterations" + (": identical rollouts (checked)" if args.exact else
                                                       ": the same policy, other draws")))
    rows.append(("iteration speed-up", before["time/iteration"] / after["time/iteration"], "before / after (target >= 2.5)"))
    rows.append(("generation speed-up", before["time/generation"] / after["time/generation"],
                 "generate / " + ("lean, multinomial" if args.exact else "fast, inverse_cdf")))
    rows.append(("env steps speed-up", before["time/env_steps"] / max(after["time/env_steps"], 1e-9),
                 f"no render cache / render cache ({after['renders']:.0f} renders in the measured iterations, "
                 f"{after['renders_saved']:.0f} saved in all)"))
    rows.append(("world open, after side", after["open_s"], "s, once per world and browser: prerenders every "
                 f"script page (the before side's open: {before['open_s']:.1f} s)"))
    rows.append(("update speed-up", before["time/update"] / after["time/update"], "learner.share_prefix off / on"))
    report("demo_iteration_exact" if args.exact else "demo_iteration", rows, {"before": before, "after": after, "B": b, "K": k, "iterations": iterations,
                                    "warmup": warmup, "exact": args.exact})


if __name__ == "__main__":
    main()
