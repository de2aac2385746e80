"""FastStep (mgrpo_algo.policies.fast_step) against the model's own forward: the same logits up to float
rounding for a one-token step on padded and unpadded cached batches, for Qwen2 (grouped-query heads,
q/k/v biases: the demo's warm start) and Llama (a bias on every projection, o_proj's included); it
follows the live weights, refuses what it cannot mirror, and the decode loop's log-probs through it are
the model's log-probs of the tokens it sampled."""

from __future__ import annotations

import copy

import pytest
import torch
from test_decode import START, chat_turns, sub_model  # noqa: F401  (the warm-start sub model fixture)
from test_lean_forward import _beside_the_model, _llama, _prefilled, _qwen2

from mgrpo_algo.policies.decode import _cache_kwarg  # `cache` in transformers >= 5.2x, else `past_key_values`
from mgrpo_algo.policies.fast_step import FastStep, additive_mask
from mgrpo_algo.policies.hf_policy import TransformersPolicy

# Float rounding of another summation order: ~1e-6 relative on logits of magnitude ~10.
LOGIT_ATOL = 5e-5
LOGPROB_ATOL = 5e-5


@pytest.mark.parametrize("build", [_qwen2, _llama], ids=["qwen2", "llama"])
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("as_bias", [False, True], ids=["mask", "additive"])
def test_a_fast_step_gives_the_models_logits(build, padded, as_bias) -> None:
    model = build()
    assert FastStep.supports(model)
    fast = FastStep(model)

    def step(token, mask, position, cache):
        if as_bias:
            return fast(token, None, position, cache, attention_bias=additive_mask(mask))
        return fast(token, mask, position, cache)

    pairs, theirs_cache, ours_cache = _beside_the_model(model, step, padded, True)
    for ours, theirs in pairs:
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, atol=LOGIT_ATOL, rtol=0)
        torch.testing.assert_close(ours.log_softmax(-1), theirs.log_softmax(-1), atol=LOGPROB_ATOL, rtol=0)
    for a, b in zip(theirs_cache.layers, ours_cache.layers, strict=True):  # the cache it leaves is the model's
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=0)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=0)


def test_positions_beyond_the_first_table_are_rotated_right() -> None:
    """The rope table grows on demand (256 positions first): a step at position 600 is the model's."""
    model = _llama()
    cache, token, mask, _ = _prefilled(model, False, True)
    position = torch.full_like(token, 250)  # later positions than the cache's: rope only depends on them
    fast = FastStep(model)
    with torch.no_grad():
        for offset in (0, 3, 350):
            theirs = model(input_ids=token, attention_mask=mask, position_ids=position + offset,
                           **{_cache_kwarg(): copy.deepcopy(cache)}, use_cache=True, logits_to_keep=1).logits[:, -1]
            ours = fast(token, mask, position + offset, copy.deepcopy(cache))
            torch.testing.assert_close(ours, theirs, atol=LOGIT_ATOL, rtol=0)


@pytest.mark.parametrize("change", ["mlp.down_proj.weight", "self_attn.k_proj.weight", "self_attn.q_proj.bias",
                                    "input_layernorm.weight", "replaced mlp.gate_proj.weight", "final norm"])
def test_fast_step_reads_the_live_weights(change) -> None:
    """In-place updates (an optimiser step) and replaced tensors (a weight sync) of any weight it
    prepares are seen at the next step of the same FastStep object."""
    model = _qwen2()
    fast = FastStep.for_model(model)
    assert FastStep.for_model(model) is fast  # one step per model object
    cache, token, mask, position = _prefilled(model, True, True)
    before = fast(token, mask, position, copy.deepcopy(cache))
    name = change.split()[-1]
    parameter = model.model.norm.weight if change == "final norm" else model.model.layers[-1].get_parameter(name)
    with torch.no_grad():
        if change.startswith("replaced"):
            parameter.data = parameter.data * 1.5
        else:
            parameter.mul_(1.5)
        expected = model(input_ids=token, attention_mask=mask, position_ids=position, **{_cache_kwarg(): copy.deepcopy(cache)},
                         use_cache=True, logits_to_keep=1).logits[:, -1]
    after = fast(token, mask, position, copy.deepcopy(cache))
    assert (before - after).abs().max() > 1e-3
    torch.testing.assert_close(after, expected, atol=LOGIT_ATOL, rtol=0)


