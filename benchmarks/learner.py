"""Learner throughput per role on CPU for the tiny sizes, peak memory, and one iteration's time split.

    .venv/bin/python benchmarks/learner.py [--quick]

1. ``RoleLearner.update`` on 16 sequences per role at lengths typical of each role in wiki-hops
   (main ~700 tokens: system prompt, question, reports; sub ~1,500: a visited page or two), for
   hidden 128 and 256 (4 layers, vocab 2048), one torch thread: median seconds and tokens/s.
2. Peak resident memory of the process (ru_maxrss).
3. Two M-GRPO iterations with freshly built tiny models on the 2,000-entity world (B=4, K=4), split
   into generation, tools, scoring and update.
Writes benchmarks/results/learner.json.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from common import report  # noqa: E402

from mgrpo_algo.core.config import LearnerConfig, load_config  # noqa: E402
from mgrpo_algo.core.sequences import TokenSequence  # noqa: E402
from mgrpo_algo.learning.learner import RoleLearner  # noqa: E402
from mgrpo_algo.training.trainer import Trainer  # noqa: E402


def _model(hidden: int, layers: int = 4, vocab: int = 2048) -> transformers.PreTrainedModel:
    config = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=hidden * 3, tie_word_embeddings=True, max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config)


def _batch(length: int, sampled: int, n: int = 16, vocab: int = 2048) -> list[TokenSequence]:
    g = torch.Generator().manual_seed(length)
    out = []
    for i in range(n):
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        mask = [0] * (length - sampled) + [1] * sampled
        out.append(TokenSequence(ids, mask, advantage=1.0 if i % 2 else -1.0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    rows = []
    repeats = 2 if args.quick else 5
    for hidden in (128,) if args.quick else (128, 256):
        for role, length, sampled in (("main", 700, 120), ("sub", 1500, 160)):
            learner = RoleLearner(role, _model(hidden), LearnerConfig())
            batch = _batch(length, sampled)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                learner.update(batch)
                times.append(time.perf_counter() - t0)
            seconds = statistics.median(times)
            tokens = sum(s.num_tokens for s in batch)
            rows.append((f"update {role} h{hidden} (16 x {length} tok)", seconds, f"s, {tokens / seconds:,.0f} tokens/s"))
    rows.append(("peak RSS after updates", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "MB"))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, [
            f"out_dir={tmp}/run", f"models_dir={tmp}/models", "warm_start.epochs=0",
            f"scenario_kwargs={{num_entities: {300 if args.quick else 2000}, data_dir: {tmp}/data}}",
            "stages=[{split: stage2/train, iterations: 2}]", "questions_per_iteration=4", "group_size=4",
        ])
        history = Trainer(cfg).run()
    last = history[-1]
    for key in ("time/generation", "time/tools", "time/env_steps", "time/scoring", "time/update", "time/iteration"):
        rows.append((f"iteration {key[5:]}", last[key], "s (second iteration, random tiny models)"))
    rows.append(("peak RSS overall", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "MB"))
    report("learner", rows)


if __name__ == "__main__":
    main()
