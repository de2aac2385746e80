"""The scoring functions' edges, by hand: step advantages at their boundaries, the anchor state's parts,
step credit kept within its query, step credit off by default, and a trajectory without a chat. Written
for the survivors a mutation run of issue 33's scoring left (benchmarks/results/mutation.md)."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from mgrpo_algo.core.advantages import step_advantages
from mgrpo_algo.core.scoring import CalledFact, anchor_state, score_main_side, score_sub_side, turn_states
from mgrpo_env.episode import AgentTrajectory, EpisodeRecord, Turn

R2 = math.sqrt(2.0)


def test_step_advantages_at_their_boundaries():
    with pytest.raises(ValueError, match=r"^2 anchors for 3 returns$"):
        step_advantages(["a", "b"], [1.0, 0.0, 1.0])
    # a lone state, or one without spread, before another group: the later group still gets its credit
    assert step_advantages(["lone", "s", "s"], [1.0, 1.0, 0.0]) == [0.0, 1.0, -1.0]
    assert step_advantages(["flat", "flat", "s", "s"], [1.0, 1.0, 0.0, 1.0]) == [0.0, 0.0, -1.0, 1.0]
    # a spread exactly at eps is credited (only a std below eps gives 0)
    assert step_advantages(["s", "s"], [0.0, 1.0], eps=0.5) == [-1.0, 1.0]
    assert step_advantages(["s", "s"], [0.0, 1.0], eps=0.5 + 1e-12) == [0.0, 0.0]
    # returns of any float type are standardised in float64: (x - mean) / std of float32 inputs, exactly
    low, high = np.float32(0.1), np.float32(0.7)
    mean, std = (float(low) + float(high)) / 2, (float(high) - float(low)) / 2
    assert step_advantages(["s", "s"], [low, high]) == [(float(low) - mean) / std, (float(high) - mean) / std]


def test_the_anchor_state_reads_each_messages_role_and_content():
    assert anchor_state([{"role": "user", "content": "x"}]) != anchor_state([{"role": "assistant", "content": "x"}])
    assert anchor_state([{"role": "user", "content": "x"}]) != anchor_state([{"role": "user", "content": "y"}])
    assert anchor_state([{"role": "user", "content": "x"}]) == anchor_state([{"content": "x", "role": "user"}])


def test_trajectories_whose_chat_does_not_line_up_share_no_state():
    turns = [Turn(action="a", kind="tool_call"), Turn(action="b", kind="answer")]
    no_chat = types.SimpleNamespace(turns=turns)  # no messages at all: not a crash, keys of its own
    other = types.SimpleNamespace(turns=turns, messages=[{"role": "system", "content": "s"}])
    a, b = turn_states(no_chat), turn_states(other)
    assert len(a) == len(b) == 2 and len(set(a)) == 2 and not set(a) & set(b)


def _main(report: str, answer: str) -> AgentTrajectory:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Q"},
                {"role": "assistant", "content": "d1"}, {"role": "user", "content": report},
                {"role": "assistant", "content": answer}]
    turns = [Turn(action="d1", kind="tool_call"), Turn(action=answer, kind="answer")]
    return AgentTrajectory(agent="main_0", role="main", messages=messages, turns=turns, format_ok=True)


def _records(rewards: list[float]) -> list[EpisodeRecord]:
    """One query of three rollouts asking the same question: two read report X, one report Y."""
    reports = ["report X", "report X", "report Y"]
    return [EpisodeRecord(episode_id=f"e{i}", task={"id": "q"}, main=_main(reports[i], f"A{i}"), subs=[],
                          correct=bool(r), rewards={"main_0": r}, components={"main_0": {"format_ok": True}})
            for i, r in enumerate(rewards)]


def test_main_step_credit_stays_within_its_query_and_is_off_by_default():
    """Two queries that ask the same question (the same anchor states): each query's step credit is its
    own rollouts', as if it were scored alone."""
    first, second = _records([1.0, 0.0, 0.0]), _records([0.0, 1.0, 1.0])
    both, _ = score_main_side(first + second, 3, step_weight=0.5)
    alone = [score_main_side(q, 3, step_weight=0.5)[0] for q in (first, second)]
    assert [s.turn_advantages for s in both] == [s.turn_advantages for q in alone for s in q]
    # the first query by hand (tests/test_step_credit.py): A_M sqrt2, -1/sqrt2, -1/sqrt2; turn 1's X pair +-1
    assert both[0].turn_advantages == pytest.approx((R2 * 1.5, R2 + 0.5))
    plain, _ = score_main_side(first + second, 3)
    assert all(s.turn_advantages is None for s in plain)


