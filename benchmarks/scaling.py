"""How our update step scales with the group size K and the alignment width d.

    .venv/bin/python benchmarks/scaling.py [--quick]

One step = group advantages + building the ``TokenSequence`` batch + ``RoleLearner.update``, on the
tiny random Qwen2 (hidden 128, 4 layers, vocab 1024, one torch thread), sequences of P prompt + T
sampled tokens. K doubles (2, 4, 8, 16) with B queries of main-agent samples (B*K sequences); d
doubles (1, 2, 4, 8) with B x K fixed, sub-agent slots pooled per query (B*K*d sequences, all slots
filled, as the "duplicate" alignment does). The exponent is the slope of log(time) against
log(size), least squares: ~1 means linear. Writes benchmarks/results/scaling.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from common import median_ms, report  # noqa: E402

from mgrpo_algo.core.advantages import main_advantages, sub_advantages  # noqa: E402
from mgrpo_algo.core.config import LearnerConfig  # noqa: E402
from mgrpo_algo.core.sequences import TokenSequence  # noqa: E402
from mgrpo_algo.learning.learner import RoleLearner  # noqa: E402


def _model(hidden: int, layers: int, vocab: int = 1024) -> transformers.PreTrainedModel:
    config = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=hidden * 3, tie_word_embeddings=True, max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config)


def _step(learner: RoleLearner, shape: tuple[int, ...], prompt: int, sampled: int, vocab: int = 1024):
    """A closure running one step on a fixed random batch of ``prod(shape)`` sequences."""
    g = torch.Generator().manual_seed(len(shape) * 100 + int(np.prod(shape)))
    rewards = torch.randint(0, 2, shape, generator=g).float()
    ids = torch.randint(0, vocab, (int(np.prod(shape)), prompt + sampled), generator=g).tolist()
    estimator = main_advantages if len(shape) == 2 else sub_advantages

    def run() -> None:
        adv = estimator(rewards).flatten().tolist()
        batch = [TokenSequence(row, [0] * prompt + [1] * sampled, a) for row, a in zip(ids, adv, strict=True)]
        learner.update(batch)

    return run


def _exponent(sizes: list[int], ms: list[float]) -> float:
    return float(np.polyfit(np.log(sizes), np.log(ms), 1)[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="hidden 64, 2 layers, 32+32 tokens, K and d up to 8 / 4")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        hidden, layers, prompt, sampled, repeats, ks, ds = 64, 2, 32, 32, 2, (2, 4, 8), (1, 2, 4)
    else:
        hidden, layers, prompt, sampled, repeats, ks, ds = 128, 4, 64, 64, 3, (2, 4, 8, 16), (1, 2, 4, 8)
    b, k_fixed = 2, 4
    learner = RoleLearner("main", _model(hidden, layers), LearnerConfig())
    rows, extra = [], {"setup": {"hidden": hidden, "layers": layers, "tokens": prompt + sampled, "B": b, "K_for_d": k_fixed}}
    for name, sizes, shape in (("K", ks, lambda x: (b, x)), ("d", ds, lambda x: (b, k_fixed, x))):
        times = []
        for size in sizes:
            ms = median_ms(_step(learner, shape(size), prompt, sampled), repeats)
            times.append(ms)
            seqs = int(np.prod(shape(size)))
            rows.append((f"update {name}={size}", ms, f"ms median, {seqs} sequences x {prompt + sampled} tok"))
        exponent = _exponent(list(sizes), times)
        rows.append((f"exponent time ~ {name}^a", exponent, "log-log least squares; ~1 = linear"))
        extra[f"exponent_{name}"] = exponent
    report("scaling", rows, extra)


if __name__ == "__main__":
    main()
