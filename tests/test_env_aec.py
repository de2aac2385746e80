"""The AEC hierarchy: protocol flow, rewards by hand, limits, malformed input, PettingZoo's checkers."""

from __future__ import annotations

import json
import re

import pytest
from pettingzoo.test import api_test, seed_test

import mgrpo_env
import mgrpo_env.core


def call(name: str, **arguments) -> str:
    return f"<think>step</think><tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture()
def make_env(small_scenario, small_world):
    envs = []

    def factory(**kwargs):
        kwargs.setdefault("split", "stage2/test")
        env = mgrpo_env.env(scenario=small_scenario, world=small_world, seed=0, **kwargs)
        envs.append(env)
        return env

    yield factory
    for env in envs:
        env.close()


def first_chain_task(scenario, split="stage2/test"):
    return next(t for t in scenario.tasks(split) if t.kind == "chain" and len(t.hops) == 2)


def run_hop(env, hop) -> str:
    """Drive the selected sub-agent through search -> visit -> result for one hop, reading the page."""
    agent = env.agent_selection
    assert agent.startswith("sub_")
    env.step(call("search", queries=[hop.entity]))
    obs = env.observe(agent)["text"]
    assert obs.startswith("<tool_response>") and hop.entity in obs
    url = next(line[5:] for i, line in enumerate(obs.splitlines()) if line.startswith("URL: ")
               and obs.splitlines()[i - 1].endswith(f"] {hop.entity}"))
    env.step(call("visit", url=url, goal=hop.question))
    page = env.observe(agent)["text"]
    assert "Title:" in page
    env.step(f"<think>found</think><result>{hop.answer}</result>")
    return page


def test_delegation_flow_and_rewards_by_hand(make_env, small_scenario):
    env = make_env()
    task = first_chain_task(small_scenario)
    env.reset(seed=1, options={"task": task})
    assert env.agents == ["main_0"] and env.agent_selection == "main_0"
    obs, reward, term, trunc, info = env.last()
    assert obs["text"] == task.question and reward == 0 and not term and not trunc
    assert info["messages"][0]["role"] == "system" and "delegate" in info["messages"][0]["content"]

    for i, hop in enumerate(task.hops):
        env.step(call("delegate", task=hop.question, context="be precise"))
        assert env.agent_selection == f"sub_{i}"  # a fresh name per delegation
        assert env.observe(f"sub_{i}")["text"] == f"Subtask: {hop.question}\nContext: be precise"
        run_hop(env, hop)
        assert env.agent_selection == "main_0"
        assert env.observe("main_0")["text"] == f"<tool_response>\n{hop.answer}\n</tool_response>"
        assert f"sub_{i}" in env.agents  # a sub that reported waits to be paid
    env.step(f"<think>done</think><answer>{task.answer}</answer>")

    assert all(env.terminations.values()) and not any(env.truncations.values())
    record = env.unwrapped.record
    assert record.correct and record.final_answer == task.answer and record.num_subs == 2
    # the main agent's chat turn by turn: what it wrote, and each tool response as the next user message
    actions = [call("delegate", task=hop.question, context="be precise") for hop in task.hops]
    responses = [f"<tool_response>\n{hop.answer}\n</tool_response>" for hop in task.hops]
    assert record.main.messages[1:] == [
        {"role": "user", "content": task.question},
        *({"role": role, "content": text} for pair in zip(actions, responses, strict=True)
          for role, text in zip(("assistant", "user"), pair, strict=True)),
        {"role": "assistant", "content": f"<think>done</think><answer>{task.answer}</answer>"}]
    assert [t.observation for t in record.main.turns] == [*responses, ""]
    # R_M = 0.1*1 + 0.9*1 ; R_S = 0.1*1 + 0.4*1 + 0.5*expert(=1, the result is the hop's gold answer)
    assert record.rewards == {"main_0": pytest.approx(1.0), "sub_0": pytest.approx(1.0), "sub_1": pytest.approx(1.0)}
    paid = {}
    for agent in env.agent_iter():
        _, reward, term, _, info = env.last()
        paid[agent] = reward
        assert term and info["reward_components"]["reward"] == pytest.approx(reward)
        env.step(None)
    assert paid == record.rewards and env.agents == []
    assert [len(s.tool_calls) for s in record.subs] == [2, 2]
    assert all(tc.ok and tc.latency_s > 0 for s in record.subs for tc in s.tool_calls)


