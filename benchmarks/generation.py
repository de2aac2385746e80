"""Generation on the demo's real multi-turn batches: transformers' ``generate`` against the lean paths.

    .venv/bin/python benchmarks/generation.py [--quick] [--questions B] [--group-size K] [--repeats R]

One collection of ``configs/demo.yaml`` (wiki-hops tiny profile, 300 entities, the committed
warm-start models and limits, B questions x K rollouts, Chromium for the JavaScript pages) is run
once with the default policies, and every policy call is recorded: the role and the requests (chat,
history of token ids). The recorded calls are then replayed, in order, through fresh policies of
each decode path over the same model objects and seeds:

- ``generate``: transformers' ``generate`` with the KV caches kept across turns (the reference);
- ``forward``: the lean sampling loop (:mod:`mgrpo_algo.policies.decode`) over the model's forward;
- ``lean``: the same loop with one-token steps through :class:`mgrpo_algo.policies.lean_forward.LeanStep`;
- ``lean+inverse_cdf``: ``lean`` drawing each token from one uniform per row
  (``generation.sampler=inverse_cdf``): the same distribution, other ids.

The first three must return the recorded completion ids and log-probs (they sample the same ids
under a seed); the benchmark fails otherwise. The fourth samples its own ids, so the recorded
histories it is asked to continue are not its own and its KV caches miss (every turn re-prefills):
its figure is a lower bound on its speed in a real rollout. The paths are replayed in rotating order ``R`` times, so a busy
machine slows each alike; the figures are sampled tokens per second of policy time (medians) and
their ratios. The replay needs no env: the requests carry their histories, so the batches are
exactly the rollout's (ragged prompts, agents joining and leaving, KV reuse across turns).
Writes benchmarks/results/generation.json.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODES = ("generate", "forward", "lean", "lean+inverse_cdf")


class Recording:
    """A policy wrapper that keeps every call's requests and the completions it answered."""

    def __init__(self, policy: Any, calls: list[tuple[str, list[Any], list[tuple[list[int], list[float]]]]]) -> None:
        self.policy, self.calls = policy, calls

    def __call__(self, requests):
        # The env goes on appending to a request's chat and history: keep them as they were asked.
        kept = [copy.deepcopy(r) for r in requests]
        responses = self.policy(requests)
        self.calls.append((self.policy.role, kept,
                           [(list(r.extra["completion_ids"]), list(r.extra["logprobs"])) for r in responses]))
        return responses

    def release(self, episode: int, agent: str) -> None:
        self.policy.release(episode, agent)


def record(tmp: Path, b: int, k: int) -> tuple[Any, list[tuple[str, list[Any], list[tuple[list[int], list[float]]]]], dict[str, int]]:
    """One demo collection with recorded policy calls: ``(trainer, calls, seeds by role)``."""
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.core.seeding import policy_seed
    from mgrpo_algo.training.trainer import Trainer
    from mgrpo_env.rollout import collect

    overrides = [
        "mode=mgrpo", f"out_dir={tmp / 'run'}", f"models_dir={tmp / 'models'}",
        f"scenario_kwargs={{num_entities: 300, seed: 0, profile: tiny, data_dir: {tmp / 'data'}}}",
        f"questions_per_iteration={b}", f"group_size={k}", "torch_threads=1", "checkpoint=false",
    ]
    trainer = Trainer(load_config(ROOT / "configs" / "demo.yaml", overrides))
    seeds = {role: policy_seed(0, role, 0) for role in ("main", "sub")}
    for role, seed in seeds.items():
        trainer.workers[role].policy.reseed(seed)
    calls: list[tuple[str, list[Any], list[tuple[list[int], list[float]]]]] = []
    policies = {role: Recording(trainer.workers[role].policy, calls) for role in ("main", "sub")}
    tasks = list(trainer.scenario.tasks("stage2/train"))[:b]
    cfg = trainer.config
    with trainer.scenario.open() as world:
        collect(trainer.scenario, tasks, k, policies, world=world, seed=0, max_workers=cfg.max_workers,
                env_kwargs={"limits": cfg.limits, "rewards": trainer.reward_config})
    return trainer, calls, seeds


