"""The sub side scored from the store's statistics equals the env's rewards and the records' scoring.

The sub worker never sees the env's R_S: it computes it from the main statistics in the store and what
it knows of its own trajectories, and it keys step credit by the chats its requests carried. On real
episodes (the scripted oracle through the env and tools) every one of those equals what the env paid
and what scoring the records gives.
"""

from __future__ import annotations

import numpy as np
import pytest
from scoring_reference import score_batch

from mgrpo_algo.core.scoring import anchor_state, score_sub_side, sub_facts, turn_states
from mgrpo_env.rewards import PAPER_SUB_WEIGHTS, paid_sub_reward
from mgrpo_env.rollout import collect
from mgrpo_env.scripted import OraclePolicy


class _Recording:
    """The oracle, recording the chat each request carried (what a role worker keys its states by);
    as sub-agent it reports nothing useful in odd episodes, so returns differ from shared states."""

    def __init__(self, policy, seen, role):
        self.policy, self.seen, self.role = policy, seen, role

    def __call__(self, requests):
        for r in requests:
            self.seen.setdefault((r.episode, r.agent), []).append(anchor_state(r.messages))
        actions = list(self.policy(requests))
        if self.role == "sub":
            actions = ["<result>unknown</result>" if r.episode % 2 else a for r, a in zip(requests, actions, strict=True)]
        return actions


@pytest.fixture(scope="module")
def episodes(small_scenario, small_world):
    seen: dict = {}
    tasks = list(small_scenario.tasks("stage2/test"))[:4]
    policies = {role: _Recording(OraclePolicy(small_scenario, role), seen, role) for role in ("main", "sub")}
    records = collect(small_scenario, tasks, 2, policies, world=small_world, env_kwargs={"max_main_turns": 8})
    assert sum(r.num_subs for r in records) > 0
    return records, seen


def test_r_s_from_the_statistics_is_what_the_env_paid(episodes):
    records, _ = episodes
    for record, row in zip(records, sub_facts(records), strict=True):
        correct = float(record.correct)  # what the main worker publishes per rollout
        assert [paid_sub_reward(f.format_ok, correct, f.expert, PAPER_SUB_WEIGHTS) for f in row] == \
            [s.reward for s in record.subs]


def test_worker_states_equal_the_records_turn_states(episodes):
    records, seen = episodes
    for i, record in enumerate(records):
        for trajectory in record.subs:
            assert seen[(i, trajectory.agent)] == turn_states(trajectory)


def test_sub_side_from_the_workers_inputs_equals_scoring_the_records(episodes):
    records, seen = episodes
    k, d = 2, 3
    reference = score_batch(records, k, d, strategy="duplicate", rng=np.random.default_rng(5), step_weight=0.5)
    rewards = [[paid_sub_reward(f.format_ok, float(r.correct), f.expert, PAPER_SUB_WEIGHTS) for f in row]
               for r, row in zip(records, sub_facts(records), strict=True)]
    states = {(i, j): seen[(i, s.agent)] for i, r in enumerate(records) for j, s in enumerate(r.subs)}
    slots, metrics = score_sub_side(sub_facts(records), rewards, k, d, strategy="duplicate",
                                    rng=np.random.default_rng(5), step_weight=0.5, states=states)
    assert slots == reference.sub
    assert any(s.turn_advantages and len(set(s.turn_advantages)) > 1 for s in slots)  # step credit did something
    assert metrics == {key: v for key, v in reference.metrics.items() if key.startswith("sub/") or
                       (key.startswith("align/") and key not in ("align/d", "align/d_k_mean"))}
