"""The lean decode loop (mgrpo_algo.policies.decode) against transformers' ``generate``: the same
sampled ids and log-probs under a seed, on ragged multi-turn batches with KV reuse, with the demo's
committed warm-start models; and its preallocated cache holds exactly what ``DynamicCache`` holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mgrpo_algo.policies.decode import decode, reserve
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
                                  kv_cache_mb=kv_cache_mb, decode=mode, **sampling)

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


def test_lean_is_the_default_and_generate_stays_selectable(sub_model) -> None:
    assert TransformersPolicy(sub_model, START / "sub", role="sub").decode == "lean"
    with pytest.raises(ValueError, match="decode"):
        TransformersPolicy(sub_model, START / "sub", role="sub", decode="fast")


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
            sub_model(input_ids=ids[:, :9], attention_mask=mask[:, :9], position_ids=positions[:, :9], cache=cache)
            out = sub_model(input_ids=ids[:, 9:], attention_mask=mask, position_ids=positions[:, 9:], cache=cache)
        caches.append((cache, out.logits))
    (plain, logits), (grown, grown_logits) = caches
    assert torch.equal(logits, grown_logits)
    for a, b in zip(plain.layers, grown.layers, strict=True):
        assert a.get_seq_length() == b.get_seq_length() == 17
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


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