def test_what_it_cannot_mirror_is_refused(monkeypatch) -> None:
    import mgrpo_algo.policies.fast_step as fast_step

    model = _qwen2()
    model.train()
    assert not FastStep.supports(model)
    model.eval()
    assert FastStep.supports(model)
    assert not FastStep.supports(copy.deepcopy(model).to(torch.bfloat16))  # float32 only
    dynamic = copy.deepcopy(model)
    dynamic.model.rotary_emb.rope_type = "dynamic"  # frequencies that move with the length: no table
    assert not FastStep.supports(dynamic)
    with pytest.raises(ValueError, match="LeanStep or the forward"):
        FastStep(dynamic)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    monkeypatch.setattr(fast_step, "MAX_MODEL_BYTES", size - 1)  # too large to copy: LeanStep's job
    assert not FastStep.supports(model)
    monkeypatch.setattr(fast_step, "MAX_MODEL_BYTES", size)
    assert FastStep.supports(model)


def test_a_model_with_lora_injected_goes_through_the_forward() -> None:
    """peft replaces the projections of the wrapped model in place: that base object looks like a plain
    Qwen2 model, but reading its projections' weights would drop the adapters."""
    from peft import LoraConfig, get_peft_model

    from mgrpo_algo.policies.lean_forward import LeanStep

    model = _qwen2()
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["v_proj"])).eval()
    for step in (FastStep, LeanStep):
        assert not step.supports(wrapped) and not step.supports(model)


@pytest.mark.parametrize("sampler", ["multinomial", "inverse_cdf"])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.7}])
def test_fast_decode_records_the_models_logprobs_of_what_it_sampled(sub_model, sampler, sampling) -> None:  # noqa: F811
    """Ragged multi-turn batches with KV reuse: every recorded log-prob is the model's own
    ``log_softmax(logits / T)`` of the sampled token under a full teacher-forced forward."""
    policy = TransformersPolicy(sub_model, START / "sub", role="sub", max_new_tokens=40, seed=5, kv_cache_mb=256,
                                decode="fast", sampler=sampler, **sampling)
    recorded = []
    original = policy._generate

    def keep(prompts, seed, keys=None):
        results = original(prompts, seed, keys)
        recorded.extend((p, ids, lps) for p, (ids, lps, _) in zip(prompts, results, strict=True))
        return results

    policy._generate = keep
    turns = chat_turns(policy)
    assert sum(len(ids) for ids, _, _ in turns) > 100 and policy.kv.stats.hits >= 6
    temperature = sampling.get("temperature", 1.0)
    worst = 0.0
    with torch.no_grad():
        for prompt, ids, lps in recorded:
            if not ids:
                continue
            logits = sub_model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1: -1]
            expected = (logits.float() / temperature).log_softmax(-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
            worst = max(worst, (expected - torch.tensor(lps)).abs().max().item())
    assert worst <= LOGPROB_ATOL


def test_a_learner_update_reaches_the_next_fast_step() -> None:
    """RoleLearner.update (fused AdamW, whose kernel leaves the version counters alone: the learner
    bumps them) moves the shared model; the same FastStep object's next step is the new model's."""
    import random

    from mgrpo_algo.core.config import LearnerConfig
    from mgrpo_algo.core.sequences import TokenSequence
    from mgrpo_algo.learning.learner import RoleLearner

    learner = RoleLearner("sub", _qwen2(), LearnerConfig(lr=5e-2))
    model = learner.model.eval()
    fast = FastStep.for_model(model)
    cache, token, mask, position = _prefilled(model, True, True)
    before = fast(token, mask, position, copy.deepcopy(cache))
    rng = random.Random(0)
    learner.update([TokenSequence([rng.randrange(5, 290) for _ in range(20)], [0] * 5 + [1] * 15,
                                  advantage=1.0 if i % 2 else -1.0) for i in range(4)])
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=token, attention_mask=mask, position_ids=position, **{_cache_kwarg(): copy.deepcopy(cache)},
                         use_cache=True, logits_to_keep=1).logits[:, -1]
    after = fast(token, mask, position, copy.deepcopy(cache))
    assert (before - after).abs().max() > 1e-3
    torch.testing.assert_close(after, expected, atol=LOGIT_ATOL, rtol=0)
