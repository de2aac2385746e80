"""KV reuse across turns in TransformersPolicy: the same sampled ids and log-probs (within 1e-5) as a
full re-prefill under a fixed seed, for the main agent, sub-agents and the single agent; caches freed
when agents end, kept under the budget, dropped when the weights change."""

from __future__ import annotations

import json
import math
import types

import pytest
import torch

from mgrpo_algo.policies.hf_policy import TransformersPolicy
from mgrpo_algo.policies.models import build_tiny_model
from mgrpo_env.rollout import PolicyRequest, collect

SYSTEM = {"role": "system", "content": "You are a research agent."}


@pytest.fixture(scope="module")
def model(tokenizer, keep):
    from transformers import AutoModelForCausalLM

    def build(path):
        build_tiny_model(tokenizer, path, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=0)
        return AutoModelForCausalLM.from_pretrained(path)

    return keep("kv-model", build)


def policy(model, tokenizer, role: str, kv_cache_mb: float, **kwargs) -> TransformersPolicy:
    return TransformersPolicy(model, tokenizer, role=role, max_new_tokens=kwargs.pop("max_new_tokens", 12),
                              temperature=kwargs.pop("temperature", 1.0), seed=11, kv_cache_mb=kv_cache_mb, **kwargs)


def chat_turns(pol: TransformersPolicy, role: str, turns: int = 5, agents: int = 4) -> list[tuple[list[int], list[float]]]:
    """Multi-turn chats of ragged lengths driven by hand: an agent sits out a turn, one joins late, one
    ends early (released); every turn's tool response has its own length."""
    messages = {a: [SYSTEM, {"role": "user", "content": "question " * (3 + 9 * a)}] for a in range(agents)}
    history: dict[int, list[dict]] = {a: [] for a in range(agents)}
    out = []
    for turn in range(turns):
        requests = [PolicyRequest(a, f"{role}_{a}", role, "", list(messages[a]), None, list(history[a]))
                    for a in range(agents)
                    if not (turn == 2 and a == 1) and not (turn == 0 and a == 3) and not (turn > 2 and a == 2)]
        for response, request in zip(pol(requests), requests, strict=True):
            a = request.episode
            history[a].append(response.extra)
            messages[a] += [{"role": "assistant", "content": response.text},
                            {"role": "user", "content": "<tool_response>" + "page text " * (2 + 4 * a + 3 * turn) + "</tool_response>"}]
            out.append((response.extra["completion_ids"], response.extra["logprobs"]))
        if turn == 2:
            pol.release(2, f"{role}_2")  # agent 2 ended
    return out


def assert_same(reused, fresh) -> None:
    assert len(reused) == len(fresh)
    for (ids_r, lp_r), (ids_f, lp_f) in zip(reused, fresh, strict=True):
        assert ids_r == ids_f
        assert len(lp_r) == len(lp_f) and all(math.isfinite(x) for x in lp_r)
        assert max((abs(x - y) for x, y in zip(lp_r, lp_f, strict=True)), default=0.0) <= 1e-5


@pytest.mark.parametrize("role", ["main", "sub", "single"])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.7, "top_p": 0.8}, {"max_batch_size": 2}])
def test_reuse_gives_the_same_ids_and_logprobs_as_a_full_prefill(model, tokenizer, role, sampling):
    reusing = policy(model, tokenizer, role, 64, **sampling)
    reused = chat_turns(reusing, role)
    fresh = chat_turns(policy(model, tokenizer, role, 0, **sampling), role)
    assert_same(reused, fresh)
    stats = reusing.kv.stats
    assert stats.hits >= 10 and stats.reused_tokens > stats.prefilled_tokens  # the reuse really happened
    assert (2, f"{role}_2") not in reusing.kv.entries  # released when it ended


