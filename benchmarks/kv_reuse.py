"""KV-cache reuse across turns: multi-turn rollout tokens/s, and training iterations before and after.

    .venv/bin/python benchmarks/kv_reuse.py [--quick]

1. Multi-turn rollouts: B agents run 6-turn chats through :class:`~mgrpo_algo.policies.hf_policy.TransformersPolicy`
   (the tiny random Qwen2 of ``vs_trl.py``: hidden 128, 4 layers, vocab 1024, one torch thread). The
   first prompt is ~1 k tokens and every turn appends the completion and a ~180-token tool response,
   so prompts grow to ~2 k tokens. The same chats run with KV reuse (``kv_cache_mb=1024``) and with a
   full re-prefill every turn (``kv_cache_mb=0``), alternating in one process; both sample the same
   ids (checked), so tokens/s are directly comparable and the figure is their ratio.
2. Iterations: one training iteration of M-GRPO and one of the single agent (``Trainer.train_iteration``
   on wiki-hops, 300 entities, random tiny models, the demo's limits 5 / 3 / 3 so the single agent
   has 15 turns) "before" (re-prefill, no zero-advantage skipping) and "after" (reuse + skipping), at
   the same B and K and seeds (so both sides do the same rollouts).
Writes benchmarks/results/kv_reuse.json (and a bar chart kv_reuse.png when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, report  # noqa: E402
from vs_trl import tiny_model_dir  # noqa: E402

from mgrpo_algo.policies.hf_policy import TransformersPolicy  # noqa: E402
from mgrpo_env.rollout import PolicyRequest  # noqa: E402

WORDS = ["the", "river", "city", "of", "an", "old", "painter", "was", "founded", "near", "a", "bridge", "by", "two", "brothers", "who", "sold", "maps", "in", "year", "population", "museum", "station", "capital"]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def multi_turn(policy: TransformersPolicy, agents: int, turns: int, first_words: int, obs_words: int) -> tuple[float, int, list, list[int]]:
    """Run the chats; returns (seconds in the policy, sampled tokens, samples, prompt lengths per turn)."""
    rng = random.Random(0)
    messages = {a: [{"role": "system", "content": "You are a research agent. " + _text(rng, 40)},
                    {"role": "user", "content": _text(rng, first_words)}] for a in range(agents)}
    history: dict[int, list[dict]] = {a: [] for a in range(agents)}
    seconds, tokens, samples, lengths = 0.0, 0, [], []
    for _turn in range(turns):
        requests = [PolicyRequest(a, f"sub_{a}", "sub", "", list(messages[a]), None, list(history[a])) for a in range(agents)]
        t0 = time.perf_counter()
        responses = policy(requests)
        seconds += time.perf_counter() - t0
        lengths.append(max(len(r.extra["prompt_ids"]) for r in responses))
        for a, response in enumerate(responses):
            history[a].append(response.extra)
            tokens += len(response.extra["completion_ids"])
            samples.append(response.extra["completion_ids"])
            messages[a] += [{"role": "assistant", "content": response.text},
                            {"role": "user", "content": f"<tool_response>{_text(rng, obs_words)}</tool_response>"}]
    for a in range(agents):
        policy.release(a, f"sub_{a}")
    return seconds, tokens, samples, lengths


def iterations(tmp: Path, quick: bool, start: Path | None = None) -> tuple[list[tuple[str, float, str]], dict]:
    """One iteration per (mode, before/after), same seeds: time/iteration and its parts.

    ``start``: a folder of start models per role (the demo's warm start, tiny profile), so that the
    hierarchy delegates as it does in the demo; None: random tiny models (the main agent then never
    delegates and a hierarchy iteration is only the main agent's turns).
    """
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.training.trainer import Trainer

    b, k, new = (1, 2, 24) if quick else (2, 4, 64)
    rows, raw = [], {}
    for mode in ("mgrpo", "single-agent"):
        for label, kv, skip in (("before", 0, "false"), ("after", 1024, "true")):
            roles = ("single",) if mode == "single-agent" else ("main", "sub")
            overrides = [
                f"mode={mode}", f"out_dir={tmp / f'run-{mode}-{label}'}", f"models_dir={tmp / 'models'}",
                f"scenario_kwargs={{num_entities: 300, seed: 0, data_dir: {tmp / 'data'}"
                + (", profile: tiny}" if start else "}"),
                f"questions_per_iteration={b}", f"group_size={k}", "stages=[{split: stage2/train, iterations: 1}]",
                "limits={max_main_turns: 5, max_sub_turns: 3, max_delegations: 3}", "warm_start.epochs=0",
                "torch_threads=1", "checkpoint=false",
            ]
            for role in roles:
                overrides += [f"{role}.model={start / role}"] if start else []
                overrides += [f"{role}.generation.max_new_tokens={new}", f"{role}.generation.kv_cache_mb={kv}",
                              f"{role}.learner.skip_zero_advantage={skip}"]
            trainer = Trainer(load_config(None, overrides))
            with trainer.scenario.open() as world:
                tasks = list(trainer.scenario.tasks("stage2/train"))
                m = trainer.train_iteration(world, tasks, "stage2/train")
            raw[f"{mode} {label}"] = m
            role = "single" if mode == "single-agent" else "main"
            rows.append((f"{mode} iteration {label}", m["time/iteration"],
                         f"s (collect {m['time/collect']:.1f}, update {m['time/update']:.1f}; "
                         f"{role} zero-adv skipped {m.get(f'{role}/zero_adv_skipped', 0.0):.2f})"))
    for label in ("before", "after"):
        ratio = raw[f"single-agent {label}"]["time/iteration"] / raw[f"mgrpo {label}"]["time/iteration"]
        models = f"start models {start.name}" if start else "random tiny models"
        rows.append((f"single/M-GRPO iteration time {label}", ratio, f"B={b}, K={k}, {models}; target after <= 1.5"))
    for mode in ("mgrpo", "single-agent"):
        rows.append((f"{mode} iteration speed-up", raw[f"{mode} before"]["time/iteration"] / raw[f"{mode} after"]["time/iteration"],
                     "before / after"))
    return rows, {k_: {m: v for m, v in d.items() if isinstance(v, (int, float))} for k_, d in raw.items()}


def _plot(ratio: float, rates: dict[str, float], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(list(rates), list(rates.values()), color=["tab:blue", "tab:gray"])
    ax.set_ylabel("sampled tokens / s")
    ax.set_title(f"6-turn rollouts, KV reuse vs re-prefill: {ratio:.1f}x")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="4 agents, ~0.5 k-token prompts, 1 repeat, B=1 K=2 iterations")
    parser.add_argument("--start", default=str(Path(__file__).resolve().parents[1] / "configs" / "demo-warm-start"),
                        help="start models per role for the iterations ('none': random tiny models)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    agents, first, obs, new, repeats = (4, 250, 60, 16, 1) if args.quick else (8, 600, 110, 32, 2)
    turns = 6
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_model_dir(Path(tmp) / "model")
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        rates: dict[str, list[float]] = {"reuse": [], "re-prefill": []}
        same, lengths, stats = True, [], {}
        for _ in range(repeats):
            samples = {}
            for name, kv in (("reuse", 1024.0), ("re-prefill", 0.0)):  # side by side, alternating
                policy = TransformersPolicy(model, tokenizer, role="sub", max_new_tokens=new, seed=0, max_prompt_tokens=4000,
                                            kv_cache_mb=kv)
                seconds, tokens, samples[name], lengths = multi_turn(policy, agents, turns, first, obs)
                rates[name].append(tokens / seconds)
                if policy.kv is not None:
                    stats = policy.kv.stats.as_dict()
            same &= samples["reuse"] == samples["re-prefill"]
        ratios = [r / p for r, p in zip(rates["reuse"], rates["re-prefill"], strict=True)]
        ratio = statistics.median(ratios)
        setup = f"{agents} agents x {turns} turns, prompts {lengths[0]}-{lengths[-1]} tok, {new} new tok/turn"
        rows.append(("multi-turn reuse tokens/s", statistics.median(rates["reuse"]), setup))
        rows.append(("multi-turn re-prefill tokens/s", statistics.median(rates["re-prefill"]), "same chats, same samples"))
        rows.append(("multi-turn ratio reuse/re-prefill", ratio, f"median of {repeats}; target >= 3"))
        rows.append(("multi-turn same sampled ids", "yes" if same else "NO", "reuse vs re-prefill, fixed seed"))
        rows.append(("multi-turn prompt tokens reused", stats.get("reused_tokens", 0) / max(1, stats.get("reused_tokens", 0)
                                                                                        + stats.get("prefilled_tokens", 0)),
                     "share of prompt tokens served from the cache"))
        start = None if args.start == "none" or not Path(args.start).is_dir() else Path(args.start)
        iteration_rows, raw = iterations(Path(tmp), args.quick, start)
        rows += iteration_rows
    RESULTS.mkdir(parents=True, exist_ok=True)
    _plot(ratio, {k: statistics.median(v) for k, v in rates.items()}, RESULTS / "kv_reuse.png")
    report("kv_reuse", rows, {"rates": rates, "ratios": ratios, "cache_stats": stats, "iterations": raw})


if __name__ == "__main__":
    main()