def test_wrong_answer_and_format_failures(make_env, small_scenario):
    env = make_env()
    task = first_chain_task(small_scenario)
    env.reset(seed=1, options={"task": task})
    env.step("I think the answer is obvious")  # no tag: a format failure, not an exception
    obs = env.observe("main_0")["text"]
    assert obs.startswith("<tool_response>\nError (no_tag)")
    env.step(call("delegate", task=task.hops[0].question))
    env.step(call("search", queries=5))  # bad arguments: not a list of strings
    assert "Error (bad_arguments)" in env.observe("sub_0")["text"]
    env.step("<result>Nobody</result>")  # well-formed but wrong: expert from F1 with the hop answer
    env.step(f"<answer>{task.answer}</answer>")
    rec = env.unwrapped.record
    main, sub = rec.components["main_0"], rec.components["sub_0"]
    assert rec.correct and main["format_ok"] is False and main["reward"] == 0.0  # invalid format -> 0
    assert sub["format_ok"] is False and sub["reward"] == 0.0
    assert rec.main.format_errors == 1 and rec.subs[0].format_errors == 1


def test_sub_reward_components_by_hand(make_env, small_scenario):
    env = make_env()
    task = first_chain_task(small_scenario)
    env.reset(seed=1, options={"task": task})
    env.step(call("delegate", task=task.hops[0].question))
    env.step("<result>no idea</result>")  # valid format, expert 0
    env.step("<answer>wrong answer</answer>")
    rec = env.unwrapped.record
    assert not rec.correct
    assert rec.rewards["main_0"] == pytest.approx(0.1)  # 0.1*format + 0.9*0
    assert rec.components["sub_0"]["expert"] == 0.0
    assert rec.rewards["sub_0"] == pytest.approx(0.1)  # 0.1*format + 0.4*0 + 0.5*0


def test_limits_truncate_cleanly(make_env, small_scenario):
    env = make_env(max_main_turns=3, max_sub_turns=2, max_delegations=1, max_observation_chars=300)
    task = first_chain_task(small_scenario)
    env.reset(seed=1, options={"task": task})
    env.step(call("delegate", task=task.hops[0].question))
    env.step(call("search", queries=[task.hops[0].entity]))
    assert len(env.observe("sub_0")["text"]) <= 300 and "[truncated:" in env.observe("sub_0")["text"]
    env.step(call("search", queries=["again"]))  # second sub turn: its limit
    assert env.agent_selection == "main_0"
    assert "limit of 2 turns" in env.observe("main_0")["text"]
    env.step(call("delegate", task="more"))  # over the delegation limit: told, not crashed
    assert "delegations of this episode are used" in env.observe("main_0")["text"]
    env.step("<think>hmm</think>")  # third main turn: truncation
    assert all(env.truncations.values()) and not any(env.terminations.values())
    rec = env.unwrapped.record
    assert rec.truncated and rec.end_reason == "main_turn_limit" and rec.rewards["main_0"] == 0.0
    assert rec.subs[0].truncated and rec.subs[0].final is None


def test_too_long_action_is_a_format_failure(make_env):
    env = make_env(max_action_chars=100)
    env.reset(seed=0)
    env.step("<answer>" + "x" * 200 + "</answer>")
    assert "Error (too_long)" in env.observe("main_0")["text"]


@pytest.mark.parametrize(("action", "named"), [(12345, "got int"), (b"<answer>x</answer>", "got bytes: decode() it first"),
                                             ({"name": "search"}, "got dict"), (None, "got NoneType: None is only")])
def test_a_non_string_action_for_a_live_agent_is_a_type_error(make_env, action, named):
    # a programming error (a forgotten decode()), not the agent's format failure (issue 21)
    env = make_env()
    env.reset(seed=0)
    with pytest.raises(TypeError, match="the action of main_0 must be a str.*" + re.escape(named)):
        env.step(action)
    env.step("no tags at all")  # malformed text stays a format error, never an exception
    assert "Error (no_tag)" in env.observe("main_0")["text"]


def test_spaces_print_in_one_short_line(make_env):
    env = make_env()
    assert len(repr(env.action_space("main_0"))) < 200 and len(repr(env.observation_space("main_0"))) < 200


def test_reset_is_deterministic_and_uses_np_random(make_env):
    a, b = make_env(), make_env()
    a.reset(seed=7)
    b.reset(seed=7)
    assert a.unwrapped.task.id == b.unwrapped.task.id
    ids = set()
    for s in range(20):
        a.reset(seed=s)
        ids.add(a.unwrapped.task.id)
    assert len(ids) > 5


def test_pettingzoo_api_test(make_env):
    api_test(make_env(), num_cycles=1000, verbose_progress=False)


def test_pettingzoo_seed_test(small_scenario, small_world):
    seed_test(lambda: mgrpo_env.env(scenario=small_scenario, world=small_world, split="stage2/test"), num_cycles=200)