def test_collect_hierarchy_reuses_for_main_and_sub_agents_and_frees_every_cache(model, tokenizer, small_scenario,
                                                                               small_world):
    """Through the env: a scripted main agent delegates (so sub-agents run several turns), then a learned
    main agent; both roles give the same records with and without reuse, and nothing stays cached."""
    tasks = list(small_scenario.tasks("stage2/test"))[:2]

    def delegating(requests):
        return ["<tool_call>" + json.dumps({"name": "delegate", "arguments": {"task": r.task.hops[0].question}})
                + "</tool_call>" for r in requests]

    def run(kv: float):
        sub = policy(model, tokenizer, "sub", kv)
        main = policy(model, tokenizer, "main", kv)
        limits = {"max_main_turns": 2, "max_sub_turns": 4}
        records = collect(small_scenario, tasks, 2, {"main": delegating, "sub": sub}, world=small_world, env_kwargs=limits)
        records += collect(small_scenario, tasks, 2, {"main": main, "sub": sub}, world=small_world,
                           env_kwargs={"max_main_turns": 4})
        turns = [(t.extra["completion_ids"], t.extra["logprobs"]) for r in records for traj in (r.main, *r.subs)
                 for t in traj.turns if "completion_ids" in t.extra]
        return turns, main, sub, records

    reused, main, sub, records = run(64)
    fresh, *_ = run(0)
    assert sum(len(s.turns) for r in records for s in r.subs) >= 8  # sub-agents ran several turns
    assert_same(reused, fresh)
    assert main.kv.stats.hits > 0 and sub.kv.stats.hits > 0
    assert not main.kv.entries and not sub.kv.entries  # every agent ended: every cache was released


def test_collect_single_reuses_and_frees(model, tokenizer, small_scenario, small_world):
    tasks = list(small_scenario.tasks("stage2/test"))[:2]

    def run(kv: float):
        single = policy(model, tokenizer, "single", kv)
        records = collect(small_scenario, tasks, 2, {"single": single}, world=small_world, env_kwargs={"max_turns": 4}, env="single")
        return [(t.extra["completion_ids"], t.extra["logprobs"]) for r in records for t in r.main.turns], single

    reused, single = run(64)
    fresh, _ = run(0)
    assert_same(reused, fresh)
    assert single.kv.stats.hits >= 8 and not single.kv.entries


def test_a_small_budget_evicts_and_re_prefills_with_the_same_results(model, tokenizer):
    reusing = policy(model, tokenizer, "sub", 0.05)  # ~52 kB: room for two or three of these chats
    reused = chat_turns(reusing, "sub")
    assert_same(reused, chat_turns(policy(model, tokenizer, "sub", 0), "sub"))
    assert reusing.kv.stats.evictions > 0 and reusing.kv.stats.hits > 0
    assert reusing.kv.nbytes <= reusing.kv.budget_bytes


def test_changed_weights_or_a_different_history_are_never_served_from_the_cache(model, tokenizer):
    import copy

    own = copy.deepcopy(model)
    reusing = policy(own, tokenizer, "main", 64)
    first = PolicyRequest(0, "main_0", "main", "", [SYSTEM, {"role": "user", "content": "question " * 30}], None, [])
    reply = reusing([first])[0]
    assert reusing.kv.entries
    with torch.no_grad():
        next(own.parameters()).mul_(1.5)  # an optimiser step, in place: the kept keys/values are stale
    second = PolicyRequest(0, "main_0", "main", "", first.messages + [
        {"role": "assistant", "content": reply.text}, {"role": "user", "content": "<tool_response>x y</tool_response>"}],
        None, [reply.extra])
    fresh = policy(own, tokenizer, "main", 0)
    fresh.calls = reusing.calls  # call i samples with seed + i: line the two up
    assert_same([(r.extra["completion_ids"], r.extra["logprobs"]) for r in reusing([second])],
                [(r.extra["completion_ids"], r.extra["logprobs"]) for r in fresh([second])])
    assert reusing.kv.stats.invalidations == 1 and reusing.kv.stats.hits == 0
    other = PolicyRequest(0, "main_0", "main", "", [SYSTEM, {"role": "user", "content": "other"}], None, [])
    reusing([other])  # a first turn under a key that holds a cache: its ids are not a prefix
    assert reusing.kv.stats.hits == 0


def test_models_with_sliding_window_layers_do_not_reuse(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, use_sliding_window=True, sliding_window=8,
                         max_window_layers=0)
    model = AutoModelForCausalLM.from_config(config)
    assert policy(model, tokenizer, "main", 64).kv is None
    from mgrpo_algo.policies.kv_cache import supports_reuse

    assert supports_reuse(types.SimpleNamespace(config=object())) is False  # a config the cache cannot map


def _two_turns(reusing: TransformersPolicy) -> tuple[PolicyRequest, PolicyRequest]:
    """A first turn (kept in the cache) and the request of the turn after it."""
    first = PolicyRequest(0, "main_0", "main", "", [SYSTEM, {"role": "user", "content": "question " * 20}], None, [])
    reply = reusing([first])[0]
    second = PolicyRequest(0, "main_0", "main", "", first.messages + [
        {"role": "assistant", "content": reply.text}, {"role": "user", "content": "<tool_response>x y</tool_response>"}],
        None, [reply.extra])
    return first, second


