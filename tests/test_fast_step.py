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


def _llama_without_biases():
    """A plain Llama: no projection has a bias (FastStep fills zero biases for q, k and v and uses no
    gate/up bias), grouped key/value heads, another head size, a single layer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    config = LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=80, num_hidden_layers=1,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
                         attention_bias=False, mlp_bias=False, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("build", [_qwen2, _llama, _llama_without_biases], ids=["qwen2", "llama", "llama-no-bias"])
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


def test_the_weights_are_prepared_once_while_no_parameter_moves() -> None:
    """Preparing the weights copies the whole model: it happens at the first call and after a change
    only, not at every step."""
    model = _qwen2()
    cache, token, mask, position = _prefilled(model, False, True)
    fast = FastStep(model)
    fast(token, mask, position, copy.deepcopy(cache))
    prepared = fast._layers
    fast(token, mask, position + 1, copy.deepcopy(cache))
    assert fast._layers is prepared
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(1.01)
    fast(token, mask, position, copy.deepcopy(cache))
    assert fast._layers is not prepared


def test_the_rope_table_holds_256_positions_first_then_doubles() -> None:
    """The table is grown rarely (amortised): 256 positions at first, then twice its length, or more
    when a call needs more; a position already in the table grows nothing."""
    model = _llama()
    fast = FastStep(model)
    fast.refresh(10)
    assert fast._cos.shape[0] == 256
    fast.refresh(256)  # positions 0-255: all in the table
    assert fast._cos.shape[0] == 256
    fast.refresh(300)
    assert fast._cos.shape[0] == 512
    fast.refresh(1500)
    assert fast._cos.shape[0] == 1500
    cos, sin = model.model.rotary_emb(model.model.embed_tokens.weight[:1], torch.arange(1500)[None])
    assert torch.equal(fast._cos, cos[0]) and torch.equal(fast._sin, sin[0])


def test_a_rotary_module_without_rope_type_is_the_default_rope() -> None:
    """Rotary modules of transformers versions that do not name their rope type compute the default one."""
    model = _qwen2()
    del model.model.rotary_emb.rope_type
    assert FastStep.supports(model)


def test_fast_steps_keep_float32_under_a_float64_default_dtype() -> None:
    """The additive mask and the rotation are made in float32 (the model's dtype) whatever torch's
    default dtype is: a float64 default must not turn them into float64."""
    model = _llama()
    cache, token, mask, position = _prefilled(model, True, True)
    with torch.no_grad():
        expected = model(input_ids=token, attention_mask=mask, position_ids=position, cache=copy.deepcopy(cache),
                         use_cache=True, logits_to_keep=1).logits[:, -1]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        bias = additive_mask(mask, 2)
        ours = FastStep(model)(token, None, position, copy.deepcopy(cache), attention_bias=bias[..., :mask.shape[1]])
    finally:
        torch.set_default_dtype(default)
    assert bias.dtype == torch.float32 and ours.dtype == torch.float32
    torch.testing.assert_close(ours, expected, atol=LOGIT_ATOL, rtol=0)


def test_a_first_token_at_position_zero_is_the_models() -> None:
    """A fresh FastStep's first call at position 0 (an empty cache): the rope table is built for it."""
    from transformers import DynamicCache

    model = _llama()
    token = torch.tensor([[17], [203]])
    position = torch.zeros_like(token)
    with torch.no_grad():
        theirs = model(input_ids=token, position_ids=position, cache=DynamicCache(config=model.config),
                       use_cache=True).logits[:, -1]
    ours = FastStep(model)(token, None, position, DynamicCache(config=model.config))
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
    with pytest.raises(ValueError, match="FastStep does not support Qwen2ForCausalLM: use LeanStep or the forward"):
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


def _ragged_prefill(model, cached: bool, padded: bool, new: int = 6):
    """The inputs of a decode call's prefill: ``new`` columns of new ids after a cache of 20 columns
    (``cached``: rows 0 and 2 padded in the cached part, row 1 also in the new part, as KV reuse lays
    them out) or after nothing (``padded``: rows left-padded to the longest). Returns ``(cache or None,
    ids [3, new], mask over every column, positions of the new columns)``."""
    if cached:
        cache, _, mask, _ = _prefilled(model, padded, True)
        mask = mask[:, :20]
    else:
        from transformers import DynamicCache

        from mgrpo_algo.policies.decode import reserve

        cache = DynamicCache(config=model.config)
        reserve(cache, new + 4)
        mask = torch.ones((3, 0), dtype=torch.long)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 290, (3, new), generator=g)
    tail = torch.ones((3, new), dtype=torch.long)
    if padded:
        tail[1, :2] = 0  # a row with fewer new ids
        tail[2, : new - 1] = 0  # a row with one new id
    mask = torch.cat([mask, tail], dim=-1)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    return cache, ids, mask, positions[:, -new:]