def test_pettingzoo_seed_test_on_independently_opened_worlds(small_scenario, monkeypatch):
    """Two envs, each serving its own world on its own loopback port, play the same episode.

    Observations hold search results and page URLs: they match only because agents see the stable
    origin (http://wiki-hops.test), not the port.
    """
    from mgrpo_scenarios.wiki_hops import WikiHops

    served, envs, real_open = [], [], WikiHops.open

    def spy_open(self):  # the real open(); only notes where each world is served
        world = real_open(self)
        served.append(world.served_url)
        return world

    monkeypatch.setattr(WikiHops, "open", spy_open)

    def build():
        kwargs = {"num_entities": 300, "data_dir": str(small_scenario.data_dir)}
        envs.append(mgrpo_env.env(scenario="wiki-hops", split="stage2", scenario_kwargs=kwargs))
        return envs[-1]

    try:
        seed_test(build, num_cycles=40)
    finally:
        for env in envs:
            env.close()
    assert len(served) == 2 and served[0] != served[1]  # two worlds, two ports


def test_random_play_reaches_sub_agents(make_env):
    env = make_env()
    seen = set()
    for episode in range(15):
        env.reset(seed=episode)
        for agent in env.agent_iter(400):
            seen.add(agent)
            _, _, term, trunc, _ = env.last()
            env.step(None if term or trunc else env.action_space(agent).sample())
    assert {"main_0", "sub_0", "sub_1"} <= seen


def test_expert_term_is_dropped_when_nothing_can_judge(make_env, small_scenario):
    from dataclasses import replace

    from mgrpo_env import RewardConfig

    task = replace(first_chain_task(small_scenario), hops=())  # a task without per-hop gold
    env = make_env(rewards=RewardConfig(expert=mgrpo_env.core.expert_scorer(None)))
    env.reset(seed=1, options={"task": task})
    env.step(call("delegate", task="anything"))
    env.step("<result>a report</result>")
    env.step(f"<answer>{task.answer}</answer>")
    comp = env.unwrapped.record.components["sub_0"]
    assert comp["expert"] is None and comp["expert_source"] == "none"
    assert comp["reward"] == pytest.approx(0.1 + 0.4)  # b3 dropped: b1*format + b2*main_correct


def test_expert_from_an_llm_judge_when_there_are_no_hops(make_env, small_scenario):
    from dataclasses import replace

    from mgrpo_env import RewardConfig

    class Judge:
        def __init__(self):
            self.calls = []

        def score_subtask(self, task, gold, report):
            self.calls.append((task, gold, report))
            return 0.6

    judge = Judge()
    task = replace(first_chain_task(small_scenario), hops=())
    env = make_env(rewards=RewardConfig(expert=mgrpo_env.core.expert_scorer(judge)))
    env.reset(seed=1, options={"task": task})
    env.step(call("delegate", task="find it"))
    env.step("<result>a report</result>")
    env.step("<answer>wrong</answer>")
    comp = env.unwrapped.record.components["sub_0"]
    assert judge.calls == [("find it", task.answer, "a report")]
    assert comp["expert_source"] == "hops+judge" and comp["expert"] == 0.6
    assert comp["reward"] == pytest.approx(0.1 + 0.0 + 0.5 * 0.6)


def test_a_failing_verifier_does_not_end_the_run(make_env, small_scenario, monkeypatch):
    env = make_env()
    task = first_chain_task(small_scenario)

    def judge_down(task, prediction):
        raise ConnectionError("judge unreachable after 3 retries")

    monkeypatch.setattr(env.unwrapped.scenario, "verify", judge_down)
    env.reset(seed=1, options={"task": task})
    env.step(f"<answer>{task.answer}</answer>")
    comp = env.unwrapped.record.components["main_0"]
    assert comp["correct"] is False and comp["reward"] == pytest.approx(0.1)
    assert "judge unreachable" in comp["verify_error"]


def test_delegations_are_recorded_with_the_sub_agent_they_started(make_env, small_scenario):
    env = make_env(max_delegations=1)
    task = first_chain_task(small_scenario)
    env.reset(seed=1, options={"task": task})
    env.step(call("delegate", task="first", context="c"))
    env.step("<result>r</result>")
    env.step(call("delegate", task="second"))  # over the limit
    calls = env.unwrapped.record.main.tool_calls
    assert [(c.tool, c.ok, c.meta.get("agent")) for c in calls] == [("delegate", True, "sub_0"), ("delegate", False, None)]
    assert calls[0].arguments == {"task": "first", "context": "c"} and calls[1].error.startswith("limit:")
    assert calls[1].arguments == {"task": "second"}  # the refused call is recorded with what was asked



def test_a_refused_delegation_on_the_last_turn_ends_the_episode(make_env, small_scenario):
    """The refused call is a turn like any tool call: on the main agent's last turn it truncates."""
    env = make_env(max_delegations=1, max_main_turns=2)
    env.reset(seed=1, options={"task": first_chain_task(small_scenario)})
    env.step(call("delegate", task="first"))
    env.step("<result>r</result>")
    env.step(call("delegate", task="second"))  # over the limit, and the main agent's second turn
    record = env.unwrapped.record
    assert record.end_reason == "main_turn_limit" and record.truncated and record.main.truncated
    assert all(env.truncations.values()) and len(record.main.turns) == 2

