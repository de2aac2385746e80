"""LeanStep (mgrpo_algo.policies.lean_forward) against the model's own forward: bitwise the same logits
for a one-token step, on padded and unpadded batches over a cache, for Qwen2 (grouped-query heads,
q/k/v biases: the demo's committed warm start) and Llama (biases on every projection, one key/value head per query
head); it follows the live weights and refuses what it cannot mirror."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mgrpo_algo.policies.decode import (
    _cache_kwarg,  # `cache` in transformers >= 5.2x, else `past_key_values`
    reserve,
)
from mgrpo_algo.policies.lean_forward import LeanStep

START = Path(__file__).resolve().parent.parent / "configs" / "demo-warm-start"


def _qwen2():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(START / "sub").eval()


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                         attention_bias=True, mlp_bias=True, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # biases start at zero, where dropping one would not show
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0.0, 0.1)
    return model


def _prefilled(model, padded: bool, grow: bool):
    """A cache over 20 columns of 3 rows (row 0 left-padded, row 2 padded in the middle as KV reuse
    lays it out, when ``padded``), the next token and the step's mask and positions."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 290, (3, 21), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :7] = 0
        mask[2, 10:13] = 0
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    cache = DynamicCache(config=model.config)
    if grow:
        reserve(cache, 24)  # the decode loop's preallocated layers
    with torch.no_grad():
        model(input_ids=ids[:, :20], attention_mask=mask[:, :20], position_ids=positions[:, :20], **{_cache_kwarg(): cache},
              use_cache=True)
    return cache, ids[:, 20:], mask, positions[:, 20:]


def _beside_the_model(model, step, padded: bool, grow: bool, steps: int = 3):
    """``steps`` one-token steps through the model's forward and through ``step(token, mask, position,
    cache)`` on copies of one prefilled cache, each step feeding the model's argmax: ``([(ours,
    theirs) logits per step], the model's cache, the step's cache)``."""
    import copy

    cache, token, mask, position = _prefilled(model, padded, grow)
    theirs_cache, ours_cache = cache, copy.deepcopy(cache)
    pairs = []
    with torch.no_grad():
        for _ in range(steps):  # several steps: each extends its cache the same way
            theirs = model(input_ids=token, attention_mask=mask, position_ids=position, **{_cache_kwarg(): theirs_cache},
                           use_cache=True, logits_to_keep=1).logits[:, -1]
            pairs.append((step(token, mask, position, ours_cache), theirs))
            token = theirs.argmax(-1, keepdim=True)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
            position = position + 1
    return pairs, theirs_cache, ours_cache


@pytest.mark.parametrize("build", [_qwen2, _llama], ids=["qwen2", "llama"])
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("grow", [True, False], ids=["reserved", "dynamic"])
def test_a_lean_step_gives_the_models_logits_bitwise(build, padded, grow) -> None:
    model = build()
    assert LeanStep.supports(model)
    lean = LeanStep(model)
    pairs, theirs_cache, ours_cache = _beside_the_model(model, lean, padded, grow)
    for ours, theirs in pairs:
        assert torch.equal(ours, theirs)
    for a, b in zip(theirs_cache.layers, ours_cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.mark.parametrize("change", ["mlp.down_proj.weight", "self_attn.q_proj.weight", "self_attn.v_proj.bias",
                                    "mlp.up_proj.weight", "replaced self_attn.k_proj.weight"])
def test_lean_step_reads_the_live_weights(change) -> None:
    """In-place updates (an optimiser step) and replaced tensors (a weight sync) of any projection, the
    stacked ones included, are seen at the next step of the same LeanStep object."""
    import copy

    model = _qwen2()
    lean = LeanStep.for_model(model)
    assert LeanStep.for_model(model) is lean  # one step per model object
    cache, token, mask, position = _prefilled(model, True, True)
    before = lean(token, mask, position, copy.deepcopy(cache))
    name = change.split()[-1]
    parameter = model.model.layers[-1].get_parameter(name)
    with torch.no_grad():
        if change.startswith("replaced"):
            parameter.data = parameter.data * 1.5
        else:
            parameter.mul_(1.5)
        expected = model(input_ids=token, attention_mask=mask, position_ids=position, **{_cache_kwarg(): copy.deepcopy(cache)},
                         use_cache=True, logits_to_keep=1).logits[:, -1]
    after = lean(token, mask, position, copy.deepcopy(cache))
    assert not torch.equal(before, after) and torch.equal(after, expected)


def test_what_it_cannot_mirror_goes_through_the_forward() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    model = _qwen2()
    model.train()
    assert not LeanStep.supports(model)  # dropout and training-mode branches
    model.eval()
    assert LeanStep.supports(model)
    eager = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                         num_attention_heads=2, attn_implementation="eager")).eval()
    assert not LeanStep.supports(eager)
    with pytest.raises(ValueError, match="forward"):
        LeanStep(eager)
