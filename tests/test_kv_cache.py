"""KV reuse across turns in TransformersPolicy: the same sampled ids and log-probs (within 1e-5) as a
full re-prefill under a fixed seed, for the main agent, sub-agents and the single agent; caches freed
when agents end, kept under the budget, dropped when the weights change."""

from __future__ import annotations

import json
import math

import pytest
import torch

from mgrpo_algo.policies.hf_policy import TransformersPolicy
from mgrpo_algo.policies.models import build_tiny_model
from mgrpo_env.rollout import PolicyRequest, collect

SYSTEM = {"role": "system", "content": "You are a research agent."}


@pytest.fixture(scope="module")
def model(tokenizer, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("model")
    build_tiny_model(tokenizer, path, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=0)
    return AutoModelForCausalLM.from_pretrained(path)


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