# -- reward edge cases, by hand-computed values (issue 22) ------------------------------------------------
# Non-paper weights, all distinct, so that a weight taken from the wrong place changes a reward.
A = (0.25, 0.75)  # a1, a2
B = (0.15, 0.35, 0.5)  # b1, b2, b3


class KeyedExpert:
    """r_expert looked up by (subtask, report), recording each call: which sub-agent was scored by what."""

    source = "keyed"

    def __init__(self, table):
        self.table, self.calls = table, []

    def __call__(self, task, subtask, result):
        self.calls.append((task.id, subtask, result))
        return self.table[(subtask, result)]


def rewards_env(make_env, expert, **kwargs):
    from mgrpo_env import RewardConfig

    return make_env(rewards=RewardConfig(main_weights=A, sub_weights=B, expert=expert), **kwargs)


def paid_by_agent(env) -> dict[str, tuple[float, dict]]:
    """What agent_iter pays each agent at the end (reward and its components), stepping them out."""
    paid = {}
    for agent in env.agent_iter():
        _, reward, _, _, info = env.last()
        paid[agent] = (reward, info["reward_components"])
        env.step(None)
    return paid


@pytest.mark.parametrize("correct", [True, False])
def test_each_sub_agent_is_paid_for_its_own_report_and_expert_score(make_env, small_scenario, correct):
    task = first_chain_task(small_scenario)
    expert = KeyedExpert({("find one", "report one"): 0.2, ("find two", "report two"): 0.8,
                          ("find three", "report three"): 0.6})
    env = rewards_env(make_env, expert, max_delegations=3, max_main_turns=5)
    env.reset(seed=1, options={"task": task})
    env.step(call("delegate", task="find one"))
    env.step("<result>report one</result>")
    env.step(call("delegate", task="find two"))
    env.step("<result>report two</result>")
    env.step(call("delegate", task="find three"))
    env.step("no tags")  # sub_2's format failure: it reports, but is paid 0
    env.step("<result>report three</result>")
    env.step(f"<answer>{task.answer if correct else 'certainly wrong'}</answer>")
    c = 1.0 if correct else 0.0
    want = {"main_0": 0.25 + 0.75 * c,
            "sub_0": 0.15 + 0.35 * c + 0.5 * 0.2,
            "sub_1": 0.15 + 0.35 * c + 0.5 * 0.8,
            "sub_2": 0.0}
    rec = env.unwrapped.record
    assert rec.correct is correct and rec.rewards == pytest.approx(want)
    # the scorer judged each sub-agent's own subtask and report (sub_2's too: its term is then zeroed)
    assert expert.calls == [(task.id, "find one", "report one"), (task.id, "find two", "report two"),
                            (task.id, "find three", "report three")]
    assert [(s.agent, s.final, s.expert, s.format_ok) for s in rec.subs] == [
        ("sub_0", "report one", 0.2, True), ("sub_1", "report two", 0.8, True), ("sub_2", "report three", 0.6, False)]
    # each agent's reward inputs (turns, format errors, its report's length; the main agent's score and
    # delegations) beside its pay
    for n, (e, report) in enumerate(((0.2, "report one"), (0.8, "report two"), (0.6, "report three"))):
        assert rec.components[f"sub_{n}"] == {"format_ok": n != 2, "main_correct": correct, "expert": e,
                                              "expert_source": "keyed", "turns": 1 + (n == 2),
                                              "format_errors": int(n == 2), "report_chars": len(report),
                                              "reward": pytest.approx(want[f"sub_{n}"])}
    assert rec.components["main_0"] == {"format_ok": True, "correct": correct, "score": c, "turns": 4,
                                        "format_errors": 0, "delegations": 3, "reward": pytest.approx(want["main_0"])}
    paid = paid_by_agent(env)
    assert {a: r for a, (r, _) in paid.items()} == pytest.approx(want)
    assert all(comp == rec.components[a] for a, (_, comp) in paid.items())