def test_sub_step_credit_stays_within_its_query_and_is_off_by_default():
    """K = 2, one sub-agent per rollout, two queries whose sub-agents read the same states: the second
    query's agree (no spread, no credit), which the first query's rollouts would change if pooled in."""
    facts = [[CalledFact(f"sub_{i}", True, 1.0)] for i in range(4)]
    rewards = [[1.0], [0.0], [1.0], [1.0]]
    states = {(i, 0): ["shared", f"own{i}"] for i in range(4)}

    def score(f, r, s, **kwargs):
        return score_sub_side(f, r, 2, 1, strategy="duplicate", rng=np.random.default_rng(0), states=s, **kwargs)[0]

    both = score(facts, rewards, states, step_weight=1.0)
    shifted = {(i - 2, j): v for (i, j), v in states.items() if i >= 2}
    alone = score(facts[:2], rewards[:2], states, step_weight=1.0) + score(facts[2:], rewards[2:], shifted, step_weight=1.0)
    assert [s.turn_advantages for s in both] == [s.turn_advantages for s in alone]
    # query 0 by hand: A_S = +1, -1; the shared first state's step advantage is the same +1, -1
    assert [s.turn_advantages for s in both] == [(2.0, 1.0), (-2.0, -1.0), (0.0, 0.0), (0.0, 0.0)]
    assert all(s.turn_advantages is None for s in score(facts, rewards, states))


def test_a_called_sides_metrics_count_where_its_expert_scores_came_from():
    """``<role>/expert_disabled`` and, under ``expert_reference: subtask``, ``<role>/expert_fell_back``: shares of
    the side's agents, by hand."""
    from mgrpo_env.core import SUBTASK_FELL_BACK

    def side(sources):
        facts = [[CalledFact(f"sub_{i}", True, 0.5, s, 1)] for i, s in enumerate(sources)]
        return score_sub_side(facts, [[0.5]] * len(facts), len(facts), 1, strategy="duplicate",
                              rng=np.random.default_rng(0))[1]

    metrics = side(["subtask", SUBTASK_FELL_BACK, SUBTASK_FELL_BACK, "none"])
    assert metrics["sub/expert_fell_back"] == 0.5 and metrics["sub/expert_disabled"] == 0.25
    metrics = side(["hops", "hops", "none", "none"])  # the hop reference: nothing to fall back from
    assert "sub/expert_fell_back" not in metrics and metrics["sub/expert_disabled"] == 0.5


def test_a_called_agents_facts_carry_its_reward_inputs_and_its_scoring_its_terms():
    from mgrpo_algo.core.scoring import CalledScoring, sub_facts

    sub = AgentTrajectory(agent="sub_0", role="sub", final="r", format_ok=True, expert=0.5,
                          turns=[Turn(action="x", kind="result")])
    record = EpisodeRecord("e", {"id": "t"}, main=AgentTrajectory(agent="main_0", role="main"), subs=[sub],
                           components={"sub_0": {"format_ok": True, "main_correct": True, "expert": 0.5, "turns": 1,
                                                 "report_chars": 1, "reward": 0.9, "advantage": 0.1}})
    [[fact]] = sub_facts([record])
    # its pay, its advantage and the main agent's correctness (read from the main statistics) are no inputs
    assert fact.inputs == {"format_ok": True, "expert": 0.5, "turns": 1, "report_chars": 1}
    # terms read back from worker.json come as lists: the scoring holds them as (name, float) pairs
    scoring = CalledScoring(1, 1, "duplicate", 0.0, (0.1, 0.4, 0.5), terms=[["brevity", 1]])
    assert scoring.terms == (("brevity", 1.0),)
