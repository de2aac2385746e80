"""The env over OpenEnv: a real ``mgrpo serve-env`` process on 127.0.0.1 and the real client.

The target: an episode with the same seed and the same actions over the wire equals the in-process
one, record for record (the oracle's episodes, a random policy's malformed ones, the single agent).
Then the faults: a malformed action, an agent that may not act, a step after the end, a client that
goes away mid-episode (its session and browser pages freed), a server restart (a clear error, then
a clean reconnect), and concurrent sessions.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
import pytest
import websockets

import mgrpo_env
from mgrpo_algo.experiments.serve_env_cli import ServeEnvProcess
from mgrpo_env.openenv_client import EnvConnectionLost, EnvServerError, MGRPOEnvClient
from mgrpo_env.openenv_types import AgentAction
from mgrpo_env.rollout import PolicyRequest
from mgrpo_env.scripted import OraclePolicy, RandomPolicy

SPLIT = "stage2/test"
TIMING = ("episode_id", "wall_s", "tool_s", "latency_s")  # what differs between any two runs of one episode


def server_args(scenario, *extra: str) -> list[str]:
    # render_cache=false: every visit of a JavaScript page opens a browser page (what the leak test counts)
    return ["--set", "num_entities=300", "--set", f"data_dir={scenario.data_dir}", "--set", "render_cache=false",
            "--split", SPLIT, "--port", "0", *extra]


@pytest.fixture(scope="module")
def scenario(small_scenario):
    """The session's small world as the servers open it (no render cache, see server_args)."""
    from mgrpo_scenarios.wiki_hops import WikiHops

    return WikiHops(seed=0, num_entities=300, data_dir=small_scenario.data_dir, render_cache=False)


@pytest.fixture(scope="module")
def world(scenario):
    with scenario.open() as opened:
        yield opened


@pytest.fixture(scope="module")
def hierarchy_server(scenario):
    with ServeEnvProcess(*server_args(scenario)) as server:
        yield server


@pytest.fixture(scope="module")
def single_server(scenario):
    with ServeEnvProcess(*server_args(scenario, "--single")) as server:
        yield server