@pytest.mark.parametrize(("lora_rank", "holder"), [(0, "learner"), (4, "learner"), (4, "original")])
def test_an_update_of_any_parameter_invalidates_the_cache(model, tokenizer, lora_rank, holder):
    """Each parameter in turn (the embedding, the last layer's, the final norm, each LoRA adapter matrix)
    moved in place: the next turn is never served from the cache. With LoRA the base is frozen, so only
    adapter parameters ever move; the policy may hold the peft model or the original object that peft
    injected its layers into (a second holder, see lora.py)."""
    import copy

    from mgrpo_algo.core.config import LearnerConfig
    from mgrpo_algo.learning.learner import RoleLearner

    if lora_rank:
        pytest.importorskip("peft")
    own = copy.deepcopy(model)
    learner = RoleLearner("main", own, LearnerConfig(lr=1e-2, lora_rank=lora_rank, lora_alpha=8.0))
    reusing = policy(learner.model if holder == "learner" else own, tokenizer, "main", 64)
    names = [n for n, p in learner.model.named_parameters() if p.requires_grad]
    assert len(names) == (28 if lora_rank else len(list(model.parameters())))  # 2 layers x 7 projections x A, B
    assert not lora_rank or all("lora_" in n for n in names)
    for number, name in enumerate(names):
        _, second = _two_turns(reusing)
        assert reusing.kv.entries and reusing.kv.stats.invalidations == number, name
        with torch.no_grad():
            dict(learner.model.named_parameters())[name].add_(1e-3)
        hits = reusing.kv.stats.hits
        reusing([second])
        assert reusing.kv.stats.invalidations == number + 1 and reusing.kv.stats.hits == hits, name
        reusing.release_all()


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_a_learner_update_invalidates_the_cache_and_the_next_turn_matches_a_fresh_prefill(model, tokenizer,
                                                                                          lora_rank):
    """Through RoleLearner.update (AdamW's in-place step; with LoRA only the adapter moves): the turn after
    an update samples what a policy without a cache samples from the updated weights."""
    import copy
    import random

    from mgrpo_algo.core.config import LearnerConfig
    from mgrpo_algo.core.sequences import TokenSequence
    from mgrpo_algo.learning.learner import RoleLearner

    if lora_rank:
        pytest.importorskip("peft")
    learner = RoleLearner("main", copy.deepcopy(model), LearnerConfig(lr=5e-2, lora_rank=lora_rank, lora_alpha=8.0))
    reusing = policy(learner.model, tokenizer, "main", 64)
    _, second = _two_turns(reusing)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    rng = random.Random(0)
    seqs = [TokenSequence([rng.randrange(len(tokenizer)) for _ in range(20)], [0] * 5 + [1] * 15,
                          advantage=1.0 if i % 2 else -1.0) for i in range(4)]
    learner.update(seqs)
    moved = {n for n, p in learner.model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and (not lora_rank or all("lora_" in n for n in moved))
    fresh = policy(learner.model, tokenizer, "main", 0)
    fresh.calls = reusing.calls  # call i samples with seed + i: line the two up
    got = [(r.extra["completion_ids"], r.extra["logprobs"]) for r in reusing([second])]
    assert reusing.kv.stats.invalidations == 1 and reusing.kv.stats.hits == 0
    assert_same(got, [(r.extra["completion_ids"], r.extra["logprobs"]) for r in fresh([second])])


# -- the manager alone, by hand: the layout of one batch, what is kept, evicted and dropped ------------------


class _Layer:
    def __init__(self, keys, values):
        self.keys, self.values = keys, values


def _cache(batch: int, length: int, layers: int = 2) -> types.SimpleNamespace:
    """What generate returns: per layer [B, H=1, L, D=2] keys / values; key = 100*layer + 10*row + position."""
    out = []
    for layer in range(layers):
        k = torch.tensor([[[[100.0 * layer + 10 * row + pos, 0.0] for pos in range(length)]] for row in range(batch)])
        out.append(_Layer(k, -k))
    return types.SimpleNamespace(layers=out)


def test_manager_layout_store_and_reuse_by_hand():
    from mgrpo_algo.policies.kv_cache import KVCacheManager

    model = torch.nn.Linear(2, 2)
    kv = KVCacheManager(10_000)
    # turn 1: nothing cached; rows left-padded with pad id 0 to the longest prompt
    first = kv.prepare(model, ["a", "b", None], [[5, 6, 7], [8, 9], [4]], pad_id=0)
    assert first.input_ids.tolist() == [[5, 6, 7], [0, 8, 9], [0, 0, 4]]
    assert first.attention_mask.tolist() == [[1, 1, 1], [0, 1, 1], [0, 0, 1]]
    assert (first.cache, first.cached, first.width, first.past, first.keys) == (None, [0, 0, 0], 3, 0, ["a", "b", None])
    assert first.input_ids.dtype == first.attention_mask.dtype == torch.long  # generate's index and mask types
    with pytest.raises(ValueError):  # one key per prompt: a shifted list would serve another agent's cache
        kv.prepare(model, ["a", "b"], [[5, 6, 7]], pad_id=0)
    assert kv.stats.as_dict() == {"hits": 0, "misses": 3, "reused_tokens": 0, "prefilled_tokens": 6, "evictions": 0,
                                  "invalidations": 0}
    # generate produced 3 tokens for each row; the last sampled one was never fed: width + 3 - 1 columns
    kv.store(first, _cache(3, 5), [[5, 6, 7], [8, 9], [4]], [[1, 2, 3], [2], [3, 3, 3]])
    assert list(kv.entries) == ["a", "b"]  # the unkeyed row is not kept
    a, b = kv.entries["a"], kv.entries["b"]
    assert a.ids == [5, 6, 7, 1, 2] and b.ids == [8, 9, 2]  # prompt + completion, cut at the columns fed
    assert a.keys[0][0, 0, :, 0].tolist() == [0, 1, 2, 3, 4] and a.keys[1][0, 0, :, 0].tolist() == [100, 101, 102, 103, 104]
    assert b.keys[0][0, 0, :, 0].tolist() == [11, 12, 13]  # row 1's own columns, past its padding
    assert torch.equal(b.values[1], -b.keys[1]) and b.nbytes == 2 * 2 * 3 * 2 * 4  # layers, k+v, positions, D, fp32
    assert a.nbytes == 2 * 2 * 5 * 2 * 4 and kv.nbytes == a.nbytes + b.nbytes
    # turn 2: row a feeds only its new ids after 5 cached, b after 3; c has no entry
    prompts = [[5, 6, 7, 1, 2, 30, 31], [8, 9, 2, 40], [4, 4]]
    second = kv.prepare(model, ["a", "b", "c"], prompts, pad_id=0)
    assert (second.cached, second.past, second.width) == ([5, 3, 0], 5, 7)
    assert second.input_ids.tolist() == [[5, 6, 7, 1, 2, 30, 31], [0, 0, 8, 9, 2, 0, 40], [0, 0, 0, 0, 0, 4, 4]]
    assert second.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0, 1], [0, 0, 0, 0, 0, 1, 1]]
    k0 = second.cache.layers[0].keys
    assert k0.shape == (3, 1, 5, 2)
    assert k0[:, 0, :, 0].tolist() == [[0, 1, 2, 3, 4], [0, 0, 11, 12, 13], [0, 0, 0, 0, 0]]
    assert second.cache.layers[1].values[1, 0, :, 0].tolist() == [0, 0, -111, -112, -113]
    assert second.cache.layers[1].values.shape == (3, 1, 5, 2)  # [B, heads, past, D], as the keys
    assert kv.entries == {}  # used entries left the manager: the batch holds them
    assert kv.stats.as_dict() == {"hits": 2, "misses": 4, "reused_tokens": 8, "prefilled_tokens": 6 + 2 + 1 + 2,
                                  "evictions": 0, "invalidations": 0}
    # store after a cached batch: a keeps its 5 cached columns, then its 2 new ids and 1 of 2 sampled
    kv.store(second, _cache(3, 8), prompts, [[50, 51], [60], []])
    assert kv.entries["a"].ids == [5, 6, 7, 1, 2, 30, 31, 50]
    assert kv.entries["a"].keys[0][0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert kv.entries["b"].ids == [8, 9, 2, 40, 60]
    assert kv.entries["b"].keys[0][0, 0, :, 0].tolist() == [12, 13, 14, 16, 17]
    assert kv.entries["c"].ids == [4, 4] and kv.entries["c"].keys[0][0, 0, :, 0].tolist() == [25, 26]
    kv.release("b")
    kv.release("nobody")
    assert list(kv.entries) == ["a", "c"]
    kv.clear()
    assert kv.entries == {} and kv.nbytes == 0


def test_manager_refuses_entries_that_are_no_prefix_or_leave_nothing_to_feed():
    from mgrpo_algo.policies.kv_cache import KVCacheManager

    model = torch.nn.Linear(2, 2)
    kv = KVCacheManager(10_000)
    for prompt in ([1, 2, 3], [1, 2], [9, 2, 3, 4]):  # the same ids (nothing new), shorter, or another history
        layout = kv.prepare(model, ["a"], [[1, 2]], pad_id=0)
        kv.store(layout, _cache(1, 3), [[1, 2]], [[3, 4]])
        assert kv.entries["a"].ids == [1, 2, 3]
        again = kv.prepare(model, ["a"], [prompt], pad_id=0)
        assert again.cached == [0] and again.cache is None and again.input_ids.tolist() == [prompt]
        assert "a" not in kv.entries
    assert kv.stats.hits == 0 and kv.stats.invalidations == 0
    with pytest.raises(ValueError, match="budget_bytes must be >= 0"):
        KVCacheManager(-1)


def test_manager_evicts_least_recently_used_and_drops_everything_when_any_weight_moves():
    from mgrpo_algo.policies.kv_cache import KVCacheManager

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    per_entry = 2 * 2 * 3 * 2 * 4  # layers x (keys, values) x 3 positions x D=2 x float32
    kv = KVCacheManager(2 * per_entry)
    for key in ("a", "b", "c"):  # the third one pushes out the oldest
        layout = kv.prepare(model, [key], [[1, 2]], pad_id=0)
        kv.store(layout, _cache(1, 3), [[1, 2]], [[7, 8]])
    assert list(kv.entries) == ["b", "c"] and kv.stats.evictions == 1 and kv.nbytes == 2 * per_entry
    # an entry over the whole budget is not kept (nothing else is evicted for it)
    small = KVCacheManager(per_entry - 1)
    layout = small.prepare(model, ["a"], [[1, 2]], pad_id=0)
    small.store(layout, _cache(1, 3), [[1, 2]], [[7, 8]])
    assert small.entries == {} and small.stats.evictions == 0
    exact = KVCacheManager(per_entry)  # an entry of exactly the budget is kept
    layout = exact.prepare(model, ["a"], [[1, 2]], pad_id=0)
    exact.store(layout, _cache(1, 3), [[1, 2]], [[7, 8]])
    assert list(exact.entries) == ["a"]
    # one batch of three keyed rows (after an unkeyed one) into room for one: "a" and the two older rows go
    layout = exact.prepare(model, [None, "x", "y", "z"], [[1, 2]] * 4, pad_id=0)
    exact.store(layout, _cache(4, 3), [[1, 2]] * 4, [[7, 8]] * 4)
    assert list(exact.entries) == ["z"] and exact.stats.evictions == 3 and exact.nbytes == per_entry
    # a row over the budget is skipped, not the end of the batch: the row after it (exactly the budget) is kept
    fresh = KVCacheManager(per_entry)
    both = fresh.prepare(model, ["big", "fits"], [[1, 2, 3], [1, 2]], pad_id=0)
    fresh.store(both, _cache(2, 5), [[1, 2, 3], [1, 2]], [[7, 8], [7]])  # 3 + 2 and 2 + 1 positions
    assert list(fresh.entries) == ["fits"] and fresh.entries["fits"].ids == [1, 2, 7] and fresh.nbytes == per_entry
    exact.store(layout, None, [[1, 2]] * 4, [[7, 8]] * 4)  # generate returned no cache: nothing to keep
    assert list(exact.entries) == ["z"]
    nothing = KVCacheManager(0)
    layout = nothing.prepare(model, ["a"], [[1, 2]], pad_id=0)
    nothing.store(layout, _cache(1, 3), [[1, 2]], [[7, 8]])
    assert nothing.entries == {}
    # any parameter moved in place (here the last one): every entry goes, counted once
    with torch.no_grad():
        list(model.parameters())[-1].add_(1.0)
    layout = kv.prepare(model, ["c"], [[1, 2, 7, 9]], pad_id=0)
    assert layout.cached == [0] and kv.entries == {} and kv.stats.invalidations == 1
    kv.prepare(model, ["c"], [[1, 2, 7, 9]], pad_id=0)  # unchanged since: nothing more to invalidate
    assert kv.stats.invalidations == 1
    layout = kv.prepare(model, ["d"], [[1, 2]], pad_id=0)
    kv.store(layout, _cache(1, 3), [[1, 2]], [[7, 8]])
    with torch.no_grad():
        list(model.parameters())[0].mul_(2.0)  # the first parameter this time
    assert kv.prepare(model, ["d"], [[1, 2, 7, 9]], pad_id=0).cached == [0] and kv.stats.invalidations == 2