def test_a_sub_agent_stopped_at_its_turn_limit_is_paid_nothing(make_env, small_scenario):
    """No result: r_format 0 and r_expert 0 ("no_result", the scorer is not asked); the main agent is told
    and goes on; its own reward and another sub-agent's are unaffected."""
    task = first_chain_task(small_scenario)
    expert = KeyedExpert({("hop two", "a report"): 0.4})
    env = rewards_env(make_env, expert, max_sub_turns=2, max_delegations=2)
    env.reset(seed=1, options={"task": task})
    env.step(call("delegate", task="hop one"))
    env.step(call("search", queries=[task.hops[0].entity]))
    env.step(call("search", queries=["again"]))  # its second turn: the limit, without a result
    assert env.agent_selection == "main_0"
    assert env.observe("main_0")["text"] == (
        "<tool_response>\nThe sub-agent stopped at its limit of 2 turns without a result.\n</tool_response>")
    env.step(call("delegate", task="hop two"))
    env.step("<result>a report</result>")
    env.step(f"<answer>{task.answer}</answer>")
    rec = env.unwrapped.record
    assert rec.correct and rec.end_reason == "answer" and not rec.truncated
    assert rec.subs[0].truncated and rec.subs[0].final is None and not rec.subs[1].truncated
    assert rec.components["sub_0"] == {"format_ok": False, "main_correct": True, "expert": 0.0,
                                       "expert_source": "no_result", "turns": 2, "format_errors": 0,
                                       "report_chars": 0, "reward": 0.0}
    assert rec.rewards == pytest.approx({"main_0": 1.0, "sub_0": 0.0, "sub_1": 0.15 + 0.35 + 0.5 * 0.4})
    assert expert.calls == [(task.id, "hop two", "a report")]
    assert {a: r for a, (r, _) in paid_by_agent(env).items()} == pytest.approx(rec.rewards)


def test_a_truncated_main_agent_still_pays_its_sub_agents(make_env, small_scenario):
    """The main agent ends at its turn limit without an answer: R_M = 0 and r_correct(main) = 0, but a
    sub-agent that reported keeps b1 + b3 * r_expert; every agent is truncated, none terminated."""
    task = first_chain_task(small_scenario)
    env = rewards_env(make_env, KeyedExpert({("hop", "rep"): 0.6}), max_main_turns=2)
    env.reset(seed=1, options={"task": task})
    env.step(call("delegate", task="hop"))
    env.step("<result>rep</result>")
    env.step(call("reason", problem="think harder"))  # the main agent's second and last turn
    rec = env.unwrapped.record
    assert rec.end_reason == "main_turn_limit" and rec.truncated and rec.final_answer is None and not rec.correct
    assert rec.rewards == pytest.approx({"main_0": 0.0, "sub_0": 0.15 + 0.5 * 0.6})
    assert rec.components["main_0"] == {"format_ok": False, "correct": False, "score": 0.0, "turns": 2,
                                        "format_errors": 0, "delegations": 1, "reward": 0.0}
    assert env.truncations == {"main_0": True, "sub_0": True} and not any(env.terminations.values())


def test_the_main_agents_other_tools_are_told_not_crashed(make_env, small_scenario):
    """``reason`` (a main-agent tool this env does not run) is a well-formed call: an error observation,
    a failed tool record, no format failure. A sub-agent's tool named by the main agent is a format failure,
    and so is a tool no role has; either one costs R_M."""
    task = first_chain_task(small_scenario)
    env = make_env(max_main_turns=4)
    env.reset(seed=1, options={"task": task})
    env.step(call("reason", problem="which hop first?"))
    error = "unavailable: the tool 'reason' is not available here"
    assert env.observe("main_0")["text"] == f"<tool_response>\nError (reason): {error}\n</tool_response>"
    main = env.unwrapped.record.main
    assert [(c.tool, c.arguments, c.ok, c.error) for c in main.tool_calls] == [
        ("reason", {"problem": "which hop first?"}, False, error)]
    env.step(f"<answer>{task.answer}</answer>")
    rec = env.unwrapped.record
    assert rec.main.format_errors == 0 and rec.rewards == {"main_0": pytest.approx(1.0)}  # a1 + a2

    for name in ("search", "nonexistent"):
        env.reset(seed=1, options={"task": task})
        env.step(call(name, queries=["x"]))
        assert env.observe("main_0")["text"].startswith("<tool_response>\nError (unknown_tool)")
        assert env.unwrapped.record.main.tool_calls == [] and env.agents == ["main_0"]
        env.step(f"<answer>{task.answer}</answer>")
        rec = env.unwrapped.record
        assert rec.correct and rec.main.format_errors == 1
        assert rec.components["main_0"] == {"format_ok": False, "correct": True, "score": 1.0, "turns": 2,
                                            "format_errors": 1, "delegations": 0, "reward": 0.0}


class ToolFailure(Exception):
    """Not an error type any tool raises on purpose: a narrowed ``except`` would let it through."""


class RaisingWorld:
    """The small world's tools, with ``search`` raising ``exc`` (a tool that breaks its no-raise promise)."""

    def __init__(self, world, exc):
        self.world, self.exc = world, exc

    def make_tools(self):
        tools = dict(self.world.make_tools())

        def search(arguments):
            raise self.exc

        tools["search"] = search
        return tools


