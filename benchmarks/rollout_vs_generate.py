"""Rollout collection against raw ``model.generate`` doing the same generation work.

    .venv/bin/python benchmarks/rollout_vs_generate.py [--quick]

``collect`` over the real env (wiki-hops, 300-entity world built in a temporary folder, cached
tools) with a :class:`~mgrpo_algo.policies.hf_policy.TransformersPolicy` for both roles (the tiny random
Qwen2 of ``vs_trl.py``: hidden 128, 4 layers, vocab 1024, one torch thread). Every ``generate``
the policy makes is recorded (batch size, padded prompt width, steps run); the raw baseline replays
exactly those shapes with ``model.generate`` on random prompt ids (sampling, no stop token, no
logits processor, no chat template, no env). Both are credited with the same tokens (those the
rollout sampled and kept), so the ratio is raw time / rollout time. Also the share of rollout wall
time spent outside ``model.generate``: env steps, tools (cached), prompts, decoding, collection.
A random model writes no valid tool call, so episodes are main-agent turns ending in format
failures until the turn limit: sub-agents are rarely spawned, and tools rarely run.
Writes benchmarks/results/rollout_vs_generate.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import report  # noqa: E402
from vs_trl import tiny_model_dir  # noqa: E402

from mgrpo_algo.policies.hf_policy import TransformersPolicy  # noqa: E402
from mgrpo_env.rollout import CollectStats, collect  # noqa: E402
from mgrpo_scenarios.wiki_hops import WikiHops  # noqa: E402


def _recording(model: torch.nn.Module, calls: list[tuple[int, int, int, float]]):
    """Wrap ``model.generate`` (on the instance) to record (batch, prompt width, steps, seconds);
    returns the unwrapped ``generate``."""
    original = model.generate

    def generate(*args, **kwargs):
        t0 = time.perf_counter()
        out = original(*args, **kwargs)
        ids = kwargs["input_ids"]
        calls.append((ids.shape[0], ids.shape[1], out.sequences.shape[1] - ids.shape[1], time.perf_counter() - t0))
        return out

    model.generate = generate
    return original


def _replay(model: torch.nn.Module, generate, calls: list[tuple[int, int, int, float]], vocab: int) -> float:
    """Seconds of raw ``generate`` over the recorded shapes (sampling, exactly ``steps`` new tokens)."""
    from transformers import GenerationConfig

    saved, model.generation_config = model.generation_config, GenerationConfig()
    g = torch.Generator().manual_seed(0)
    total = 0.0
    try:
        with torch.no_grad():
            for batch, width, steps, _ in calls:
                ids = torch.randint(0, vocab, (batch, width), generator=g)
                config = GenerationConfig(do_sample=True, max_new_tokens=steps, temperature=1.0, top_p=1.0, top_k=0,
                                          eos_token_id=None, pad_token_id=0, use_cache=True)
                t0 = time.perf_counter()
                generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
                total += time.perf_counter() - t0
    finally:
        model.generation_config = saved
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="2 tasks x K=2, 32 new tokens, 3 main turns, 1 repeat")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    b, k, new, turns, repeats = (2, 2, 32, 3, 1) if args.quick else (4, 4, 64, 6, 3)
    rows, ratios, shares, figures = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_model_dir(Path(tmp) / "model")
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        calls: list[tuple[int, int, int, float]] = []
        raw_generate = _recording(model, calls)
        # decode="generate": this benchmark replays the rollout's own generate calls (the lean loop makes
        # none; benchmarks/demo_iteration.py compares the two paths)
        policies = {role: TransformersPolicy(model, tokenizer, role=role, max_new_tokens=new, seed=0, decode="generate")
                    for role in ("main", "sub")}
        scenario = WikiHops(seed=0, num_entities=300, data_dir=f"{tmp}/data", cache_path=Path(tmp) / "cache.sqlite")
        tasks = list(scenario.tasks("stage2/test"))[:b]
        limits = {"max_main_turns": turns, "max_sub_turns": turns}
        with scenario.open() as world:
            collect(scenario, tasks[:1], 1, policies, world=world, env_kwargs=limits)  # warm-up (and tool cache)
            for _ in range(repeats):
                calls.clear()
                stats = CollectStats()
                records = collect(scenario, tasks, k, policies, world=world, stats=stats, env_kwargs=limits, max_workers=1)
                sampled = sum(len(t.extra.get("completion_ids", [])) for r in records
                              for traj in (r.main, *r.subs) for t in traj.turns)
                in_model = sum(c[3] for c in calls)
                raw = _replay(model, raw_generate, list(calls), model.config.vocab_size)
                ratios.append(raw / stats.wall_s)
                shares.append(1 - in_model / stats.wall_s)
                figures.append((stats, sampled, raw, len(calls), sum(c[0] for c in calls)))
    stats, sampled, raw, ncalls, nseq = figures[len(figures) // 2]
    rows.append(("episodes", stats.episodes, f"{b} tasks x K={k}, {new} new tokens/turn, <= {turns} main turns"))
    rows.append(("generate calls / sequences", f"{ncalls} / {nseq}", "recorded from the rollout"))
    rows.append(("sampled tokens kept", sampled, "both sides credited with these"))
    rows.append(("rollout tokens/s", sampled / stats.wall_s, f"collect wall {stats.wall_s:.2f} s"))
    rows.append(("raw generate tokens/s", sampled / raw, f"replay wall {raw:.2f} s"))
    rows.append(("ratio rollout/raw tokens/s", statistics.median(ratios), f"median of {repeats}; target >= 0.8"))
    rows.append(("share of rollout time outside the model", statistics.median(shares),
                 "env + tools (cached) + prompts + decode; target <= 0.05"))
    rows.append(("share of rollout time in tools", stats.tool_s / stats.wall_s, "cached"))
    report("rollout_vs_generate", rows, {"ratios": ratios, "outside_shares": shares})


if __name__ == "__main__":
    main()
