"""Generation on the demo's real multi-turn batches: transformers' ``generate`` against the lean paths.

    .venv/bin/python benchmarks/generation.py [--quick] [--questions B] [--group-size K] [--repeats R]

Two measurements on ``configs/demo.yaml`` (wiki-hops tiny profile, 300 entities, the committed
warm-start models and limits, B questions x K rollouts, Chromium for the JavaScript pages):

**Live** (the headline): real collections, one per path and repeat, interleaved (generate, lean,
fast, generate, ...) so that a busy machine slows each alike; repeat ``r`` collects the ``r``-th
batch of B training questions with the same seeds on every path. Figures: sampled tokens per second
of policy time (prefill, steps, sampling, KV reuse, prompt building: everything a policy call costs),
pooled over the repeats, and their ratios to ``generate``.

- ``generate``: transformers' ``generate`` with the KV caches kept across turns (the reference, and
  the demo's path before the speed work);
- ``lean``: the lean sampling loop (:mod:`mgrpo_algo.policies.decode`) with one-token steps through
  :class:`~mgrpo_algo.policies.lean_forward.LeanStep` (bitwise the model's logits) and
  ``torch.multinomial``: it collects exactly generate's rollouts (checked);
- ``fast+inverse_cdf`` (the default): one-token steps through
  :class:`~mgrpo_algo.policies.fast_step.FastStep` (the model's logits up to rounding) and one uniform
  per row for the draw. The same distribution, other ids: its rollouts are its own, so its batches
  (lengths, who delegates) differ from the others' and only tokens/s compare.

**Replay** (exactness): one collection is recorded with the multinomial sampler and every policy
call (role, requests with their token histories) is replayed in order through fresh policies of
each path over the same models and seeds. ``generate``, ``forward`` and ``lean`` must return the
recorded ids and log-probs (the benchmark fails otherwise); ``fast`` (FastStep with multinomial)
must return log-probs within 5e-5 of the recorded ones wherever it sampled the same ids, and the
number of calls where rounding flipped a draw is reported. Writes benchmarks/results/generation.json.
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
MODES = ("generate", "forward", "lean", "fast")
LIVE = ("generate", "lean", "fast+inverse_cdf")


def _path(mode: str) -> tuple[str, str]:
    """``(decode, sampler)`` of a path name such as ``"fast+inverse_cdf"`` (the sampler defaults to multinomial)."""
    decode, _, sampler = mode.partition("+")
    return decode, sampler or "multinomial"


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
        # the recording's draws are generate's (multinomial), so the exact paths can be checked on it
        "main.generation.sampler=multinomial", "sub.generation.sampler=multinomial",
        "main.generation.decode=lean", "sub.generation.decode=lean",
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
           mode: str) -> tuple[float, int, int]:
    """``(seconds of policy time, tokens sampled, responses whose ids parted from the recording)``
    when ``mode``'s fresh policies answer ``calls``."""
    from mgrpo_algo.policies.hf_policy import TransformersPolicy

    policies = {}
    decode, sampler = _path(mode)
    for role in ("main", "sub"):
        source, g = trainer.workers[role].policy, getattr(trainer.config, role).generation
        policies[role] = TransformersPolicy(
            source.model, source.tokenizer, role=role, max_new_tokens=g.max_new_tokens, temperature=g.temperature,
            top_p=g.top_p, max_prompt_tokens=g.max_prompt_tokens, seed=seeds[role], kv_cache_mb=g.kv_cache_mb,
            decode=decode, sampler=sampler)
    seconds, tokens, flipped = 0.0, 0, 0
    tolerance = 5e-5 if decode == "fast" else 1e-5  # FastStep: the model's logits up to rounding
    for role, requests, expected in calls:
        t0 = time.perf_counter()
        responses = policies[role](requests)
        seconds += time.perf_counter() - t0
        for response, (ids, logprobs) in zip(responses, expected, strict=True):
            got = list(response.extra["completion_ids"])
            tokens += len(got)
            if got != ids and decode == "fast":  # a draw flipped by rounding: compare up to it
                flipped += 1
                same = next((i for i, (a, b) in enumerate(zip(got, ids, strict=False)) if a != b), min(len(got), len(ids)))
                got, ids, logprobs = got[:same], ids[:same], logprobs[:same]
            if got != ids or max((abs(a - b) for a, b in zip(response.extra["logprobs"], logprobs, strict=False)),
                                 default=0.0) > tolerance:
                raise SystemExit(f"decode={mode} sampled other ids or log-probs than the recorded rollout ({role} call)")
    return seconds, tokens, flipped


class Timed:
    """A policy wrapper that adds up its calls' time and the tokens they sampled."""

    def __init__(self, policy: Any) -> None:
        self.policy, self.role, self.seconds, self.tokens = policy, policy.role, 0.0, 0

    def __call__(self, requests):
        t0 = time.perf_counter()
        responses = self.policy(requests)
        self.seconds += time.perf_counter() - t0
        self.tokens += sum(len(r.extra["completion_ids"]) for r in responses)
        return responses

    def release(self, episode: int, agent: str) -> None:
        self.policy.release(episode, agent)