@pytest.mark.parametrize("exc", [ToolFailure("socket closed mid-read"), KeyError("results"), ZeroDivisionError("0")])
def test_a_tool_that_raises_becomes_an_error_observation(small_scenario, small_world, exc):
    env = mgrpo_env.env(scenario=small_scenario, world=RaisingWorld(small_world, exc), split="stage2/test", seed=0)
    task = first_chain_task(small_scenario)
    env.reset(seed=1, options={"task": task})
    env.step(call("delegate", task=task.hops[0].question))
    env.step(call("search", queries=["anything"]))
    error = f"internal: {type(exc).__name__}: {exc}"
    assert env.observe("sub_0")["text"] == f"<tool_response>\nError (search): {error}\n</tool_response>"
    sub = env.unwrapped.record.subs[0]
    assert [(c.tool, c.ok, c.error, c.latency_s) for c in sub.tool_calls] == [("search", False, error, 0.0)]
    assert sub.format_errors == 0 and env.agent_selection == "sub_0"  # the episode goes on
    env.step(f"<result>{task.hops[0].answer}</result>")
    env.step(f"<answer>{task.answer}</answer>")
    assert env.unwrapped.record.rewards == pytest.approx({"main_0": 1.0, "sub_0": 1.0})  # a failed call costs nothing
    env.close()


def test_call_tool_records_and_texts_by_hand():
    from mgrpo_env.core import call_tool
    from mgrpo_env.protocol import ParsedAction
    from mgrpo_tools.base import ToolResult

    seen = []

    def visit(arguments):
        seen.append(dict(arguments))
        return ToolResult("page text", ok=False, error="http: 404", latency_s=0.25,
                          meta={"url": "u", "status": 404, "cached": False, "none": None, "links": [1, 2], "d": {}})

    def click(arguments):
        arguments.clear()  # a tool that empties what it was given must not empty the parsed turn
        return ToolResult("clicked", latency_s=0.5)

    parsed = ParsedAction("tool_call", tool_name="visit", arguments={"url": "u", "goal": "g"})
    record, text = call_tool({"visit": visit, "click": click}, parsed)
    assert text == "page text" and seen == [{"url": "u", "goal": "g"}]
    assert (record.tool, record.arguments, record.ok, record.error, record.latency_s) == (
        "visit", {"url": "u", "goal": "g"}, False, "http: 404", 0.25)
    assert record.meta == {"url": "u", "status": 404, "cached": False, "none": None}  # scalars only: JSON-ready

    parsed = ParsedAction("tool_call", tool_name="click", arguments={"link": 3})
    record, text = call_tool({"visit": visit, "click": click}, parsed)
    assert (text, record.ok, record.error, record.latency_s, record.meta) == ("clicked", True, None, 0.5, {})
    assert parsed.arguments == {"link": 3}

    record, text = call_tool({"visit": visit}, ParsedAction("tool_call", tool_name="click", arguments=None))
    assert (record.tool, record.arguments, record.ok, record.meta) == ("click", {}, False, {})
    assert text == "Error (click): unavailable: the tool 'click' is not available here" and record.error == text[15:]


# -- the records of the reward path by value (from the aec.py / core.py mutation survivors, issue 22) --------


def test_turn_records_format_errors_and_truncation_of_both_agents(make_env, small_scenario):
    env = make_env(max_main_turns=4, max_sub_turns=4, max_action_chars=200)
    task = first_chain_task(small_scenario)
    env.reset(seed=1, options={"task": task})
    env.step("no tags")  # main: two malformed turns, counted one by one
    env.step("still none")
    main = env.unwrapped.record.main
    assert [(t.action, t.kind, t.error_kind) for t in main.turns] == [
        ("no tags", "error", "no_tag"), ("still none", "error", "no_tag")]
    assert main.format_errors == 2
    env.step(call("delegate", task="find it"))  # no context: the subtask line only
    assert env.observe("sub_0")["text"] == "Subtask: find it"
    sub = env.unwrapped.record.subs[0]
    assert (sub.task, sub.context) == ("find it", None)
    too_long = "<result>" + "x" * 300 + "</result>"  # over the action limit: a sub's format failure too
    env.step(too_long)
    env.step("no tags")
    env.step(call("search", queries=[task.hops[0].entity]))
    env.step(call("search", queries=[task.hops[1].entity]))  # fourth sub turn: its limit, back to main
    assert [(t.action, t.kind, t.error_kind) for t in sub.turns][:2] == [
        (too_long, "error", "too_long"), ("no tags", "error", "no_tag")]
    assert [t.kind for t in sub.turns] == ["error", "error", "tool_call", "tool_call"] and sub.format_errors == 2
    assert sub.truncated is True and env.agent_selection == "main_0"
    latencies = [t.tool_call.latency_s for t in sub.turns[2:]]
    assert all(s > 0 for s in latencies) and env.unwrapped.record.tool_s == pytest.approx(sum(latencies))
    env.step("<think>one more</think>")  # main's fourth turn: its limit
    rec = env.unwrapped.record
    assert main.truncated is True and rec.end_reason == "main_turn_limit" and rec.score == 0.0
    assert rec.final_answer is None and rec.truncated is True


