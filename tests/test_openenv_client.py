"""The OpenEnv client (:class:`mgrpo_env.openenv_client.MGRPOEnvClient`) against the real server run in
process: openenv-core's app over the session envs (:func:`create_app`), served by uvicorn in a thread on
127.0.0.1, so that mutation testing sees the client (and the server) it imports. By value: what a reset,
a step and ``state()`` give, one server session per episode, the typed refusals, a server that stops
(then comes back on its port) and one that never answers.

tests/test_openenv.py checks the same client against ``mgrpo serve-env`` in a child process (the
command line, Chromium pages, concurrent sessions); a child runs the checkout's code, not mutmut's copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
import websockets
from test_openenv import sessions as open_sessions
from test_openenv import wait_until
from websockets.exceptions import ConnectionClosed

from mgrpo_env.core import Limits
from mgrpo_env.openenv_client import EnvConnectionLost, EnvServerError, MGRPOEnvClient
from mgrpo_env.openenv_server import EnvSpec, create_app
from mgrpo_env.openenv_types import AgentAction

SPLIT = "stage2/test"
DELEGATE = '<think>d</think><tool_call>{"name": "delegate", "arguments": {"task": "read a page"}}</tool_call>'
REPORT = "<think>r</think><result>found it</result>"


@contextlib.contextmanager
def serving(app, port: int = 0) -> Iterator[str]:
    """``app`` served by uvicorn in a thread on 127.0.0.1 (``port`` 0: a free one); its URL. Leaving the
    block shuts it down as SIGTERM does: open WebSockets closed (their sessions with them), then the thread."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", ws="websockets-sansio", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the in-process server did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        assert not thread.is_alive(), "the in-process server did not stop"


@contextlib.contextmanager
def scripted_peer() -> Iterator[tuple[str, list[str]]]:
    """A WebSocket peer on 127.0.0.1 that is not an env server: per connection n (from 1) it answers a
    message whose data holds ``hang`` never, ``bare`` with an error without data, ``empty`` with a reply
    without an observation, reward or done, anything else with
    ``{"type": "error", "data": {"code": "PEER", "message": "connection <n>"}}``. Yields its URL and the
    events it saw (``open <n>``, ``closed <n>``)."""
    events: list[str] = []
    ready = threading.Event()
    state: dict = {}

    async def handler(ws) -> None:
        n = sum(e.startswith("open") for e in events) + 1
        events.append(f"open {n}")
        try:
            async for raw in ws:
                data = json.loads(raw).get("data", {})
                if data.get("hang"):
                    continue
                reply = {"type": "error"} if data.get("bare") else {"type": "observation", "data": {}} if data.get("empty") \
                    else {"type": "error", "data": {"code": "PEER", "message": f"connection {n}"}}
                await ws.send(json.dumps(reply))
        except ConnectionClosed:
            pass
        events.append(f"closed {n}")

    async def main() -> None:
        state["stop"] = asyncio.get_running_loop().create_future()
        async with websockets.serve(handler, "127.0.0.1", 0) as server:
            state["port"] = server.sockets[0].getsockname()[1]
            ready.set()
            await state["stop"]

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield f"http://127.0.0.1:{state['port']}", events
    finally:
        loop.call_soon_threadsafe(state["stop"].set_result, None)
        thread.join(30)
        loop.close()


@pytest.fixture(scope="module")
def spec(small_scenario, small_world):
    return EnvSpec(small_scenario, SPLIT, small_world, Limits(max_main_turns=3))


@pytest.fixture(scope="module")
def url(spec) -> Iterator[str]:
    with serving(create_app(spec)) as served:
        yield served


@pytest.fixture(scope="module")
def answers(small_scenario) -> dict[str, str]:
    return {task.id: task.answer for task in small_scenario.tasks(SPLIT)}


def test_the_clients_timeouts_and_url():
    client = MGRPOEnvClient("http://127.0.0.1:9")
    assert (client._ws_url, client._message_timeout, client._connect_timeout) == ("ws://127.0.0.1:9/ws", 120.0, 60.0)
    client = MGRPOEnvClient("ws://127.0.0.1:9", message_timeout_s=5.0, connect_timeout_s=2.0, max_message_size_mb=1)
    assert (client._message_timeout, client._connect_timeout, client._max_message_size) == (5.0, 2.0, 2**20)


def test_reset_step_and_state_by_value(url, answers):
    with MGRPOEnvClient(url).sync() as client:
        first = client.reset(seed=1, episode_id="e-7")
        obs = first.observation
        assert (first.reward, first.done, obs.reward, obs.done, obs.agent, obs.terminated) == (0.0, False, 0.0, False, "main_0", False)
        assert obs.messages[0]["role"] == "system" and obs.text == obs.messages[-1]["content"] and obs.record is None
        state = client.state()
        task_id = state.task["id"]
        assert (state.episode_id, state.step_count, state.env, state.scenario, state.split, state.agent, state.done,
                state.answers_shown) == ("e-7", 0, "hierarchy", "wiki-hops", SPLIT, "main_0", False, False)
        assert set(state.task) == {"id", "question", "split", "kind"} and state.task["question"] in obs.text
        # a plain dict is an action too; the action's metadata stays with the client (it need not be JSON)
        sub = client.step({"agent": "main_0", "text": DELEGATE})
        assert (sub.observation.agent, sub.observation.agents, sub.done, sub.reward) == ("sub_0", ["main_0", "sub_0"], False, 0.0)
        back = client.step(AgentAction(agent="sub_0", text=REPORT, metadata={"sampled": datetime.date(2024, 1, 1)}))
        assert (back.observation.agent, client.state().step_count) == ("main_0", 2)
        end = client.step(AgentAction(agent="main_0", text=f"<think>a</think><answer>{answers[task_id]}</answer>"))
        obs = end.observation
        assert (end.reward, end.done, obs.reward, obs.done, obs.terminated, obs.truncated, obs.agent) == (1.0, True, 1.0, True, True, False, None)
        assert obs.rewards["main_0"] == 1.0 and obs.record["correct"] and obs.record["episode_id"] == "e-7"
        assert obs.reward_components["main_0"]["correct"] == 1.0
        assert client.state().answers_shown and client.state().task["answer"] == answers[task_id]