def live(trainer: Any, b: int, k: int, repeats: int) -> tuple[dict[str, list[float]], dict[str, list[int]], list[bool]]:
    """Real collections per path (interleaved): seconds and tokens per repeat, and per repeat whether
    ``lean`` collected ``generate``'s rollouts (the same answers, rewards, delegations and endings)."""
    from mgrpo_algo.core.seeding import policy_seed
    from mgrpo_env.rollout import collect

    cfg = trainer.config
    tasks = list(trainer.scenario.tasks("stage2/train"))
    seconds: dict[str, list[float]] = {mode: [] for mode in LIVE}
    tokens: dict[str, list[int]] = {mode: [] for mode in LIVE}
    same: list[bool] = []
    with trainer.scenario.open() as world:
        for r in range(repeats + 1):  # repeat 0 warms every path up (first page visits, allocations): not counted
            batch = tasks[(r * b) % len(tasks):][:b]
            completions = {}
            for mode in LIVE:
                decode, sampler = _path(mode)
                policies = {}
                for role in ("main", "sub"):
                    policy = trainer.workers[role].policy
                    policy.decode, policy.sampler = decode, sampler
                    policy.reseed(policy_seed(0, role, r))
                    policies[role] = Timed(policy)
                records = collect(trainer.scenario, batch, k, policies, world=world, seed=r, max_workers=cfg.max_workers,
                                  env_kwargs={"limits": cfg.limits, "rewards": trainer.reward_config})
                completions[mode] = [(rec.final_answer, rec.rewards, len(rec.subs), rec.end_reason) for rec in records]
                if r:
                    seconds[mode].append(sum(p.seconds for p in policies.values()))
                    tokens[mode].append(sum(p.tokens for p in policies.values()))
            if r:
                same.append(completions["lean"] == completions["generate"])
    return seconds, tokens, same


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--questions", type=int, default=None, help="B (default 4, the demo's; quick: 2)")
    parser.add_argument("--group-size", type=int, default=None, help="K (default 4, the demo's; quick: 2)")
    parser.add_argument("--repeats", type=int, default=None, help="collections per path, replays per path (default 3; quick: 1)")
    args = parser.parse_args()
    b = args.questions or (2 if args.quick else 4)
    k = args.group_size or (2 if args.quick else 4)
    repeats = args.repeats or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory() as tmp:
        trainer, calls, seeds = record(Path(tmp), b, k)
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        counts: dict[str, list[int]] = {mode: [] for mode in MODES}
        flips: dict[str, list[int]] = {mode: [] for mode in MODES}
        for r in range(repeats):
            for mode in MODES[r % len(MODES):] + MODES[: r % len(MODES)]:  # rotating order
                seconds, sampled, flipped = replay(trainer, calls, seeds, mode)
                times[mode].append(seconds)
                counts[mode].append(sampled)
                flips[mode].append(flipped)
        live_seconds, live_tokens, same = live(trainer, b, k, repeats)
    rate = {mode: statistics.median(n / t for n, t in zip(counts[mode], times[mode], strict=True)) for mode in MODES}
    live_rate = {mode: sum(live_tokens[mode]) / sum(live_seconds[mode]) for mode in LIVE}
    batches = [len(requests) for _, requests, _ in calls]
    rows = [("rollouts", b * k, f"B={b} x K={k} per collection of configs/demo.yaml")]
    for mode in LIVE:
        rows.append((f"live {mode} tokens/s", live_rate[mode], f"{sum(live_tokens[mode])} tokens in "
                     f"{sum(live_seconds[mode]):.2f} s policy time over {repeats} collections"))
    rows += [
        ("live speed-up fast+inverse_cdf / generate", live_rate["fast+inverse_cdf"] / live_rate["generate"],
         "target >= 3 (tokens/s ratio; the default path against today's generate)"),
        ("live speed-up lean / generate", live_rate["lean"] / live_rate["generate"],
         f"identical rollouts in {sum(same)}/{len(same)} collections"),
        ("replay policy calls", len(calls), f"batch sizes {min(batches)}-{max(batches)}, median {statistics.median(batches):.0f}"),
        ("replay sampled tokens", counts["lean"][0], "generate, forward, lean: identical ids and log-probs (checked)"),
    ]
    for mode in MODES:
        rows.append((f"replay {mode} tokens/s", rate[mode], f"median of {repeats}: {statistics.median(times[mode]):.2f} s"))
    rows += [
        ("replay speed-up lean / generate", rate["lean"] / rate["generate"], "bitwise LeanStep, multinomial"),
        ("replay speed-up fast / generate", rate["fast"] / rate["generate"],
         f"FastStep, multinomial: log-probs within 5e-5, {max(flips['fast'])} of {sum(batches)} responses flipped a draw"),
        ("replay speed-up fast / lean", rate["fast"] / rate["lean"], "FastStep over LeanStep"),
    ]
    report("generation", rows, {"replay_seconds": times, "replay_tokens": counts, "replay_flipped": flips,
                                "live_seconds": live_seconds, "live_tokens": live_tokens, "live_identical": same,
                                "B": b, "K": k})


if __name__ == "__main__":
    main()