@pytest.mark.parametrize("build", [_qwen2, _llama], ids=["qwen2", "llama"])
@pytest.mark.parametrize("cached", [True, False], ids=["after-a-cache", "fresh"])
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_a_fast_prefill_gives_the_models_logits_and_cache(build, cached, padded) -> None:
    """Several new ids per row, ragged (left padding in the new part, and in the cached part as KV reuse
    lays it out): the last position's logits and every attended column's keys and values are the
    forward's up to rounding, and the next one-token step from that cache is the forward's too."""
    model = build()
    cache, ids, mask, positions = _ragged_prefill(model, cached, padded)
    fast = FastStep(model)
    theirs_cache = copy.deepcopy(cache)
    ours_cache = copy.deepcopy(cache)
    with torch.no_grad():
        theirs = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=theirs_cache, use_cache=True,
                       logits_to_keep=1).logits[:, -1]
    bias = additive_mask(mask, 1) if padded else None
    ours = fast.prefill(ids, positions, ours_cache, bias)
    torch.testing.assert_close(ours, theirs, atol=LOGIT_ATOL, rtol=0)
    attended = mask.bool()
    for a, b in zip(theirs_cache.layers, ours_cache.layers, strict=True):
        assert a.keys.shape == b.keys.shape
        torch.testing.assert_close(b.keys.transpose(1, 2)[attended], a.keys.transpose(1, 2)[attended], atol=1e-5,
                                   rtol=0)
        torch.testing.assert_close(b.values.transpose(1, 2)[attended], a.values.transpose(1, 2)[attended],
                                   atol=1e-5, rtol=0)
        assert torch.isfinite(b.keys).all() and torch.isfinite(b.values).all()  # padding queries stay finite
    _next_step_is_the_models(model, fast, theirs, mask, positions, theirs_cache, ours_cache, padded)


def _next_step_is_the_models(model, fast, logits, mask, positions, theirs_cache, ours_cache, padded: bool) -> None:
    """From a prefill's logits and the two caches it left: one step of the model's argmax through the
    forward and through ``fast`` gives the same logits."""
    token = logits.argmax(-1, keepdim=True)
    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
    position = positions[:, -1:] + 1
    with torch.no_grad():
        theirs = model(input_ids=token, attention_mask=mask, position_ids=position, cache=theirs_cache,
                       use_cache=True, logits_to_keep=1).logits[:, -1]
    ours = fast(token, None, position, ours_cache, attention_bias=additive_mask(mask) if padded else None)
    torch.testing.assert_close(ours, theirs, atol=LOGIT_ATOL, rtol=0)


