"""Batched collection with the oracle and random policies; episode records round-trip through JSONL."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from mgrpo_env import align, read_jsonl, write_jsonl
from mgrpo_env.rollout import CollectStats, PolicyResponse, collect
from mgrpo_env.scripted import OraclePolicy, RandomPolicy


def test_oracle_solves_stage2_through_the_protocol(small_scenario, small_world):
    tasks = list(small_scenario.tasks("stage2/test"))[:24]
    policies = {"main": OraclePolicy(small_scenario, "main"), "sub": OraclePolicy(small_scenario, "sub")}
    stats = CollectStats()
    records = collect(small_scenario, tasks, 2, policies, world=small_world, stats=stats, env_kwargs={"max_main_turns": 8})
    assert len(records) == 48
    assert [r.task["id"] for r in records] == [t.id for t in tasks for _ in range(2)]  # task-major order
    accuracy = sum(r.correct for r in records) / len(records)
    assert accuracy >= 0.95, [(r.task["question"], r.final_answer, r.task["answer"]) for r in records if not r.correct]
    for record, task in zip(records, [t for t in tasks for _ in range(2)], strict=True):
        assert record.num_subs == len(task.hops)  # one delegation per hop
        if record.correct:
            assert record.rewards["main_0"] == pytest.approx(1.0)
            assert all(s.format_ok and s.expert == 1.0 for s in record.subs)
    # one batched policy call per role per round, never one per episode
    assert stats.policy_calls < stats.env_steps / 4
    assert stats.by_role_requests["sub"] > stats.by_role_requests["main"]


def test_random_policy_never_crashes_and_d_k_varies(small_scenario, small_world):
    tasks = list(small_scenario.tasks("stage2/test"))[:6]
    policies = {"main": RandomPolicy("main", seed=1), "sub": RandomPolicy("sub", seed=2)}
    records = collect(small_scenario, tasks, 4, policies, world=small_world, seed=5)
    assert len(records) == 24
    counts = [r.num_subs for r in records]
    assert len(set(counts)) > 1
    d = align.choose_d(counts)
    plan = align.plan(counts, d, rng=np.random.default_rng(0))
    assert all(len(slots) == d for slots in plan)
    kinds = Counter(t.kind for r in records for t in r.main.turns)
    assert kinds["error"] > 0 and kinds["tool_call"] > 0  # malformed and well-formed actions both met


def test_policy_extras_are_kept_on_the_turn(small_scenario, small_world, tmp_path):
    tasks = list(small_scenario.tasks("stage1/test"))[:2]

    def main(requests):
        return [PolicyResponse("<answer>x</answer>", {"token_ids": [1, 2, 3], "logprobs": [-0.1, -0.2, -0.3]}) for _ in requests]

    records = collect(small_scenario, tasks, 2, {"main": main, "sub": RandomPolicy("sub")}, world=small_world)
    assert records[0].main.turns[0].extra == {"token_ids": [1, 2, 3], "logprobs": [-0.1, -0.2, -0.3]}
    path = tmp_path / "episodes.jsonl"
    assert write_jsonl(path, records) == 4
    back = list(read_jsonl(path))
    assert [b.to_dict() for b in back] == [r.to_dict() for r in records]


def test_jsonl_round_trip_with_tool_calls(small_scenario, small_world, tmp_path):
    tasks = list(small_scenario.tasks("stage2/test"))[:3]
    policies = {"main": OraclePolicy(small_scenario, "main"), "sub": OraclePolicy(small_scenario, "sub")}
    records = collect(small_scenario, tasks, 1, policies, world=small_world)
    path = tmp_path / "e.jsonl"
    write_jsonl(path, records)
    back = list(read_jsonl(path))
    assert back[0].subs[0].tool_calls[0].tool == "search"
    assert [b.to_dict() for b in back] == [r.to_dict() for r in records]
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(ValueError, match=r"e.jsonl:4"):
        list(read_jsonl(path))


def test_bad_policy_output_count_is_a_clear_error(small_scenario, small_world):
    tasks = list(small_scenario.tasks("stage1/test"))[:2]
    with pytest.raises(ValueError, match="returned 0 responses for 2 requests"):
        collect(small_scenario, tasks, 1, {"main": lambda r: [], "sub": RandomPolicy("sub")}, world=small_world)


def test_history_carries_the_policy_extras_of_earlier_turns(small_scenario, small_world):
    tasks = list(small_scenario.tasks("stage1/test"))[:1]
    seen = []

    def main(requests):
        out = []
        for r in requests:
            seen.append([h.get("turn") for h in r.history])
            text = "<answer>x</answer>" if len(r.history) == 2 else "no tags"
            out.append(PolicyResponse(text, {"turn": len(r.history)}))
        return out

    collect(small_scenario, tasks, 1, {"main": main, "sub": RandomPolicy("sub")}, world=small_world)
    assert seen == [[], [0], [0, 1]]


def test_collect_single_agent(small_scenario, small_world):
    from mgrpo_env.rollout import collect

    tasks = list(small_scenario.tasks("stage1/test"))[:3]

    def policy(requests):
        assert all(r.role == "single" and r.agent == "single_0" for r in requests)
        return [PolicyResponse(f"<answer>{r.task.answer}</answer>", {"n": len(r.history)}) for r in requests]

    records = collect(small_scenario, tasks, 2, {"single": policy}, world=small_world, env="single")
    assert [r.task["id"] for r in records] == [t.id for t in tasks for _ in range(2)]
    assert all(r.correct and r.rewards == {"single_0": pytest.approx(1.0)} for r in records)
    assert records[0].main.turns[0].extra == {"n": 0}


def test_single_agent_oracle_solves_stage2(small_scenario, small_world):
    from mgrpo_env.rollout import collect

    tasks = list(small_scenario.tasks("stage2/test"))[:20]
    records = collect(small_scenario, tasks, 1, {"single": OraclePolicy(small_scenario, "single")}, world=small_world,
                      env_kwargs={"max_turns": 24}, env="single")
    accuracy = sum(r.correct for r in records) / len(records)
    assert accuracy >= 0.95
    assert all(r.main.format_ok for r in records if r.correct)
