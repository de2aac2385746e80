"""The single-agent Gymnasium env: check_env, the flow, rewards by hand, truncation."""

from __future__ import annotations

import json

import pytest
from gymnasium.utils.env_checker import check_env

import mgrpo_env


def call(name: str, **arguments) -> str:
    return f"<think>step</think><tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture()
def single(small_scenario, small_world):
    env = mgrpo_env.single_agent_env(scenario=small_scenario, split="stage1/test", world=small_world, seed=0)
    yield env
    env.close()


def test_gymnasium_check_env(single):
    check_env(single, skip_render_check=True)


def test_search_visit_answer(single, small_scenario):
    task = next(iter(small_scenario.tasks("stage1/test")))
    obs, info = single.reset(seed=3, options={"task": task})
    assert obs["text"] == task.question and info["messages"][0]["role"] == "system"
    obs, reward, term, trunc, info = single.step(call("search", queries=[task.hops[0].entity]))
    assert obs["text"].startswith("<tool_response>") and reward == 0 and not term and not trunc
    obs, reward, term, trunc, info = single.step("<answer>" + task.answer + "</answer>")
    assert term and not trunc
    assert reward == pytest.approx(1.0)  # 0.1 * format + 0.9 * correct
    assert info["reward_components"] == {"format_ok": True, "correct": True, "score": 1.0, "turns": 2,
                                         "format_errors": 0, "delegations": 0, "reward": pytest.approx(1.0)}
    record = single.record
    assert record.correct and record.main.tool_calls[0].tool == "search"


def test_malformed_then_wrong(single):
    single.reset(seed=0)
    obs, reward, *_ = single.step("<tool_call>{not json</tool_call>")
    assert "Error (bad_json)" in obs["text"] and reward == 0
    obs, reward, term, trunc, info = single.step("<answer>certainly wrong</answer>")
    assert term and reward == 0.0 and info["reward_components"]["format_ok"] is False


def test_truncation(small_scenario, small_world):
    env = mgrpo_env.single_agent_env(scenario=small_scenario, split="stage1/test", world=small_world, max_turns=2)
    env.reset(seed=0)
    assert env.step("nothing")[2:4] == (False, False)
    _, reward, term, trunc, info = env.step("still nothing")
    assert trunc and not term and reward == 0.0 and env.record.end_reason == "turn_limit"