def untimed(value):
    """A record without what differs between two runs of the same episode (ids, clocks)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def play_in_process(env, policies, seed: int) -> tuple[list[tuple[str, str]], dict]:
    """One episode of the bare AEC env driven by ``policies`` (role -> policy): its (agent, text)
    actions in order and its record."""
    env.reset(seed=seed)
    actions = []
    while not env.record.end_reason:
        agent = env.agent_selection
        role = env.infos[agent]["role"]
        request = PolicyRequest(episode=0, agent=agent, role=role, observation=env.observe(agent)["text"],
                                messages=env.infos[agent]["messages"], task=env.task)
        text = policies[role]([request])[0]
        actions.append((agent, text))
        env.step(text)
    return actions, env.record.to_dict()


def replay(url: str, seed: int, actions: list[tuple[str, str]]) -> tuple[list[str], dict, object]:
    """The same actions over the wire: the agents the server selected, in order, the record, the last result."""
    selected = []
    with MGRPOEnvClient(url).sync() as client:
        result = client.reset(seed=seed)
        for agent, text in actions:
            selected.append(result.observation.agent)
            assert not result.done
            result = client.step(AgentAction(agent=agent, text=text))
        assert result.done and result.observation.agent is None
    return selected, result.observation.record, result


def sessions(url: str) -> dict:
    return httpx.get(f"{url}/sessions", timeout=30).json()


def wait_until(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def wait_for_no_sessions(url: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        counts = sessions(url)
        if (counts["active_sessions"] == 0 and counts["browser_pages"] == 0) or time.monotonic() > deadline:
            return {k: counts[k] for k in ("active_sessions", "max_sessions", "browser_pages")}
        time.sleep(0.1)


@pytest.mark.parametrize("policy, seeds", [("oracle", (3, 8)), ("random", (5,))])
def test_an_episode_over_openenv_equals_the_in_process_one(hierarchy_server, scenario, world, policy, seeds):
    policies = ({role: OraclePolicy(scenario, role) for role in ("main", "sub")} if policy == "oracle"
                else {role: RandomPolicy(role, seed=7) for role in ("main", "sub")})
    env = mgrpo_env.raw_env(scenario=scenario, split=SPLIT, world=world)
    for seed in seeds:
        actions, record = play_in_process(env, policies, seed)
        selected, wire, result = replay(hierarchy_server.url, seed, actions)
        # the AEC order is the server's: the agent it selected each turn is the one that acted in process
        assert selected == [agent for agent, _ in actions]
        assert untimed(wire) == untimed(record)
        assert wire["rewards"] == record["rewards"] == result.observation.rewards
        assert result.reward == record["rewards"]["main_0"]
        assert result.observation.reward_components == record["components"]
        if policy == "oracle":  # the oracle solves it with one fresh sub-agent per hop: sub_0, sub_1, ...
            assert record["correct"] and record["subs"]
            assert [s["agent"] for s in wire["subs"]] == [f"sub_{i}" for i in range(len(record["subs"]))]
        else:  # random text: format failures, paid 0, as in process
            assert record["main"]["format_errors"] > 0 and record["rewards"]["main_0"] == 0.0
    env.close()


def test_a_single_agent_episode_over_openenv_equals_the_in_process_one(single_server, scenario, world):
    env = mgrpo_env.single_agent_env(scenario, SPLIT, world=world)
    oracle = OraclePolicy(scenario, "single")
    obs, info = env.reset(seed=4)
    actions = []
    done = False
    while not done:
        request = PolicyRequest(episode=0, agent="single_0", role="single", observation=obs["text"],
                                messages=info["messages"], task=env.task)
        text = oracle([request])[0]
        actions.append(("single_0", text))
        obs, reward, terminated, truncated, info = env.step(text)
        done = terminated or truncated
    selected, wire, result = replay(single_server.url, 4, actions)
    assert selected == ["single_0"] * len(actions)
    assert untimed(wire) == untimed(env.record.to_dict()) and wire["correct"]
    assert result.reward == reward == 1.0 and result.observation.terminated
    env.close()


def test_refused_messages_are_clear_errors_and_the_session_goes_on(hierarchy_server, scenario):
    with MGRPOEnvClient(hierarchy_server.url).sync() as client:
        first = client.reset(seed=1)
        assert first.observation.agent == "main_0" and first.observation.messages[0]["role"] == "system"
        # not the action schema: openenv-core's validation refuses it; nothing happened to the episode
        for bad in ({"agent": "main_0"}, {"agent": "main_0", "text": 3}, {"agent": "main_0", "text": "x", "extra": 1}):
            with pytest.raises(EnvServerError) as refused:
                client.step(bad)
            assert refused.value.code == "VALIDATION_ERROR"
        # an agent that is not the selected one: refused, naming the one that may act
        for agent in ("sub_0", "nobody"):
            with pytest.raises(EnvServerError, match="selected agent is 'main_0'") as refused:
                client.step(AgentAction(agent=agent, text="<answer>x</answer>"))
            assert refused.value.code == "EXECUTION_ERROR"
        assert client.state().step_count == 0
        # malformed text is no error: a format failure the agent reads, as in process
        result = client.step(AgentAction(agent="main_0", text="no tags at all"))
        assert result.observation.agent == "main_0" and "Error" in result.observation.text and not result.done
        result = client.step(AgentAction(agent="main_0", text="<think>t</think><answer>Nobody</answer>"))
        assert result.done and result.observation.terminated and result.observation.record["main"]["format_errors"] == 1
        assert result.reward == 0.0  # an invalid format pays nothing
        # a step after the end: refused, and a reset starts the next episode
        with pytest.raises(EnvServerError, match="is over \\(answer\\): reset\\(\\) to start another"):
            client.step(AgentAction(agent="main_0", text="<answer>again</answer>"))
        assert client.state().done
        built = sessions(hierarchy_server.url)["envs_built"]
        again = client.reset(seed=1)
        assert again.observation.text == first.observation.text and not again.done
        # one session per episode: the reset ran on a new session (a new env), the old one is closed
        assert sessions(hierarchy_server.url)["envs_built"] == built + 1
        assert wait_until(lambda: sessions(hierarchy_server.url)["active_sessions"] == 1)


def test_a_client_that_leaves_mid_episode_frees_its_session_and_pages(hierarchy_server, scenario):
    url = hierarchy_server.url
    assert wait_for_no_sessions(url) == {"active_sessions": 0, "max_sessions": 64, "browser_pages": 0}
    js_page = next(e for e in scenario.graph().entities if e.js)
    delegate = '<think>d</think><tool_call>{"name": "delegate", "arguments": {"task": "read a page"}}</tool_call>'
    visit = json.dumps({"name": "visit", "arguments": {"url": scenario.page_url(js_page.name), "goal": "facts"}})

    async def leave(wait_for_visit: bool) -> int:
        ws = await websockets.connect(url.replace("http", "ws") + "/ws")
        await ws.send(json.dumps({"type": "reset", "data": {"seed": 2}}))
        await ws.recv()
        await ws.send(json.dumps({"type": "step", "data": {"agent": "main_0", "text": delegate}}))
        assert json.loads(await ws.recv())["data"]["observation"]["agent"] == "sub_0"
        # a browser render under way when the client goes away (or done, for the other case)
        await ws.send(json.dumps({"type": "step", "data": {"agent": "sub_0", "text": f"<think>v</think><tool_call>{visit}</tool_call>"}}))
        if wait_for_visit:
            assert "Title:" in json.loads(await ws.recv())["data"]["observation"]["text"]
        open_now = sessions(url)["active_sessions"]
        ws.transport.abort() if hasattr(ws, "transport") else await ws.close()  # no close frame: a dropped client
        return open_now

    for wait_for_visit in (True, False):
        assert asyncio.run(leave(wait_for_visit)) == 1
        assert wait_for_no_sessions(url) == {"active_sessions": 0, "max_sessions": 64, "browser_pages": 0}


def test_concurrent_sessions_run_their_own_episodes(hierarchy_server, scenario):
    """Eight clients at once, each through a whole oracle episode; none sees another's, none leaks."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "openenv_sessions.py"
    spec = importlib.util.spec_from_file_location("openenv_sessions", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    stats = bench.run_sessions(hierarchy_server.url, scenario, sessions=8, duration_s=0.0, episodes_per_session=1, split=SPLIT)
    assert stats["errors"] == [] and stats["episodes"] == 8 and stats["correct"] == 8
    assert wait_for_no_sessions(hierarchy_server.url)["active_sessions"] == 0


def test_a_server_restart_is_a_clear_error_then_a_clean_reconnect(scenario):
    server = ServeEnvProcess(*server_args(scenario)).start()
    port = server.url.rsplit(":", 1)[1]
    client = MGRPOEnvClient(server.url, message_timeout_s=30).sync()
    try:
        client.connect()
        assert client.reset(seed=1).observation.agent == "main_0"
        assert server.stop() == 0  # SIGTERM: uvicorn closes the sessions, then the world
        started = time.monotonic()
        with pytest.raises(EnvConnectionLost, match="episode is lost; reset\\(\\) connects again"):
            client.step(AgentAction(agent="main_0", text="<answer>x</answer>"))
        assert time.monotonic() - started < 10  # an error at once, never a hung client
        with pytest.raises(EnvConnectionLost):  # nobody listens: a reset says so too
            client.reset(seed=1)
        server = ServeEnvProcess(*server_args(scenario)[:-2], "--port", port).start()
        result = client.reset(seed=1)  # the same client, a new connection and session
        result = client.step(AgentAction(agent="main_0", text="<think>t</think><answer>x</answer>"))
        assert result.done and result.observation.record["end_reason"] == "answer"
        assert sessions(server.url)["active_sessions"] == 1
    finally:
        client.close()
        server.stop()


def test_serve_env_refuses_a_bad_limit_and_a_port_in_use(scenario, hierarchy_server):
    port = hierarchy_server.url.rsplit(":", 1)[1]
    for extra, message in ((["--limit", "max_main_turns=0"], "bad --limit"), (["--port", port], "cannot bind")):
        args = server_args(scenario)[:-2] + extra if extra[0] == "--port" else server_args(scenario) + extra
        done = subprocess.run([sys.executable, "-m", "mgrpo_algo.cli", "serve-env", *args], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 2 and message in done.stderr


def test_serve_env_config_serves_the_runs_env_its_prompts_limits_and_rewards(scenario, tmp_path):
    """``--config`` serves the env a train config's runs use: here the demo's tiny profile (compact
    prompts), its limits and its R_M weights [0, 1] (a well-formed wrong answer pays 0, not the paper's 0.1)."""
    config = tmp_path / "run.yaml"
    config.write_text("scenario: wiki-hops\n"
                      f"scenario_kwargs: {{num_entities: 300, seed: 0, profile: tiny, data_dir: {scenario.data_dir}}}\n"
                      "limits: {max_main_turns: 2, max_sub_turns: 3, max_delegations: 1}\nmain_weights: [0.0, 1.0]\n")
    with ServeEnvProcess("--config", str(config), "--split", SPLIT, "--port", "0") as server, \
            MGRPOEnvClient(server.url).sync() as env:
        result = env.reset(seed=0)
        assert result.observation.messages[0]["content"] == "Main agent. Tools: delegate, reason. End: <answer>."
        result = env.step(AgentAction(agent="main_0", text="<answer>no such answer</answer>"))
        assert result.done and result.observation.reward_components["main_0"]["format_ok"]
        assert result.reward == 0.0
        env.reset(seed=0)
        env.step(AgentAction(agent="main_0", text="no tags"))
        result = env.step(AgentAction(agent="main_0", text="no tags"))
        assert result.done and result.observation.record["end_reason"] == "main_turn_limit"  # --config's limits


def test_the_server_and_client_modules_load_neither_torch_nor_the_web_ui():
    """The env never imports torch; openenv-core's Gradio UI (8 of its 12 s of import) is left out."""
    code = ("import sys, mgrpo_env.openenv_server, mgrpo_env.openenv_client; "
            "print([m for m in ('torch', 'gradio') if m in sys.modules]); import gradio")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"  # and a later ``import gradio`` still works (check=True)


# -- what a client may see: the reward's references stay on the server until the end ------------------

PUBLIC = ("id", "question", "split", "kind")
DELEGATE = '<think>d</think><tool_call>{"name": "delegate", "arguments": {"task": "read a page"}}</tool_call>'
ANSWER = "<think>t</think><answer>Nobody</answer>"


def full_tasks(scenario) -> dict[str, dict]:
    return {task.id: task.to_dict() for task in scenario.tasks(SPLIT)}


def assert_hidden(state, observation, full: dict) -> None:
    """Mid-episode: the state's task is the public part, and no reference the question does not
    itself name (the gold answer, an alias, a hop's answer) is anywhere in the state or the observation."""
    assert state.task == {k: full[k] for k in PUBLIC} and not state.answers_shown and not state.done
    secrets = [s for s in (full["answer"], *full["aliases"], *(h["answer"] for h in full["hops"]))
               if s and s.lower() not in full["question"].lower()]
    assert secrets, "this seed's task names its references in its question: nothing to look for"
    wire = json.dumps(state.model_dump(), ensure_ascii=False) + json.dumps(observation.model_dump(), ensure_ascii=False)
    assert [s for s in secrets if s in wire] == []
    assert observation.record is None and observation.reward_components == {}


@pytest.mark.parametrize("kind", ["hierarchy", "single"])
def test_state_keeps_the_answer_hops_and_aliases_until_the_episode_is_over(request, kind, scenario):
    server = request.getfixturevalue(f"{kind}_server")
    tasks = full_tasks(scenario)
    agent = "main_0" if kind == "hierarchy" else "single_0"
    with MGRPOEnvClient(server.url).sync() as client:
        result = client.reset(seed=3)
        full = tasks[client.state().task["id"]]
        assert full["hops"] and full["answer"]
        assert_hidden(client.state(), result.observation, full)
        if kind == "hierarchy":  # a sub-agent acting: still hidden
            result = client.step(AgentAction(agent=agent, text=DELEGATE))
            assert result.observation.agent == "sub_0"
            assert_hidden(client.state(), result.observation, full)
            result = client.step(AgentAction(agent="sub_0", text="<think>r</think><result>nothing found</result>"))
        result = client.step(AgentAction(agent=agent, text="no tags"))  # a format failure: the episode goes on
        assert not result.done
        assert_hidden(client.state(), result.observation, full)
        result = client.step(AgentAction(agent=agent, text=ANSWER))
        assert result.done
        state = client.state()  # over: the whole task, as the final record holds it
        assert state.answers_shown and state.done and state.task == full == result.observation.record["task"]


@pytest.mark.parametrize("kind", ["hierarchy", "single"])
def test_reveal_answers_shows_the_whole_task_during_the_episode(scenario, kind):
    tasks = full_tasks(scenario)
    extra = ("--reveal-answers", "--single") if kind == "single" else ("--reveal-answers",)
    with ServeEnvProcess(*server_args(scenario, *extra)) as server, MGRPOEnvClient(server.url).sync() as client:
        assert server.ready["reveal_answers"] is True and server.ready["env"] == kind
        client.reset(seed=3)
        state = client.state()
        assert state.answers_shown and not state.done and state.task == tasks[state.task["id"]]
        assert state.task["answer"] and state.task["hops"]


# -- out of turn, truncated: by value over the wire ---------------------------------------------------

def test_only_the_selected_agent_may_act_and_a_refused_turn_steps_nothing(hierarchy_server):
    stolen = "<think>t</think><result>stolen</result>"
    with MGRPOEnvClient(hierarchy_server.url).sync() as client:
        client.reset(seed=2)
        for agent in ("sub_0", "sub_1", "single_0", "nobody"):  # the main agent acts: everyone else is refused
            with pytest.raises(EnvServerError, match=f"agent '{agent}' may not act now: the selected agent is 'main_0'"):
                client.step(AgentAction(agent=agent, text=stolen))
        assert (client.state().step_count, client.state().agent) == (0, "main_0")
        assert client.step(AgentAction(agent="main_0", text=DELEGATE)).observation.agent == "sub_0"
        for agent in ("main_0", "sub_1", "nobody"):  # a sub-agent acts: the main agent too is refused
            with pytest.raises(EnvServerError, match=f"agent '{agent}' may not act now: the selected agent is 'sub_0'") as refused:
                client.step(AgentAction(agent=agent, text=stolen))
            assert refused.value.code == "EXECUTION_ERROR"
        assert (client.state().step_count, client.state().agent) == (1, "sub_0")
        report = "<think>r</think><result>what I found</result>"
        assert client.step(AgentAction(agent="sub_0", text=report)).observation.agent == "main_0"
        result = client.step(AgentAction(agent="main_0", text=ANSWER))
        record = result.observation.record
    # nothing of the refused turns reached the episode: each agent's turns are the accepted ones
    assert [t["action"] for t in record["main"]["turns"]] == [DELEGATE, ANSWER]
    assert [[t["action"] for t in s["turns"]] for s in record["subs"]] == [[report]]
    assert record["subs"][0]["final"] == "what I found" and record["final_answer"] == "Nobody"


@pytest.mark.parametrize("kind, limit, end", [("hierarchy", 8, "main_turn_limit"), ("single", 48, "turn_limit")])
def test_a_turn_limit_episode_is_truncated_and_an_answered_one_terminated(request, kind, limit, end):
    server = request.getfixturevalue(f"{kind}_server")
    agent = "main_0" if kind == "hierarchy" else "single_0"
    with MGRPOEnvClient(server.url).sync() as client:
        result, steps = client.reset(seed=1), 0
        while not result.done:  # malformed turns until the limit ends it
            result = client.step(AgentAction(agent=agent, text="no tags"))
            steps += 1
        obs = result.observation
        assert steps == limit and obs.agent is None
        assert (obs.terminated, obs.truncated, obs.done) == (False, True, True)
        assert (obs.record["end_reason"], obs.record["truncated"]) == (end, True)
        client.reset(seed=1)
        result = client.step(AgentAction(agent=agent, text=ANSWER))
        obs = result.observation
        assert (obs.terminated, obs.truncated, obs.done, result.done) == (True, False, True, True)
        assert (obs.record["end_reason"], obs.record["truncated"]) == ("answer", False)