def test_a_sub_agents_return_on_the_main_agents_last_turn_ends_the_episode(make_env, small_scenario):
    env = make_env(max_main_turns=1)
    task = first_chain_task(small_scenario)
    env.reset(seed=1, options={"task": task})
    env.step(call("delegate", task="only", context="the notes"))  # main's one turn
    assert env.observe("sub_0")["text"] == "Subtask: only\nContext: the notes"
    assert env.unwrapped.record.subs[0].context == "the notes"
    env.step("<result>r</result>")  # the report comes back to a main agent with no turn left
    rec = env.unwrapped.record
    assert rec.main.truncated is True and rec.end_reason == "main_turn_limit"
    assert all(env.truncations.values()) and env.infos["main_0"]["end_reason"] == "main_turn_limit"


def test_an_answered_episode_records_its_score_time_and_each_agents_infos(make_env, small_scenario):
    env = make_env()
    task = first_chain_task(small_scenario)
    env.reset(seed=1, options={"task": task})
    env.step(call("delegate", task="t"))
    env.step("<result>r</result>")
    env.step(f"<answer>{task.answer}</answer>")
    rec = env.unwrapped.record
    assert rec.score == 1.0 and rec.end_reason == "answer" and 0.0 <= rec.wall_s < 60.0
    for agent, role in (("main_0", "main"), ("sub_0", "sub")):
        info = env.infos[agent]
        assert (info["role"], info["task_id"], info["end_reason"]) == (role, task.id, "answer")
        assert info["reward_components"] == rec.components[agent]


def test_a_custom_expert_gets_the_subtask_and_is_named_custom(make_env, small_scenario):
    from mgrpo_env import RewardConfig

    seen = []

    def scorer(task, subtask, result):
        seen.append((subtask, result))
        return 0.25

    def undecided(task, subtask, result):
        return None

    task = first_chain_task(small_scenario)
    env = make_env(rewards=RewardConfig(sub_weights=B, expert=scorer))
    env.reset(seed=1, options={"task": task})
    env.step(call("delegate", task="find x"))
    env.step("<result>a report</result>")
    env.step(f"<answer>{task.answer}</answer>")
    comp = env.unwrapped.record.components["sub_0"]
    assert seen == [("find x", "a report")] and (comp["expert"], comp["expert_source"]) == (0.25, "custom")
    assert comp["reward"] == pytest.approx(B[0] + B[1] + B[2] * 0.25)
    for rewards in (RewardConfig(sub_weights=B, expert=None), RewardConfig(sub_weights=B, expert=undecided)):
        env = make_env(rewards=rewards)  # no scorer, or one with nothing to judge by: the term is dropped
        env.reset(seed=1, options={"task": task})
        env.step(call("delegate", task="t"))
        env.step("<result>a report</result>")
        env.step(f"<answer>{task.answer}</answer>")
        comp = env.unwrapped.record.components["sub_0"]
        assert (comp["expert"], comp["expert_source"]) == (None, "none")
        assert comp["reward"] == pytest.approx(B[0] + B[1])


def test_call_tool_without_a_name_and_a_raising_tool_and_verifier_by_hand():
    from mgrpo_env.core import call_tool, safe_verify
    from mgrpo_env.protocol import ParsedAction

    record, text = call_tool({}, ParsedAction("tool_call", tool_name=None, arguments={"a": 1}))
    assert (record.tool, record.arguments, record.ok) == ("", {"a": 1}, False)
    assert text == "Error (): unavailable: the tool '' is not available here"

    def broken(arguments):
        raise ValueError("bad state")

    record, text = call_tool({"t": broken}, ParsedAction("tool_call", tool_name="t", arguments={"x": 2}))
    assert (record.tool, record.arguments, record.ok, record.error) == ("t", {"x": 2}, False, "internal: ValueError: bad state")
    assert text == "Error (t): internal: ValueError: bad state"

    class Down:
        def verify(self, task, answer):
            raise ConnectionError("judge unreachable")

    assert safe_verify(Down(), None, "x") == (None, "ConnectionError: judge unreachable")
    assert safe_verify(Down(), None, None) == (None, None)


def test_infos_count_each_agents_turns_and_a_done_agent_takes_only_none(make_env, small_scenario):
    # infos[agent]["turn"]: the turns the agent has taken when it reads its observation; PettingZoo's
    # contract for an agent that is done: step(None) removes it, any other action is a ValueError
    env = make_env()
    env.reset(seed=1, options={"task": first_chain_task(small_scenario)})
    assert env.infos["main_0"]["turn"] == 0
    env.step("no tags")
    assert env.infos["main_0"]["turn"] == 1
    env.step(call("delegate", task="t"))
    assert env.infos["sub_0"]["turn"] == 0
    env.step("no tags either")
    env.step("still none")
    assert env.infos["sub_0"]["turn"] == 2 and env.infos["main_0"]["turn"] == 1
    env.step("<result>r</result>")
    assert env.infos["main_0"]["turn"] == 2
    env.step("<answer>x</answer>")
    assert env.terminations["main_0"] and env.agent_selection == "main_0"
    with pytest.raises(ValueError, match="only valid action is None"):
        env.step("<answer>again</answer>")
    env.step(None)
    assert "main_0" not in env.agents