def replay(trainer: Any, calls: list[tuple[str, list[Any], list[tuple[list[int], list[float]]]]], seeds: dict[str, int],
           mode: str) -> tuple[float, int]:
    """Seconds of policy time and tokens sampled when ``mode``'s fresh policies answer ``calls``."""
    from mgrpo_algo.policies.hf_policy import TransformersPolicy

    policies = {}
    decode, sampler = (mode.split("+") + ["multinomial"])[:2]
    for role in ("main", "sub"):
        source, g = trainer.workers[role].policy, getattr(trainer.config, role).generation
        policies[role] = TransformersPolicy(
            source.model, source.tokenizer, role=role, max_new_tokens=g.max_new_tokens, temperature=g.temperature,
            top_p=g.top_p, max_prompt_tokens=g.max_prompt_tokens, seed=seeds[role], kv_cache_mb=g.kv_cache_mb,
            decode=decode, sampler=sampler)
    seconds, tokens = 0.0, 0
    for role, requests, expected in calls:
        t0 = time.perf_counter()
        responses = policies[role](requests)
        seconds += time.perf_counter() - t0
        for response, (ids, logprobs) in zip(responses, expected, strict=True):
            if sampler != "multinomial":  # its own draws: count them, nothing to compare
                tokens += len(response.extra["completion_ids"])
                continue
            if list(response.extra["completion_ids"]) != ids or max(
                    (abs(a - b) for a, b in zip(response.extra["logprobs"], logprobs, strict=True)), default=0.0) > 1e-5:
                raise SystemExit(f"decode={mode} sampled other ids or log-probs than the recorded rollout ({role} call)")
            tokens += len(ids)
    return seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--questions", type=int, default=None, help="B (default 4, the demo's; quick: 2)")
    parser.add_argument("--group-size", type=int, default=None, help="K (default 4, the demo's; quick: 2)")
    parser.add_argument("--repeats", type=int, default=None, help="replays per path (default 3; quick: 1)")
    args = parser.parse_args()
    b = args.questions or (2 if args.quick else 4)
    k = args.group_size or (2 if args.quick else 4)
    repeats = args.repeats or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory() as tmp:
        trainer, calls, seeds = record(Path(tmp), b, k)
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        counts: dict[str, list[int]] = {mode: [] for mode in MODES}
        for r in range(repeats):
            for mode in MODES[r % len(MODES):] + MODES[: r % len(MODES)]:  # rotating order
                seconds, sampled = replay(trainer, calls, seeds, mode)
                times[mode].append(seconds)
                counts[mode].append(sampled)
    tokens = counts["lean"][0]
    rate = {mode: statistics.median(n / t for n, t in zip(counts[mode], times[mode], strict=True)) for mode in MODES}
    batches = [len(requests) for _, requests, _ in calls]
    rows = [
        ("rollouts", b * k, f"B={b} x K={k}, one collection of configs/demo.yaml"),
        ("policy calls", len(calls), f"batch sizes {min(batches)}-{max(batches)}, median {statistics.median(batches):.0f}"),
        ("sampled tokens", tokens, "identical ids and log-probs on the first three paths (checked)"),
    ]
    for mode in MODES:
        rows.append((f"{mode} tokens/s", rate[mode], f"median of {repeats}: {statistics.median(times[mode]):.2f} s "
                     f"policy time, {statistics.median(counts[mode]):.0f} tokens"))
    rows += [
        ("speed-up lean / generate", rate["lean"] / rate["generate"], "target >= 3 (tokens/s ratio)"),
        ("speed-up forward / generate", rate["forward"] / rate["generate"], "the loop alone"),
        ("speed-up lean / forward", rate["lean"] / rate["forward"], "LeanStep alone"),
        ("speed-up lean+inverse_cdf / generate", rate["lean+inverse_cdf"] / rate["generate"],
         "lower bound: its KV caches miss in a replay"),
    ]
    report("generation", rows, {"seconds": times, "tokens": counts, "B": b, "K": k})


if __name__ == "__main__":
    main()
