"""The demo's training iteration, before and after the speed work, in rollouts per second.

    .venv/bin/python benchmarks/demo_iteration.py [--quick]

One M-GRPO iteration of ``configs/demo.yaml`` (wiki-hops tiny profile, 300 entities, the committed
warm-start models, the demo's limits, B questions x K rollouts, Chromium for the JavaScript pages
when it is installed) run twice in one process with the same seeds, so both sides collect from the
same policies and tasks:

- **before**: transformers' ``generate`` (``generation.decode=generate``) and a browser that renders
  every JavaScript page at every visit (``scenario_kwargs.render_cache=false``);
- **after**: the lean decode loop (:mod:`mgrpo_algo.policies.decode`) and the render cache
  (:mod:`mgrpo_tools.render_cache`).

Each side runs its iterations in its own world (the first also pays Chromium's launch and the
first render of each page: it is counted, as in a real run), the two sides' iterations interleaved
so that a busy machine slows both alike; the figures are ratios of the sums. Also reported: the share of collection time spent in env steps.
Writes benchmarks/results/demo_iteration.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def trainer_for(tmp: Path, label: str, b: int, k: int, iterations: int, fast: bool):
    """A demo trainer with one setting (both sides: same config, seeds and start models)."""
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.training.trainer import Trainer

    overrides = [
        "mode=mgrpo", f"out_dir={tmp / label}", f"models_dir={tmp / 'models'}",
        f"scenario_kwargs={{num_entities: 300, seed: 0, profile: tiny, data_dir: {tmp / 'data'}, "
        f"render_cache: {'true' if fast else 'false'}}}",
        f"questions_per_iteration={b}", f"group_size={k}", f"stages=[{{split: stage2/train, iterations: {iterations}}}]",
        "torch_threads=1", "checkpoint=false",
    ]
    for role in ("main", "sub"):
        overrides += [f"{role}.generation.decode={'lean' if fast else 'generate'}"]
    return Trainer(load_config(ROOT / "configs" / "demo.yaml", overrides))


KEYS = ("time/iteration", "time/collect", "time/generation", "time/env_steps", "time/update")


def run(tmp: Path, b: int, k: int, iterations: int) -> dict[str, dict[str, float]]:
    """Both sides, their iterations interleaved (before, after, before, ...) so that a busy machine
    slows both alike; summed timings and the rollout count per side."""
    sides = {"before": trainer_for(tmp, "before", b, k, iterations, fast=False),
             "after": trainer_for(tmp, "after", b, k, iterations, fast=True)}
    totals: dict[str, dict[str, float]] = {label: dict.fromkeys(KEYS, 0.0) for label in sides}
    worlds = {label: trainer.scenario.open() for label, trainer in sides.items()}
    try:
        tasks = list(sides["before"].scenario.tasks("stage2/train"))
        for _ in range(iterations):  # train_iteration advances each trainer's iteration (seeds, tasks)
            for label, trainer in sides.items():
                m = trainer.train_iteration(worlds[label], tasks, "stage2/train")
                for key in KEYS:
                    totals[label][key] += float(m[key])
        cache = getattr(worlds["after"], "render_cache", None)
        totals["after"]["renders_saved"] = float(cache.stats.hits + cache.stats.joined) if cache else 0.0
        totals["after"]["renders"] = float(cache.stats.misses) if cache else 0.0
    finally:
        for world in worlds.values():
            world.close()
    for label in sides:
        totals[label]["rollouts"] = float(b * k * iterations)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="B=1, K=2, one iteration a side")
    args = parser.parse_args()
    b, k, iterations = (1, 2, 1) if args.quick else (4, 4, 2)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sides = run(tmp, b, k, iterations)
    before, after = sides["before"], sides["after"]
    rows = []
    for label, t in (("before", before), ("after", after)):
        rows.append((f"rollouts/s {label}", t["rollouts"] / t["time/iteration"],
                     f"B={b} x K={k}, {iterations} iteration(s); s: iteration {t['time/iteration']:.1f}, "
                     f"generation {t['time/generation']:.1f}, env steps {t['time/env_steps']:.1f}, update {t['time/update']:.1f}"))
        rows.append((f"env steps / collection {label}", t["time/env_steps"] / t["time/collect"], "share of collection time"))
    rows.append(("iteration speed-up", before["time/iteration"] / after["time/iteration"], "before / after (target >= 2.5)"))
    rows.append(("generation speed-up", before["time/generation"] / after["time/generation"], "generate / lean decode"))
    rows.append(("env steps speed-up", before["time/env_steps"] / max(after["time/env_steps"], 1e-9),
                 f"no render cache / render cache ({after['renders']:.0f} renders, {after['renders_saved']:.0f} saved)"))
    report("demo_iteration", rows, {"before": before, "after": after, "B": b, "K": k, "iterations": iterations})


if __name__ == "__main__":
    main()