def test_each_episode_runs_on_a_fresh_session_and_the_last_one_is_closed(url, spec):
    client = MGRPOEnvClient(url).sync()
    try:
        built = spec.envs_built
        client.reset(seed=1)
        client.step(AgentAction(agent="main_0", text=DELEGATE))
        assert spec.envs_built == built + 1 and open_sessions(url)["active_sessions"] == 1
        again = client.reset(seed=1)  # a new session: its episode starts afresh, the old session is closed
        assert (again.observation.agent, client.state().step_count) == ("main_0", 0)
        assert spec.envs_built == built + 2 and wait_until(lambda: open_sessions(url)["active_sessions"] == 1)
        client.reset(seed=2)
        assert spec.envs_built == built + 3
        client.disconnect()
        assert wait_until(lambda: open_sessions(url)["active_sessions"] == 0)
        client.reset(seed=2)  # after a disconnect: connects again, one session
        assert spec.envs_built == built + 4 and open_sessions(url)["active_sessions"] == 1
    finally:
        client.close()


def test_refusals_are_typed_errors_and_the_session_goes_on(url):
    with MGRPOEnvClient(url).sync() as client:
        client.reset(seed=1)
        with pytest.raises(EnvServerError) as refused:
            client.step(AgentAction(agent="sub_0", text=REPORT))
        message = "agent 'sub_0' may not act now: the selected agent is 'main_0'"
        assert str(refused.value) == f"the env server refused the message (EXECUTION_ERROR): {message}"
        assert (refused.value.code, refused.value.server_message) == ("EXECUTION_ERROR", message)
        assert refused.value.details == {"code": "EXECUTION_ERROR", "message": message}
        with pytest.raises(EnvServerError) as refused:  # not the schema: openenv-core's errors appended
            client.step({"agent": "main_0"})
        errors = refused.value.details["errors"]
        assert [(e["loc"], e["msg"]) for e in errors] == [(["text"], "Field required")]
        assert refused.value.code == "VALIDATION_ERROR"
        assert refused.value.server_message == f"Invalid message: {errors}"
        assert client.step(AgentAction(agent="main_0", text=DELEGATE)).observation.agent == "sub_0"
    assert EnvServerError("m", "C").details == {}


def test_a_stopped_server_loses_the_episode_at_once_and_a_restarted_one_serves_the_same_client(spec):
    app = create_app(spec)
    client = MGRPOEnvClient("http://127.0.0.1:1").sync()  # the URL is set below, once the port is known
    try:
        with serving(app) as served:
            port = int(served.rsplit(":", 1)[1])
            client = MGRPOEnvClient(served, message_timeout_s=30).sync()
            client.reset(seed=1)
        started = time.monotonic()
        with pytest.raises(EnvConnectionLost) as lost:
            client.step(AgentAction(agent="main_0", text=DELEGATE))
        assert time.monotonic() - started < 10  # at once, not after the message timeout
        assert str(lost.value).startswith(f"the env server at ws://127.0.0.1:{port}/ws closed the connection (")
        assert str(lost.value).endswith("): this session's episode is lost; reset() connects again and starts a new one")
        assert isinstance(lost.value.__cause__, ConnectionClosed)
        with pytest.raises(EnvConnectionLost, match=r"closed the connection \(Failed to connect"):
            client.reset(seed=1)  # nobody listens
        with serving(app, port):
            assert client.reset(seed=1).observation.agent == "main_0"
            assert client.step(AgentAction(agent="main_0", text=DELEGATE)).observation.agent == "sub_0"
    finally:
        client.close()


def test_a_server_that_does_not_answer_in_time_loses_the_episode_and_the_socket_is_closed():
    with scripted_peer() as (peer, events):
        client = MGRPOEnvClient(peer, message_timeout_s=0.5).sync()
        try:
            started = time.monotonic()
            with pytest.raises(EnvConnectionLost) as lost:
                client.reset(hang=True)
            assert 0.5 <= time.monotonic() - started < 5
            assert str(lost.value) == (f"the env server at {peer.replace('http', 'ws')}/ws did not answer in time: this "
                                       "session's episode is lost; reset() connects again and starts a new one")
            assert isinstance(lost.value.__cause__, TimeoutError)
            assert wait_until(lambda: "closed 1" in events, 5)  # the client closed its broken socket
            # the next message goes on a new connection, and an error without data is still a typed one
            with pytest.raises(EnvServerError, match=r"^the env server refused the message \(PEER\): connection 2$"):
                client.reset(seed=0)
            with pytest.raises(EnvServerError) as bare:
                client.reset(bare=True)
            assert (str(bare.value), bare.value.code, bare.value.details) == (
                "the env server refused the message (UNKNOWN): unknown error", "UNKNOWN", {})
            assert events == ["open 1", "closed 1", "open 2"]
            # a reply without an observation, reward or done: an empty observation, not done, no reward
            empty = client.reset(empty=True)
            assert (empty.done, empty.reward, empty.observation.done, empty.observation.reward) == (False, None, False, None)
            assert empty.done is False and (empty.observation.agent, empty.observation.text) == (None, "")
        finally:
            client.close()
