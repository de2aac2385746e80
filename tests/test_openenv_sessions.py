"""The OpenEnv server's session classes in process (``HierarchyEnvironment`` / ``SingleEnvironment`` as
openenv-core calls them for each message), by value: what ``state`` shows before and after the end, who
may act, the endings' flags, the refusals. tests/test_openenv.py checks the same over a real server and
the real client; these run in a second and are what mutation testing reaches (a server process runs
the installed code, not mutmut's copy)."""

from __future__ import annotations

import pytest

from mgrpo_env.core import Limits
from mgrpo_env.openenv_server import EnvSpec, HierarchyEnvironment, SingleEnvironment
from mgrpo_env.openenv_types import AgentAction

SPLIT = "stage2/test"
DELEGATE = '<think>d</think><tool_call>{"name": "delegate", "arguments": {"task": "read a page"}}</tool_call>'
REPORT = "<think>r</think><result>found it</result>"
ANSWER = "<think>a</think><answer>Nobody</answer>"


def spec(scenario, world, **kwargs) -> EnvSpec:
    return EnvSpec(scenario, SPLIT, world, kwargs.pop("limits", Limits(max_main_turns=3)), **kwargs)


@pytest.mark.parametrize("reveal", [False, True])
def test_state_shows_the_public_task_until_the_end_unless_revealed(small_scenario, small_world, reveal):
    env = HierarchyEnvironment(spec(small_scenario, small_world, reveal_answers=reveal))
    empty = env.state
    assert (empty.task, empty.answers_shown, empty.agent, empty.done, empty.env) == (None, False, None, False, "hierarchy")
    env.reset(seed=3, episode_id="e-1")
    full = env._record().task
    public = {k: full[k] for k in ("id", "question", "split", "kind")}
    state = env.state
    assert (state.episode_id, state.step_count, state.agent, state.scenario, state.split) == ("e-1", 0, "main_0", "wiki-hops", SPLIT)
    assert (state.task, state.answers_shown) == ((full, True) if reveal else (public, False))
    assert full["answer"] and full["hops"] and "answer" not in public
    env.step(AgentAction(agent="main_0", text=DELEGATE))
    assert (env.state.task, env.state.agent, env.state.step_count) == (full if reveal else public, "sub_0", 1)
    env.step(AgentAction(agent="sub_0", text=REPORT))
    final = env.step(AgentAction(agent="main_0", text=ANSWER))
    state = env.state
    assert (state.task, state.answers_shown, state.done, state.agent, state.step_count) == (full, True, True, None, 3)
    assert final.record["task"] == full and final.record["episode_id"] == "e-1"
    env.close()


def test_only_the_selected_agent_acts_and_the_endings_flags(small_scenario, small_world):
    env = HierarchyEnvironment(spec(small_scenario, small_world))
    with pytest.raises(RuntimeError, match=r"^no episode in this session: reset\(\) first$"):
        env.step(AgentAction(agent="main_0", text=ANSWER))
    with pytest.raises(ValueError, match=r"^unknown reset option\(s\) \['bogus'\]"):
        env.reset(seed=1, bogus=1)
    first = env.reset(seed=1)
    assert (first.agent, first.done, first.terminated, first.truncated, first.record) == ("main_0", False, False, False, None)
    assert first.messages[0]["role"] == "system" and first.text == first.messages[-1]["content"]
    for agent in ("sub_0", "nobody"):
        with pytest.raises(ValueError, match=f"^agent '{agent}' may not act now: the selected agent is 'main_0'$"):
            env.step(AgentAction(agent=agent, text=REPORT))
    assert env.step(AgentAction(agent="main_0", text=DELEGATE)).agent == "sub_0"
    with pytest.raises(ValueError, match="^agent 'main_0' may not act now: the selected agent is 'sub_0'$"):
        env.step(AgentAction(agent="main_0", text=ANSWER))
    assert env.state.step_count == 1
    back = env.step(AgentAction(agent="sub_0", text=REPORT))
    assert back.agent == "main_0" and back.agents == ["main_0", "sub_0"] and not back.done
    # the main agent's turn limit (3): truncated, not terminated; every agent paid, parts given
    env.step(AgentAction(agent="main_0", text="no tags"))
    end = env.step(AgentAction(agent="main_0", text="no tags"))
    assert (end.agent, end.text, end.messages, end.done, end.terminated, end.truncated) == (None, "", [], True, False, True)
    assert end.record["end_reason"] == "main_turn_limit" and set(end.rewards) == set(end.reward_components) == {"main_0", "sub_0"}
    assert end.reward == end.rewards["main_0"] == 0.0
    with pytest.raises(RuntimeError, match=r"is over \(main_turn_limit\): reset\(\) to start another$"):
        env.step(AgentAction(agent="main_0", text=ANSWER))
    # an answer: terminated, not truncated
    env.reset(seed=1)
    end = env.step(AgentAction(agent="main_0", text=ANSWER))
    assert (end.done, end.terminated, end.truncated, end.record["end_reason"]) == (True, True, False, "answer")
    assert env.state.done and env.state.step_count == 1
    env.close()


