"""Modes are one table (roles, trained roles, env); both envs take a RewardConfig; one collect loop."""

from __future__ import annotations

import pytest

from mgrpo_algo.core.config import MODE_TABLE, TRAIN_MODES
from mgrpo_env.core import RewardConfig
from mgrpo_env.policies import OraclePolicy
from mgrpo_env.rollout import EPISODES, collect


def test_every_mode_is_one_entry_of_the_table():
    assert tuple(MODE_TABLE) == TRAIN_MODES
    for name, mode in MODE_TABLE.items():
        assert mode.env in EPISODES, name
        assert set(mode.trained) <= set(mode.roles) == set(EPISODES[mode.env].roles), name
    assert MODE_TABLE["single-agent"].single and not MODE_TABLE["frozen-sub"].single


def test_the_single_agent_env_pays_with_its_reward_config(small_scenario, small_world):
    tasks = list(small_scenario.tasks("stage2/test"))[:4]
    rewards = RewardConfig(main_weights=(0.5, 0.25))
    records = collect(small_scenario, tasks, 1, {"single": OraclePolicy(small_scenario, "single")}, world=small_world,
                      env_kwargs={"max_turns": 24, "rewards": rewards}, env="single")
    assert any(r.correct for r in records)
    for r in records:
        assert r.rewards["single_0"] == pytest.approx((0.5 + 0.25 * r.correct) if r.main.format_ok else 0.0)


def test_one_collect_loop_checks_the_roles_of_its_env(small_scenario, small_world):
    tasks = list(small_scenario.tasks("stage2/test"))[:1]
    with pytest.raises(ValueError, match="needs the roles single; missing"):
        collect(small_scenario, tasks, 1, {"main": None, "sub": None}, world=small_world, env="single")
    with pytest.raises(ValueError, match="needs the roles main and sub; missing"):
        collect(small_scenario, tasks, 1, {"single": None}, world=small_world)