def test_decode_prefills_through_the_fast_path_only_when_asked(monkeypatch) -> None:
    """``decode(step="fast")`` runs its prefill through FastStep.prefill (one call, no forward) unless
    ``fast_prefill=False``, and both give the same ids and log-probs up to rounding."""
    from mgrpo_algo.policies.decode import decode

    model = _qwen2()
    _, ids, mask, _ = _ragged_prefill(model, False, True)
    calls = {"prefill": 0, "forward": 0}
    prefill, forward = FastStep.prefill, type(model).forward

    def counted_prefill(self, *args, **kwargs):
        calls["prefill"] += 1
        return prefill(self, *args, **kwargs)

    def counted_forward(self, *args, **kwargs):
        calls["forward"] += 1
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(FastStep, "prefill", counted_prefill)
    monkeypatch.setattr(type(model), "forward", counted_forward)
    out = {}
    for fast_prefill in (True, False):
        calls.update(prefill=0, forward=0)
        torch.manual_seed(0)
        out[fast_prefill] = decode(model, ids, mask, None, max_new_tokens=8, stop_ids=[], pad_id=0, temperature=0.0,
                                   top_p=1.0, step="fast", fast_prefill=fast_prefill)
        assert calls == ({"prefill": 1, "forward": 0} if fast_prefill else {"prefill": 0, "forward": 1})
    assert torch.equal(out[True][0], out[False][0])
    torch.testing.assert_close(out[True][1], out[False][1], atol=LOGPROB_ATOL, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_stopped_rows_leave_the_batch_without_changing_what_is_sampled(monkeypatch, temperature) -> None:
    """With many stop ids, rows stop at different steps and leave the batch (``compact``): the ids,
    the log-probs up to each row's stop and every cache column a kept completion reads (its prompt,
    every fed token, the stop token) are those of the same call that keeps every row to the end."""
    import mgrpo_algo.policies.decode as decode_module

    model = _qwen2()
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(5, 290, (12, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[7, :2] = 0
    stops = list(range(5, model.config.vocab_size, 3))  # a third of the vocabulary: rows stop early and apart
    left = []
    whole = decode_module._whole_batch
    monkeypatch.setattr(decode_module, "_whole_batch", lambda *a: left.append(len(a[2])) or whole(*a))
    out = {}
    for compact in (True, False):
        torch.manual_seed(11)
        out[compact] = decode_module.decode(model, ids, mask, None, max_new_tokens=40, stop_ids=stops, pad_id=0,
                                            temperature=temperature, top_p=1.0, step="fast", sampler="inverse_cdf",
                                            compact=compact)
    assert left and left[0] >= 1  # rows left the batch at least once, in the compacted call only
    (ids_c, lps_c, cache_c), (ids_f, lps_f, cache_f) = out[True], out[False]
    assert ids_c.shape == ids_f.shape
    stopped = torch.isin(ids_f, torch.tensor(stops))
    assert len({int(row.nonzero()[0]) for row in stopped if row.any()}) >= 2  # rows stopped at different steps
    for row in range(ids.shape[0]):
        end = int(stopped[row].nonzero()[0]) + 1 if stopped[row].any() else ids_f.shape[1]
        assert torch.equal(ids_c[row, :end], ids_f[row, :end])
        torch.testing.assert_close(lps_c[row, :end], lps_f[row, :end], atol=LOGPROB_ATOL, rtol=0)
        read = min(end, cache_f.layers[0].keys.shape[2] - ids.shape[1])  # as KVCacheManager.store reads
        for a, b in zip(cache_c.layers, cache_f.layers, strict=True):
            torch.testing.assert_close(a.keys[row, :, : ids.shape[1] + read], b.keys[row, :, : ids.shape[1] + read],
                                       atol=1e-5, rtol=0)
            torch.testing.assert_close(a.values[row, :, : ids.shape[1] + read],
                                       b.values[row, :, : ids.shape[1] + read], atol=1e-5, rtol=0)


def test_a_biased_lm_head_is_added_by_the_step_and_the_prefill() -> None:
    """Qwen2's and Llama's heads have no bias, but a Linear head with one is still a head FastStep
    mirrors: both paths add it (their logits are the forward's)."""
    model = _llama()
    head = model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.normal_(0.0, 1.0)
    model.lm_head = biased
    assert FastStep.supports(model)
    fast = FastStep(model)
    cache, ids, mask, positions = _ragged_prefill(model, False, True)
    theirs_cache = copy.deepcopy(cache)
    with torch.no_grad():
        theirs = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=theirs_cache, use_cache=True,
                       logits_to_keep=1).logits[:, -1]
    torch.testing.assert_close(fast.prefill(ids, positions, cache, additive_mask(mask, 1)), theirs, atol=LOGIT_ATOL, rtol=0)
    _next_step_is_the_models(model, fast, theirs, mask, positions, theirs_cache, cache, True)
