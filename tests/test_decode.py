"""The lean decode loop (mgrpo_algo.policies.decode) against transformers' ``generate``: the same
sampled ids and log-probs under a seed, on ragged multi-turn batches with KV reuse, with the demo's
committed warm-start models; and its preallocated cache holds exactly what ``DynamicCache`` holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mgrpo_algo.policies.decode import (
    _cache_kwarg,  # `cache` in transformers >= 5.2x, else `past_key_values`
    decode,
    reserve,
)
from mgrpo_algo.policies.hf_policy import TransformersPolicy
from mgrpo_env.rollout import PolicyRequest

START = Path(__file__).resolve().parent.parent / "configs" / "demo-warm-start"
SYSTEM = {"role": "system", "content": "You research one hop of a question on http://wiki-hops.test."}


@pytest.fixture(scope="module")
def sub_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(START / "sub").eval()


def chat_turns(pol: TransformersPolicy, turns: int = 4, agents: int = 5) -> list[tuple[list[int], list[float], str]]:
    """Ragged multi-turn chats: prompts of different lengths, an agent sits out a turn, one joins late,
    one ends early (released), every tool response has its own length."""
    messages = {a: [SYSTEM, {"role": "user", "content": "Find the capital of the river city. " * (1 + 4 * a)}]
                for a in range(agents)}
    history: dict[int, list[dict]] = {a: [] for a in range(agents)}
    out = []
    for turn in range(turns):
        requests = [PolicyRequest(a, f"sub_{a}", "sub", "", list(messages[a]), None, list(history[a]))
                    for a in range(agents)
                    if not (turn == 1 and a == 1) and not (turn == 0 and a == 3) and not (turn > 1 and a == 2)]
        for response, request in zip(pol(requests), requests, strict=True):
            a = request.episode
            history[a].append(response.extra)
            messages[a] += [{"role": "assistant", "content": response.text},
                            {"role": "user", "content": "<tool_response>" + "the page says " * (3 + 5 * a + 4 * turn)
                             + "</tool_response>"}]
            extra = response.extra
            out.append((extra["completion_ids"], extra["logprobs"], extra["finish_reason"]))
        if turn == 1:
            pol.release(2, "sub_2")
    return out


@pytest.mark.parametrize("sampling", [
    {},
    {"temperature": 0.7, "top_p": 0.8},
    {"temperature": 0.0},
    {"temperature": 1.3, "logprobs_mode": "raw", "max_batch_size": 2},
])
@pytest.mark.parametrize("kv_cache_mb", [256, 0])
@pytest.mark.parametrize("mode", ["lean", "forward"])
def test_lean_decode_samples_what_generate_samples(sub_model, sampling, kv_cache_mb, mode) -> None:
    def policy(mode: str) -> TransformersPolicy:
        return TransformersPolicy(sub_model, START / "sub", role="sub", max_new_tokens=40, seed=5,
                                  kv_cache_mb=kv_cache_mb, decode=mode, sampler="multinomial", **sampling)

    lean_policy = policy(mode)
    lean, reference = chat_turns(lean_policy), chat_turns(policy("generate"))
    assert len(lean) == len(reference) >= 12
    for (ids, lps, finish), (ref_ids, ref_lps, ref_finish) in zip(lean, reference, strict=True):
        assert ids == ref_ids and finish == ref_finish
        assert len(lps) == len(ref_lps) == len(ids)
        assert max((abs(a - b) for a, b in zip(lps, ref_lps, strict=True)), default=0.0) <= 1e-5
    assert sum(len(ids) for ids, _, _ in lean) > 100  # real completions, not empty turns
    assert {f for _, _, f in lean} >= {"stop"}
    if kv_cache_mb:
        stats = lean_policy.kv.stats
        assert stats.hits >= 6 and stats.reused_tokens > stats.prefilled_tokens  # reuse really happened


def test_fast_is_the_default_and_generate_stays_selectable(sub_model) -> None:
    policy = TransformersPolicy(sub_model, START / "sub", role="sub")
    assert (policy.decode, policy.sampler) == ("fast", "inverse_cdf")
    assert TransformersPolicy(sub_model, START / "sub", role="sub", decode="generate").decode == "generate"
    with pytest.raises(ValueError, match="decode"):
        TransformersPolicy(sub_model, START / "sub", role="sub", decode="turbo")


def test_the_preallocated_cache_holds_what_a_dynamic_cache_holds(sub_model) -> None:
    from transformers import DynamicCache

    torch.manual_seed(0)
    ids = torch.randint(5, 300, (3, 17))
    mask = torch.ones_like(ids)
    mask[0, :6] = 0
    mask[2, :2] = 0
    caches = []
    for grow in (False, True):
        cache = DynamicCache(config=sub_model.config)
        if grow:
            reserve(cache, 4)  # less room than fed: the layer must grow and keep what it holds
        with torch.no_grad():
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            sub_model(input_ids=ids[:, :9], attention_mask=mask[:, :9], position_ids=positions[:, :9], **{_cache_kwarg(): cache})
            out = sub_model(input_ids=ids[:, 9:], attention_mask=mask, position_ids=positions[:, 9:], **{_cache_kwarg(): cache})
        caches.append((cache, out.logits))
    (plain, logits), (grown, grown_logits) = caches
    assert torch.equal(logits, grown_logits)
    for a, b in zip(plain.layers, grown.layers, strict=True):
        assert a.get_seq_length() == b.get_seq_length() == 17
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_the_preallocated_layer_grows_only_past_its_room_and_then_doubles() -> None:
    """The point of the preallocated layer: no copy of the cache per token. Fed exactly up to the room
    reserved, it keeps one buffer; past it, the buffer doubles once (not one copy per further token),
    and the keys and values are the concatenation of what was fed."""
    from transformers import DynamicCache, LlamaConfig

    config = LlamaConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2)
    cache = DynamicCache(config=config)
    reserve(cache, 6)
    layer = cache.layers[0]
    g = torch.Generator().manual_seed(0)
    chunks = [torch.randn(2, 2, n, 4, generator=g) for n in (2, 2, 2, 1, 1)]
    layer.update(chunks[0], -chunks[0])
    buffer = layer._k.data_ptr()
    assert layer._k.shape[2] == 6
    for chunk in chunks[1:3]:
        layer.update(chunk, -chunk)
    assert layer._k.data_ptr() == buffer and layer._k.shape[2] == 6  # filled exactly: still the one buffer
    layer.update(chunks[3], -chunks[3])
    assert layer._k.shape[2] == 12  # one past the room: doubled
    buffer = layer._k.data_ptr()
    keys, values = layer.update(chunks[4], -chunks[4])
    assert layer._k.data_ptr() == buffer and layer.get_seq_length() == 8
    fed = torch.cat(chunks, 2)
    assert torch.equal(keys, fed) and torch.equal(values, -fed)
    # a cache that already holds a position (KV reuse): reserving 4 more keeps it and makes room for 5
    held = DynamicCache(config=config)
    held.layers[0].update(chunks[1][:, :, :1], chunks[2][:, :, :1])
    before = (held.layers[0].keys.clone(), held.layers[0].values.clone())
    reserve(held, 4)
    layer = held.layers[0]
    assert layer._k.shape[2] == 5 and layer.get_seq_length() == 1
    assert torch.equal(layer.keys, before[0]) and torch.equal(layer.values, before[1])
    buffer = layer._k.data_ptr()
    layer.update(chunks[0], chunks[0])
    layer.update(chunks[1], chunks[1])
    assert layer._k.data_ptr() == buffer and layer.get_seq_length() == 5


def test_decode_stops_every_row_at_its_stop_id_and_pads_after(sub_model) -> None:
    ids = torch.randint(5, 300, (4, 12))
    mask = torch.ones_like(ids)
    with torch.random.fork_rng():
        torch.manual_seed(1)
        tokens, logps, cache = decode(sub_model, ids, mask, None, max_new_tokens=30, stop_ids=[7, 9], pad_id=0,
                                      temperature=1.0, top_p=1.0)
    assert tokens.shape == logps.shape and tokens.shape[1] <= 30
    for row in tokens.tolist():
        hits = [i for i, t in enumerate(row) if t in (7, 9)]
        if hits:  # everything after the first stop id is padding
            assert all(t == 0 for t in row[hits[0] + 1:])
    assert cache.get_seq_length() == 12 + tokens.shape[1] - 1  # the last sampled token is never fed
    assert torch.all(logps <= 0)


def test_inverse_cdf_draws_the_distribution_and_never_a_zero_probability_token() -> None:
    from mgrpo_algo.policies.decode import inverse_cdf

    probs = torch.tensor([[0.5, 0.0, 0.2, 0.3, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0]]).repeat(20_000, 1)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        picked = inverse_cdf(probs)
    first, second = picked[0::2], picked[1::2]
    counts = torch.bincount(first, minlength=5).float() / len(first)
    # 20k draws: a standard error of at most 0.0035 per frequency; 0.015 is over four of them
    assert torch.allclose(counts, torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0]), atol=0.015)
    assert counts[1] == 0 and counts[4] == 0 and bool((second == 3).all())
    # unnormalised rows (a top-p nucleus before renormalising) draw the same distribution
    with torch.random.fork_rng():
        torch.manual_seed(0)
        assert torch.equal(inverse_cdf(probs * 3.0), picked)


@pytest.mark.parametrize(("uniform", "probs", "expected"), [
    (0.0, [0.0, 0.5, 0.5], 1),  # u = 0 exactly (torch.rand can draw it): never the zero-probability token 0
    (0.25, [0.25, 0.0, 0.75], 2),  # u on a boundary: [0, 0.25) is token 0, [0.25, 1) token 2 (not the empty 1)
    (0.2, [0.25, 0.0, 0.75], 0),
    (1.0, [0.5, 0.5, 0.0], 1),  # u = the total (rounding): kept below it, never the zero-probability token past it
])
def test_inverse_cdf_intervals_by_hand(monkeypatch: pytest.MonkeyPatch, uniform: float, probs: list[float],
                                       expected: int) -> None:
    """Token i is drawn for u * total in [cdf[i - 1], cdf[i]): the edges, with the uniform fixed."""
    from mgrpo_algo.policies.decode import inverse_cdf

    monkeypatch.setattr(torch, "rand", lambda shape, **kwargs: torch.full(shape, uniform, **kwargs))
    weights = torch.tensor([probs, [p * 4.0 for p in probs]])  # unnormalised weights: the same intervals
    assert inverse_cdf(weights).tolist() == [expected, expected]


def test_top_p_keeps_the_smallest_nucleus_that_reaches_p_by_hand() -> None:
    """Probabilities 1/8, 1/2, 1/8, 1/4 (row 0) and their mirror (row 1): the nucleus of p = 0.7 is
    {1/2, 1/4} (3/4 >= 0.7, 1/2 alone is not); of p = 0.4 the top token alone; of p = 0.5 over four equal
    tokens (exact quarters) two of them: 1/4 + 1/4 reaches 1/2 exactly. Scores are untouched inside the nucleus."""
    from mgrpo_algo.policies.decode import _top_p

    probs = torch.tensor([[0.125, 0.5, 0.125, 0.25], [0.25, 0.125, 0.5, 0.125]])
    scores = probs.log()
    kept = _top_p(scores, 0.7)
    assert torch.isfinite(kept).tolist() == [[False, True, False, True], [True, False, True, False]]
    assert torch.equal(kept[torch.isfinite(kept)], scores[torch.isfinite(kept)])
    assert torch.isfinite(_top_p(scores, 0.4)).tolist() == [[False, True, False, False], [False, False, True, False]]
    equal = _top_p(torch.zeros(3, 4), 0.5)
    assert torch.isfinite(equal).sum(-1).tolist() == [2, 2, 2]


def test_inverse_cdf_draws_the_same_ids_under_a_float64_default_dtype() -> None:
    """The uniforms are drawn in the probabilities' dtype (float32), whatever torch's default dtype is: a
    float64 default must not change the ids drawn under a seed."""
    from mgrpo_algo.policies.decode import inverse_cdf

    probs = torch.softmax(torch.randn(500, 40, generator=torch.Generator().manual_seed(1)), -1)

    def draw() -> torch.Tensor:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            return inverse_cdf(probs)

    plain = draw()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        under_float64 = draw()
    finally:
        torch.set_default_dtype(default)
    assert torch.equal(plain, under_float64) and len(set(plain.tolist())) > 10


def test_process_scores_tempers_then_cuts_and_records_raw_or_processed_log_probs() -> None:
    from mgrpo_algo.policies.decode import process_scores

    logits = torch.tensor([[0.0, 2.0, 4.0, 6.0]])
    scores, logp = process_scores(logits, 2.0, 1.0, "processed")
    assert torch.allclose(scores, logits / 2) and torch.allclose(logp, torch.log_softmax(logits / 2, -1))
    scores, logp = process_scores(logits, 2.0, 1.0, "raw")
    assert torch.allclose(scores, logits / 2) and torch.allclose(logp, torch.log_softmax(logits, -1))
    # T = 2 then top-p 0.8: probabilities of [0, 1, 2, 3] are e^k / (1 + e + e^2 + e^3); the two largest
    # hold 0.88 >= 0.8 and the largest alone 0.64: the nucleus is tokens 2 and 3, renormalised
    scores, logp = process_scores(logits, 2.0, 0.8, "processed")
    nucleus = torch.tensor([2.0, 3.0])
    expected = torch.tensor([float("-inf"), float("-inf"), *torch.log_softmax(nucleus, -1).tolist()])
    assert torch.allclose(logp[0], expected) and torch.isinf(scores[0, :2]).all()
    _, raw = process_scores(logits, 2.0, 0.8, "raw")
    assert torch.allclose(raw, torch.log_softmax(logits, -1))  # raw: the model's distribution, uncut
    scores, logp = process_scores(logits, 0.0, 0.5, "processed")  # greedy: untouched
    assert torch.equal(scores, logits) and torch.allclose(logp, torch.log_softmax(logits, -1))
    # top-p 1 cuts nothing: a token whose probability is 0 in float32 keeps its finite log-prob
    far = torch.tensor([[0.0, -200.0]])
    scores, logp = process_scores(far, 1.0, 1.0, "processed")
    assert torch.equal(scores, far) and torch.allclose(logp, torch.tensor([[0.0, -200.0]]))


def test_the_inverse_cdf_sampler_records_the_models_log_probs(sub_model) -> None:
    """Other ids than generate under a seed, but token-in/token-out exact: each recorded log-prob is
    log_softmax(logits / T) of the full forward at the sampled id (what the learner computes)."""
    pol = TransformersPolicy(sub_model, START / "sub", role="sub", max_new_tokens=24, seed=3, temperature=0.8,
                             sampler="inverse_cdf")
    out = chat_turns(pol, turns=2, agents=3)
    assert sum(len(ids) for ids, _, _ in out) > 30
    request = PolicyRequest(0, "sub_0", "sub", "", [SYSTEM, {"role": "user", "content": "Where is the bridge?"}], None, [])
    response = pol([request])[0]
    prompt, ids, logprobs = response.extra["prompt_ids"], response.extra["completion_ids"], response.extra["logprobs"]
    with torch.no_grad():
        logits = sub_model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1: -1] / 0.8
    expected = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)
    assert len(ids) > 3
    assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-5)
    with pytest.raises(ValueError, match="sampler"):
        TransformersPolicy(sub_model, START / "sub", role="sub", sampler="gumbel")


@pytest.mark.parametrize("sampler", ["multinomial", "inverse_cdf"])
def test_each_sampler_draws_from_the_tempered_nucleus(sub_model, sampler) -> None:
    """One step over 4,000 copies of a prompt: the drawn frequencies are softmax(logits / T) renormalised
    over the top-p nucleus (T = 2, top-p 0.8; frequencies within 0.03; a token outside the nucleus is never drawn)."""
    from mgrpo_algo.policies.decode import process_scores

    prompt = torch.randint(5, 300, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits = sub_model(input_ids=prompt).logits[0, -1].float()
    scores, _ = process_scores(logits[None], 2.0, 0.8, "processed")
    expected = torch.softmax(scores[0], -1)
    rows = 4000
    with torch.random.fork_rng():
        torch.manual_seed(0)
        tokens, _, _ = decode(sub_model, prompt.repeat(rows, 1), torch.ones((rows, 9), dtype=torch.long), None,
                              max_new_tokens=1, stop_ids=[], pad_id=0, temperature=2.0, top_p=0.8, sampler=sampler)
    counts = torch.bincount(tokens[:, 0], minlength=expected.numel()).float() / rows
    assert float((counts - expected).abs().max()) < 0.03
    assert float(counts[expected == 0].sum()) == 0.0
    assert int((expected > 0).sum()) >= 2  # a real choice, not one certain token
