"""Zero-advantage samples are skipped by the learner (no forward/backward) without changing the update:
same gradients and the same step as without skipping, the normaliser still counting them."""

from __future__ import annotations

import random

import pytest
import torch
from learner_helpers import assert_adamw_first_steps_close

from mgrpo_algo.core.config import LearnerConfig
from mgrpo_algo.core.sequences import TokenSequence
from mgrpo_algo.learning.learner import RoleLearner

VOCAB = 96


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-qwen2-skip")
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def sequences(advantages: list[float], seed: int = 0) -> list[TokenSequence]:
    """Random multi-turn-like samples of different lengths with the given advantages."""
    rng = random.Random(seed)
    out = []
    for i, adv in enumerate(advantages):
        length, prompt = rng.randint(12, 40), rng.randint(2, 6)
        mask = [0] * prompt + [1] * (length - prompt)
        if i % 3 == 0:
            mask[prompt + 3: prompt + 6] = [0, 0, 0]  # a tool response in the middle
        out.append(TokenSequence([rng.randrange(VOCAB) for _ in range(length)], mask, advantage=adv, role="main"))
    return out


def run(model_dir, seqs: list[TokenSequence], **config) -> tuple[list[list[torch.Tensor]], dict[str, float], RoleLearner]:
    """One update; returns the gradients seen at each optimiser step, the metrics and the learner."""
    learner = RoleLearner("main", model_dir, LearnerConfig(lr=1e-3, micro_batch_tokens=80, **config))
    grads: list[list[torch.Tensor]] = []
    step = learner.optimizer.step

    def recording_step(*args, **kwargs):
        grads.append([p.grad.detach().clone() for p in learner.params])
        return step(*args, **kwargs)

    learner.optimizer.step = recording_step
    return grads, learner.update(seqs), learner


ADVANTAGES = [1.0, 0.0, -0.5, 0.0, 0.0, 2.0, 0.0, -1.0, 0.0, 0.7]


@pytest.mark.parametrize(("aggregation", "passes"), [("seq-mean-token-mean", {}), ("token-mean", {}),
                                                     ("seq-mean-token-mean", {"minibatches": 2, "ppo_epochs": 2})])
def test_skipping_zero_advantage_samples_gives_the_same_gradients(model_dir, aggregation, passes):
    seqs = sequences(ADVANTAGES)
    kept, m_kept, l_kept = run(model_dir, seqs, aggregation=aggregation, skip_zero_advantage=False, **passes)
    skipped, m_skip, l_skip = run(model_dir, seqs, aggregation=aggregation, **passes)
    assert m_kept["main/zero_adv_skipped"] == 0
    assert m_skip["main/zero_adv_skipped"] == pytest.approx(5 / 10)
    assert m_skip["main/micro_batches"] < m_kept["main/micro_batches"]  # the skipped ones really ran no forward
    assert len(kept) == len(skipped) == m_kept["main/optimizer_steps"]
    for step_kept, step_skip in zip(kept, skipped, strict=True):
        assert any(bool(g.abs().sum() > 0) for g in step_kept)
        for a, b in zip(step_kept, step_skip, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
    assert m_skip["main/loss"] == pytest.approx(m_kept["main/loss"], rel=1e-5, abs=1e-7)
    assert m_skip["main/pg_loss"] == pytest.approx(m_kept["main/pg_loss"], rel=1e-5, abs=1e-7)
    if not passes:  # one step: the same weights after it, up to what AdamW makes of the gradients' rounding
        assert_adamw_first_steps_close(l_kept, l_skip, kept[0], grad_atol=1e-7, grad_rtol=1e-5)


def test_a_step_whose_samples_are_all_skipped_still_steps(model_dir):
    """All advantages zero: no forward at all, but AdamW still steps on a zero gradient (weight decay,
    as it does without skipping)."""
    seqs = sequences([0.0] * 4)
    kept, m_kept, l_kept = run(model_dir, seqs, skip_zero_advantage=False, weight_decay=0.1)
    skipped, m_skip, l_skip = run(model_dir, seqs, weight_decay=0.1)
    assert m_skip["main/zero_adv_skipped"] == 1.0 and m_skip["main/micro_batches"] == 0
    assert m_skip["main/optimizer_steps"] == m_kept["main/optimizer_steps"] == 1
    for a, b in zip(kept[0], skipped[0], strict=True):
        torch.testing.assert_close(b, a)
    for a, b in zip(l_kept.model.parameters(), l_skip.model.parameters(), strict=True):
        torch.testing.assert_close(b, a)


@pytest.mark.parametrize("terms", [{"kl_coef": 0.1}, {"entropy_coef": 0.01, "compute_entropy": True}])
def test_no_skipping_when_a_kl_or_entropy_term_gives_zero_advantages_a_gradient(model_dir, terms):
    _, metrics, _ = run(model_dir, sequences(ADVANTAGES), **terms)
    assert metrics["main/zero_adv_skipped"] == 0