def test_resets_without_a_seed_continue_one_stream_and_a_seed_restarts_it(make_env):
    # Gymnasium's seeding: the constructor's seed serves the first reset, later seedless resets draw on
    # from the same generator, reset(seed=s) restarts it; the record carries the seed that was used
    a, b = make_env(), make_env()
    streams = []
    for env in (a, b):
        env.reset()
        assert env.unwrapped.record.seed == 0
        ids = [env.unwrapped.task.id]
        for _ in range(5):
            env.reset()
            assert env.unwrapped.record.seed is None
            ids.append(env.unwrapped.task.id)
        streams.append(ids)
    assert streams[0] == streams[1] and len(set(streams[0])) > 1
    a.reset(seed=0)
    again = [a.unwrapped.task.id] + [a.reset() or a.unwrapped.task.id for _ in range(5)]
    assert again == streams[0]
    first_id = a.unwrapped.record.episode_id
    a.reset(seed=7)
    b.reset(seed=7)
    assert a.unwrapped.record.seed == 7 and a.unwrapped.task.id == b.unwrapped.task.id
    assert isinstance(first_id, str) and a.unwrapped.record.episode_id not in (first_id, b.unwrapped.record.episode_id)
    # every action space is seeded from the episode's generator, the main agent's as the sub-agents'
    assert a.action_space("main_0").sample() == b.action_space("main_0").sample()
    assert a.action_space("sub_1").sample() == b.action_space("sub_1").sample()
    samples = set()
    for s in range(100):  # each episode seed gives the spaces their own seed
        a.reset(seed=s)
        samples.add(a.action_space("main_0").sample())
    assert len(samples) > 90
    with pytest.raises(ValueError, match="no task with id 'nope' in split 'stage2/test'"):
        a.reset(options={"task_id": "nope"})


def test_a_finished_or_unstarted_episode_refuses_a_turn(small_scenario, small_world):
    from mgrpo_env.episode_core import Episode

    episode = Episode("single", small_scenario, "stage2/test", world=small_world, seed=0)
    with pytest.raises(RuntimeError, match=r"the episode is over: reset\(\) starts the next one"):
        episode.act("<answer>x</answer>")
    episode.reset()
    episode.act("<think>x</think><answer>x</answer>")
    assert episode.finished and episode.selected is not None
    with pytest.raises(RuntimeError, match=r"the episode is over: reset\(\) starts the next one"):
        episode.act("<think>x</think><answer>y</answer>")


def test_the_runs_extra_terms_and_a_called_roles_own_weights_are_paid_by_role(make_env, small_scenario):
    """``RewardConfig.terms`` (role -> terms) and ``RewardConfig.called`` (role -> weights, gate): each agent is
    paid its own role's, read by its role; a subtask score that names its own source keeps it."""
    from mgrpo_env import RewardConfig
    from mgrpo_env.core import ExpertScore
    from mgrpo_env.rewards import REWARD_TERMS

    def scorer(task, subtask, result):
        return ExpertScore(0.5, "subtask")

    REWARD_TERMS.register("per_turn", lambda inputs: inputs["turns"])
    try:
        task = first_chain_task(small_scenario)
        rewards = RewardConfig(main_weights=A, sub_weights=B, expert=scorer,
                               terms={"main": (("per_turn", 0.01),), "sub": (("per_turn", 0.1),)},
                               called={"sub": ((0.2, 0.2, 0.6), True)})
        env = make_env(rewards=rewards, max_delegations=1)
        env.reset(seed=1, options={"task": task})
        env.step(call("delegate", task="find it"))
        env.step(call("search", queries=["x"]))
        env.step("<result>a report</result>")
        env.step(f"<answer>{task.answer}</answer>")
        rec = env.unwrapped.record
        # main: a1 + a2 + 0.01 x its 2 turns; sub, by its own weights and gate: 0.2 x 0.5 + 0.2 + 0.6 x 0.5,
        # plus 0.1 x its 2 turns
        assert rec.rewards == pytest.approx({"main_0": A[0] + A[1] + 0.02, "sub_0": 0.1 + 0.2 + 0.3 + 0.2})
        assert rec.components["sub_0"]["expert_source"] == "subtask" and rec.components["sub_0"]["expert"] == 0.5
    finally:
        REWARD_TERMS.unregister("per_turn")