def test_the_single_agent_session_by_value(small_scenario, small_world):
    env = SingleEnvironment(spec(small_scenario, small_world, limits=Limits(max_main_turns=1, max_sub_turns=2)))
    first = env.reset(seed=2)
    assert (first.agent, first.agents, first.done, first.rewards, first.reward_components) == (
        "single_0", ["single_0"], False, {"single_0": 0.0}, {})
    assert env.state.agent == "single_0" and not env.state.answers_shown and "answer" not in env.state.task
    with pytest.raises(ValueError, match="^agent 'main_0' may not act now: the selected agent is 'single_0'$"):
        env.step(AgentAction(agent="main_0", text=ANSWER))
    env.step(AgentAction(agent="single_0", text="no tags"))
    end = env.step(AgentAction(agent="single_0", text="no tags"))  # 1 x 2 turns: the limit
    assert (end.agent, end.text, end.done, end.terminated, end.truncated, end.reward) == (None, "", True, False, True, 0.0)
    assert end.record["end_reason"] == "turn_limit" and env.state.answers_shown and env.state.task["answer"]
    env.reset(seed=2)
    end = env.step(AgentAction(agent="single_0", text=f"<think>a</think><answer>{env._record().task['answer']}</answer>"))
    assert (end.done, end.terminated, end.truncated, end.reward, end.rewards) == (True, True, False, 1.0, {"single_0": 1.0})
    assert end.reward_components["single_0"]["correct"] and end.record["correct"]
    env.close()


@pytest.mark.parametrize("kind", ["hierarchy", "single"])
def test_reset_takes_the_seed_and_task_id_as_the_env_does(small_scenario, small_world, kind):
    import mgrpo_env

    session = (HierarchyEnvironment if kind == "hierarchy" else SingleEnvironment)(spec(small_scenario, small_world))
    env = (mgrpo_env.raw_env(scenario=small_scenario, split=SPLIT, world=small_world) if kind == "hierarchy"
           else mgrpo_env.single_agent_env(small_scenario, SPLIT, world=small_world))
    agent = "main_0" if kind == "hierarchy" else "single_0"
    ids = []
    for seed in (3, 4, 3):
        first = session.reset(seed=seed)
        env.reset(seed=seed)
        ids.append(session.state.task["id"])
        assert ids[-1] == env.task.id and first.text == first.messages[-1]["content"] and first.text
        assert (first.record, first.reward, first.reward_components) == (None, 0.0, {})
    assert ids[0] == ids[2] != ids[1]
    other = list(small_scenario.tasks(SPLIT))[7]
    first = session.reset(task_id=other.id)
    assert session.state.task["id"] == other.id and other.question in first.text
    end = session.step(AgentAction(agent=agent, text=f"<think>a</think><answer>{other.answer}</answer>"))
    assert (end.reward, end.rewards[agent], end.record["correct"], end.messages, end.text) == (1.0, 1.0, True, [], "")
    session.close()
    env.close()
