"""Batch scoring (mgrpo_algo.core.scoring) on hand-built records: every number below is computed by hand.

The batch: B = 2 queries, K = 3 rollouts each, d = 2 sub slots per rollout.

    query 0:  R_M = 1.0, 0.1, 0.1       subs R_S: [1.0, 0.5], [], [0.2]
    query 1:  R_M = 0.0, 1.0, 0.0       subs R_S: [0.0], [0.9, 0.4], []

A_M, query 0: mean 0.4, deviations .6 -.3 -.3, variance .18  -> sqrt 2, -1/sqrt 2, -1/sqrt 2.
A_M, query 1: mean 1/3, deviations -1/3 2/3 -1/3, variance 2/9 -> -1/sqrt 2, sqrt 2, -1/sqrt 2.
A_S, "duplicate" (a single sub fills both slots): query 0 pools 1.0, 0.5, 0.2, 0.2 (rollout 1 masked):
mean .475, variance .106875; query 1 pools 0.0, 0.0, 0.9, 0.4 (rollout 2 masked): mean .325,
variance .136875. Pooling over the whole batch instead would use mean .4 for both.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scoring_reference import score_batch

from mgrpo_algo.core.scoring import (
    COUNT_WINDOW,
    RolloutKey,
    alignment_width,
    annotate_main,
    annotate_sub,
    rollout_keys,
    score_main,
    score_sub,
)
from mgrpo_env.episode import AgentTrajectory, EpisodeRecord

R2 = math.sqrt(2.0)
MAIN_R = [1.0, 0.1, 0.1, 0.0, 1.0, 0.0]
SUB_R = [[1.0, 0.5], [], [0.2], [0.0], [0.9, 0.4], []]
EXPERT = [[1.0, 0.0], [], [0.5], [None], [1.0, None]]
A_MAIN = [R2, -1 / R2, -1 / R2, -1 / R2, R2, -1 / R2]
_S0, _S1 = math.sqrt(0.106875), math.sqrt(0.136875)
A_SUB = {  # (index, slot) -> A_S
    (0, 0): (1.0 - 0.475) / _S0, (0, 1): (0.5 - 0.475) / _S0, (2, 0): (0.2 - 0.475) / _S0, (2, 1): (0.2 - 0.475) / _S0,
    (3, 0): (0.0 - 0.325) / _S1, (3, 1): (0.0 - 0.325) / _S1, (4, 0): (0.9 - 0.325) / _S1, (4, 1): (0.4 - 0.325) / _S1,
}


def _records(single: bool = False) -> list[EpisodeRecord]:
    records = []
    correct = [True, False, False, False, True, False]
    main_ok = [True, True, True, False, True, True]
    sub_ok = {(3, 0): False}
    for i, r in enumerate(MAIN_R):
        agent = "single_0" if single else "main_0"
        subs = [] if single else [
            AgentTrajectory(agent=f"sub_{j}", role="sub", format_ok=sub_ok.get((i, j), True),
                            expert=(EXPERT[i][j] if i < len(EXPERT) else None), reward=value)
            for j, value in enumerate(SUB_R[i])
        ]
        records.append(EpisodeRecord(
            episode_id=f"e{i}", task={"id": i // 3}, main=AgentTrajectory(agent=agent, role="main", format_ok=main_ok[i]),
            subs=subs, correct=correct[i], rewards={agent: r, **{s.agent: s.reward for s in subs}},
        ))
    return records


def test_rollout_keys():
    assert rollout_keys(4, 2) == [RolloutKey(0, 0, 0), RolloutKey(1, 0, 1), RolloutKey(2, 1, 0), RolloutKey(3, 1, 1)]
    assert rollout_keys(2, 1) == [RolloutKey(0, 0, 0), RolloutKey(1, 1, 0)]  # K = 1 is allowed
    assert rollout_keys(0, 3) == []
    with pytest.raises(ValueError, match="^5 rollouts is not a multiple of K=2$"):
        rollout_keys(5, 2)
    with pytest.raises(ValueError, match="not a multiple of K=0"):
        rollout_keys(4, 0)


def test_score_main_per_query():
    keys, adv, stats = score_main(MAIN_R, 3)
    assert keys == rollout_keys(6, 3)
    assert adv == pytest.approx(A_MAIN, abs=1e-6)
    # group stats: mean of all rewards, mean within-query std (sqrt .18 and sqrt 2/9)
    assert stats["mean"] == pytest.approx(2.2 / 6)
    assert stats["std"] == pytest.approx((math.sqrt(0.18) + math.sqrt(2 / 9)) / 2)
    assert stats["zero_std_frac"] == 0.0 and stats["num_groups"] == 2.0
    # per query, not pooled over the batch: two queries with different scales both get +-1
    _, adv2, stats2 = score_main([0.0, 1.0, 0.1, 0.2], 2)
    assert adv2 == pytest.approx([-1.0, 1.0, -1.0, 1.0], abs=1e-6)
    _, adv3, stats3 = score_main([0.5, 0.5, 0.0, 1.0], 2)
    assert adv3 == pytest.approx([0.0, 0.0, -1.0, 1.0], abs=1e-6) and stats3["zero_std_frac"] == 0.5


def test_score_sub_pools_per_query_with_alignment_counts():
    slots, adv, stats = score_sub(SUB_R, 3, 2, strategy="duplicate", rng=np.random.default_rng(0))
    assert [(key.index, s, sub, value) for key, s, sub, value in slots] == [
        (0, 0, 0, 1.0), (0, 1, 1, 0.5), (2, 0, 0, 0.2), (2, 1, 0, 0.2),
        (3, 0, 0, 0.0), (3, 1, 0, 0.0), (4, 0, 0, 0.9), (4, 1, 1, 0.4),
    ]
    assert all(key == rollout_keys(6, 3)[key.index] for key, *_ in slots)
    assert adv == pytest.approx([A_SUB[key.index, s] for key, s, _, _ in slots], abs=1e-6)
    # counts summed over both queries
    assert stats == {"reward_mean": pytest.approx(3.2 / 8), "num_zero": 2.0, "num_duplicated_slots": 2.0,
                     "num_dropped": 0.0, "num_masked_slots": 4.0}


def test_score_sub_strategy_and_drops():
    # "mask" leaves a single sub-agent's second slot empty instead of duplicating it
    slots, adv, stats = score_sub([[1.0], [0.0, 0.5]], 2, 2, strategy="mask", rng=np.random.default_rng(0))
    assert [(key.index, s, value) for key, s, _, value in slots] == [(0, 0, 1.0), (1, 0, 0.0), (1, 1, 0.5)]
    assert stats["num_masked_slots"] == 1.0 and stats["num_duplicated_slots"] == 0.0
    # mean .5, variance (.25 + .25 + 0) / 3
    assert adv == pytest.approx([0.5 / math.sqrt(1 / 6), -0.5 / math.sqrt(1 / 6), 0.0], abs=1e-6)
    # three sub-agents for two slots in each of two queries: one dropped in each
    _, _, stats = score_sub([[1.0, 1.0, 1.0], [0.0], [1.0, 1.0, 1.0], [0.0]], 2, 2, strategy="duplicate",
                            rng=np.random.default_rng(0))
    assert stats["num_dropped"] == 2.0 and stats["num_duplicated_slots"] == 2.0


def test_score_sub_without_any_sub_agent():
    slots, adv, stats = score_sub([[], []], 2, 3, strategy="duplicate", rng=np.random.default_rng(0))
    assert slots == [] and adv == []
    assert stats["reward_mean"] == 0.0 and stats["num_zero"] == 2.0 and stats["num_masked_slots"] == 6.0


def test_score_batch_by_hand():
    records = _records()
    records[0].components = {"main_0": {"expert_source": "none"}, "sub_0": {"expert_source": "gold"},
                             "sub_1": {"expert_source": "none"}}
    batch = score_batch(records, 3, 2, strategy="duplicate", rng=np.random.default_rng(0))
    assert batch.d == 2
    assert [m.key for m in batch.main] == rollout_keys(6, 3)
    assert [m.agent for m in batch.main] == ["main_0"] * 6
    assert [m.reward for m in batch.main] == MAIN_R
    assert [m.advantage for m in batch.main] == pytest.approx(A_MAIN, abs=1e-6)
    assert [m.correct for m in batch.main] == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert [m.format_ok for m in batch.main] == [True, True, True, False, True, True]
    assert all(type(m.correct) is float and type(m.format_ok) is bool for m in batch.main)
    assert [(s.key.index, s.slot, s.sub, s.agent, s.reward) for s in batch.sub] == [
        (0, 0, 0, "sub_0", 1.0), (0, 1, 1, "sub_1", 0.5), (2, 0, 0, "sub_0", 0.2), (2, 1, 0, "sub_0", 0.2),
        (3, 0, 0, "sub_0", 0.0), (3, 1, 0, "sub_0", 0.0), (4, 0, 0, "sub_0", 0.9), (4, 1, 1, "sub_1", 0.4),
    ]
    assert [s.advantage for s in batch.sub] == pytest.approx([A_SUB[s.key.index, s.slot] for s in batch.sub], abs=1e-6)
    assert batch.metrics == pytest.approx({
        "main/reward_mean": 2.2 / 6, "main/accuracy": 2 / 6, "main/format_ok": 5 / 6, "main/zero_std_groups": 0.0,
        "sub/reward_mean": 0.4,  # over the 8 slots (a duplicate counts twice)
        "sub/expert_mean": 2.5 / 6,  # over the 6 sub-agents, a missing score counts 0
        "sub/format_ok": 5 / 6,
        "main/penalised_turns": 0.0, "sub/penalised_turns": 0.0,  # no turns recorded here (tests/test_turn_credit.py)
        "align/d": 2.0, "align/d_k_mean": 1.0, "align/num_zero": 2.0, "align/num_duplicated_slots": 2.0,
        "align/num_dropped": 0.0, "align/num_masked_slots": 4.0,
        "sub/expert_disabled": 0.5,  # sub-agents' sources only: "gold", "none"
    })


def test_score_batch_single_and_no_subs():
    batch = score_batch(_records(single=True), 3, 0, strategy="duplicate", rng=np.random.default_rng(0), single=True)
    assert batch.sub == [] and batch.d == 0
    assert [m.agent for m in batch.main] == ["single_0"] * 6
    assert [m.advantage for m in batch.main] == pytest.approx(A_MAIN, abs=1e-6)
    assert set(batch.metrics) == {"single/reward_mean", "single/accuracy", "single/format_ok", "single/zero_std_groups",
                                  "single/penalised_turns"}
    assert batch.metrics["single/accuracy"] == pytest.approx(2 / 6)
    # a hierarchy batch without any delegation: sub metrics are 0, never NaN, and no expert_disabled
    records = _records()
    for r in records:
        r.subs = []
    batch = score_batch(records, 3, 2, strategy="duplicate", rng=np.random.default_rng(0))
    assert batch.sub == []
    assert batch.metrics["sub/expert_mean"] == 0.0 and batch.metrics["sub/format_ok"] == 0.0
    assert batch.metrics["sub/reward_mean"] == 0.0 and "sub/expert_disabled" not in batch.metrics


def test_annotate_counts_aligned_slots():
    records = _records()
    batch = score_batch(records, 3, 2, strategy="duplicate", rng=np.random.default_rng(0))
    records[4].components["sub_0"] = {"aligned_slots": 5}  # annotate adds to what is there
    annotate_main(records, batch.main)
    annotate_sub(records, [(s.key.index, s.agent, s.advantage) for s in batch.sub])  # as the viewer joins them
    assert records[0].components["main_0"]["advantage"] == pytest.approx(R2, abs=1e-6)
    assert records[0].components["sub_0"] == {"advantage": pytest.approx(A_SUB[0, 0], abs=1e-6), "aligned_slots": 1}
    assert records[2].components["sub_0"] == {"advantage": pytest.approx(A_SUB[2, 1], abs=1e-6), "aligned_slots": 2}
    assert records[4].components["sub_0"]["aligned_slots"] == 6
    assert "sub_0" not in records[1].components and records[1].components["main_0"]["advantage"] < 0


def test_alignment_width_window():
    assert alignment_width([1, 2, 3], 4, 0.99) == 4  # align_d set: used as is
    assert alignment_width([0, 1, 1, 2, 8], 0, 0.8) == 2
    # 200 old rollouts with 9 sub-agents fall out of the window of the last COUNT_WINDOW counts
    counts = [9] * 200 + [1] * COUNT_WINDOW
    assert alignment_width(counts, 0, 0.99) == 1
    assert alignment_width(counts[:-101], 0, 0.99) == 9  # 101 old counts left in the window: P(<= 1) < .99
