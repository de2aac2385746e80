"""OpenAICompatiblePolicy against a loopback server speaking vLLM's /v1/completions fields."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mgrpo_algo.core.sequences import trajectory_sequence
from mgrpo_algo.policies.chat_tokens import ChatPrompter
from mgrpo_algo.policies.http_policy import OpenAICompatiblePolicy, PolicyError, completions_url
from mgrpo_algo.policies.models import train_tokenizer
from mgrpo_env.rollout import PolicyRequest

ACTION = '<think>search</think><tool_call>{"name": "search", "arguments": {"queries": ["Velmora"]}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = [ACTION, "<answer>1911</answer>", "You are a research agent. Who founded Velmora Press?"] * 20
    return train_tokenizer(texts, tmp_path_factory.mktemp("tok"), vocab_size=320)


class FakeVLLM:
    """A loopback /v1/completions server. ``script`` lists the replies to give, in order
    ("ok", "500", "503", "400", "badjson", "ids_in_tokens", "no_logprobs", "drop": close the connection
    without a reply, "hang": no reply until the server closes); after it runs out: "ok"."""

    def __init__(self, completion_ids: list[int]) -> None:
        self.completion_ids = completion_ids
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.script: list[str] = []
        self.lock = threading.Lock()
        self.release = threading.Event()  # ends the "hang" replies
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.bodies.append(body)
                    fake.headers.append(dict(self.headers))
                    mode = fake.script.pop(0) if fake.script else "ok"
                if self.path != "/v1/completions":
                    return self._send(404, b'{"error": "not found"}')
                if mode in ("500", "503", "400"):
                    return self._send(int(mode), b'{"object": "error", "message": "boom"}')
                if mode == "drop":  # the connection closed without a reply (a server killed mid-request)
                    self.close_connection = True
                    return self.connection.close()
                if mode == "hang":  # no reply until the test ends (a hung engine)
                    fake.release.wait(timeout=30)
                    self.close_connection = True
                    return None
                if mode == "badjson":
                    return self._send(200, b"{not json")
                ids = fake.completion_ids
                logprobs = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids),
                            "top_logprobs": [None] * len(ids), "text_offset": list(range(len(ids)))}
                choice = {"index": 0, "text": "ignored", "logprobs": logprobs, "finish_reason": "stop",
                          "stop_reason": ids[-1]}
                if mode == "no_logprobs":
                    choice["logprobs"] = None
                if mode != "ids_in_tokens":
                    choice["token_ids"] = ids
                    choice["prompt_token_ids"] = body["prompt"]
                reply = {"id": "cmpl-1", "object": "text_completion", "model": body["model"], "choices": [choice],
                         "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)}}
                return self._send(200, json.dumps(reply).encode())

            def _send(self, status, payload):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def server(tokenizer):
    fake = FakeVLLM(tokenizer.encode(ACTION, add_special_tokens=False))
    yield fake
    fake.close()


def _policy(server, tokenizer, **kw):
    defaults = {"role": "sub", "tokenizer": tokenizer, "max_new_tokens": 64, "temperature": 0.9, "top_p": 0.95,
                "api_key": "secret", "timeout_s": 5, "max_retries": 2, "backoff_s": 0.01, "seed": 11}
    return OpenAICompatiblePolicy(server.url, "tiny-sub", **{**defaults, **kw})


def _request(content, episode=0, messages=None, history=None):
    messages = messages or [{"role": "system", "content": "You are a research agent."}, {"role": "user", "content": content}]
    return PolicyRequest(episode, f"sub_{episode}", "sub", content, messages, None, history or [])


def test_request_body_and_parsed_response(server, tokenizer):
    requests = [_request("Who founded Velmora Press?", i) for i in range(3)]
    with _policy(server, tokenizer) as policy:
        responses = policy(requests)
    assert len(server.bodies) == 3  # one HTTP request per agent request
    prompter = ChatPrompter(tokenizer)
    expected_prompt = prompter.first_prompt(requests[0].messages)
    for body in server.bodies:
        assert body["model"] == "tiny-sub"
        assert body["prompt"] == expected_prompt  # token ids, not text
        assert (body["max_tokens"], body["temperature"], body["top_p"], body["n"]) == (64, 0.9, 0.95, 1)
        assert (body["top_k"], body["min_p"], body["repetition_penalty"]) == (-1, 0.0, 1.0)
        assert body["logprobs"] == 0 and body["return_tokens_as_token_ids"] and body["return_token_ids"]
        assert body["include_stop_str_in_output"] and body["skip_special_tokens"] is False
        stop_ids = {tokenizer.convert_tokens_to_ids(t) for t in ("</tool_call>", "</answer>", "</result>", "<|im_end|>")}
        assert stop_ids <= set(body["stop_token_ids"]) and body["stop"] == []  # every tag is one token here
    assert len({b["seed"] for b in server.bodies}) == 3  # distinct, reproducible seeds
    assert all(h.get("Authorization") == "Bearer secret" for h in server.headers)
    action_ids = tokenizer.encode(ACTION, add_special_tokens=False)
    for response in responses:
        assert response.text == ACTION  # decoded from the ids
        assert response.extra["completion_ids"] == action_ids
        assert response.extra["logprobs"] == [-0.5] * len(action_ids)
        assert response.extra["prompt_ids"] == expected_prompt
        assert response.extra["policy"] == "http:tiny-sub" and response.extra["finish_reason"] == "stop"


def test_ids_are_read_from_token_id_strings_when_token_ids_are_absent(server, tokenizer):
    server.script = ["ids_in_tokens"]
    with _policy(server, tokenizer) as policy:
        response = policy([_request("Q")])[0]
    assert response.extra["completion_ids"] == tokenizer.encode(ACTION, add_special_tokens=False)


def test_second_turn_sends_the_nested_prompt(server, tokenizer):
    with _policy(server, tokenizer) as policy:
        first = policy([_request("Who founded Velmora Press?")])[0]
        observation = "<tool_response>\nno results\n</tool_response>"
        messages = [*_request("Who founded Velmora Press?").messages, {"role": "assistant", "content": first.text},
                    {"role": "user", "content": observation}]
        second = policy([_request(observation, messages=messages, history=[first.extra])])[0]
    prefix = first.extra["prompt_ids"] + first.extra["completion_ids"]
    assert server.bodies[1]["prompt"][: len(prefix)] == prefix
    assert server.bodies[1]["prompt"] == ChatPrompter(tokenizer).first_prompt(messages)
    trajectory_sequence([first.extra, second.extra])


def test_transient_failures_are_retried(server, tokenizer):
    server.script = ["500", "badjson"]
    with _policy(server, tokenizer) as policy:
        response = policy([_request("Q")])[0]
    assert response.text == ACTION and len(server.bodies) == 3


@pytest.mark.parametrize(("script", "attempts", "message"), [
    (["500"] * 5, 3, "HTTP 500"),
    (["badjson"] * 5, 3, "malformed reply"),
    (["no_logprobs"] * 5, 3, "no logprobs"),
    (["400"], 1, "HTTP 400"),  # a client error is not retried
])
def test_persistent_errors_raise_policy_error(server, tokenizer, script, attempts, message):
    server.script = list(script)
    with _policy(server, tokenizer) as policy, pytest.raises(PolicyError, match=message):
        policy([_request("Q")])
    assert len(server.bodies) == attempts


def test_unreachable_server_raises_policy_error(tokenizer):
    policy = OpenAICompatiblePolicy("http://127.0.0.1:9", "m", role="main", tokenizer=tokenizer, timeout_s=1,
                                    max_retries=1, backoff_s=0.01)
    with pytest.raises(PolicyError, match="after 2 attempts"):
        policy([_request("Q")])


def test_too_long_prompts_are_not_sent(server, tokenizer):
    with _policy(server, tokenizer, max_prompt_tokens=10) as policy:
        response = policy([_request("Who founded Velmora Press? " * 10)])[0]
    assert response.text == "" and response.extra["finish_reason"] == "prompt_too_long" and not server.bodies


def test_completions_url():
    assert completions_url("http://h:8000") == "http://h:8000/v1/completions"
    assert completions_url("http://h:8000/v1/") == "http://h:8000/v1/completions"
    assert completions_url("http://h:8000/v1/completions") == "http://h:8000/v1/completions"


# -- with an engine to supervise (a VLLMServer this run started): what the policy asks it, and when ---------

class Engine:
    """A supervisor standing in for VLLMServer: records every ``ensure_up(problem)`` and answers ``verdict``;
    a restart ("restarted" / "waited") also empties the server's script (the new server answers)."""

    def __init__(self, server: FakeVLLM, verdict: str) -> None:
        self.server, self.verdict, self.problems = server, verdict, []

    def ensure_up(self, problem: str) -> str:
        self.problems.append(problem)
        if self.verdict != "up":
            self.server.script.clear()
        return self.verdict


@pytest.mark.parametrize(("mode", "error"), [("drop", "RemoteProtocolError"), ("hang", "ReadTimeout")])
def test_a_dropped_or_timed_out_request_asks_the_engine_and_is_resent_at_once_after_a_restart(server, tokenizer, mode, error,
                                                                                              capsys):
    server.script = [mode] * 5
    engine = Engine(server, "restarted")
    with _policy(server, tokenizer, engine=engine, backoff_s=30.0, wait_s=60.0, timeout_s=0.5) as policy:
        response = policy([_request("Q")])[0]
        assert policy.outages == []  # the engine's own line said what happened: no outage line, no backoff
    assert response.text == ACTION and len(server.bodies) == 2 and server.bodies[0] == server.bodies[1]  # same ids, seed
    assert len(engine.problems) == 1 and engine.problems[0].startswith(f"{error}: ")
    assert "served engine" not in capsys.readouterr().out


def test_an_engine_that_is_up_leaves_the_retry_to_the_backoff_with_one_outage_line(server, tokenizer, capsys):
    server.script = ["drop", "drop"]
    engine = Engine(server, "up")
    with _policy(server, tokenizer, engine=engine, wait_s=5.0, max_retries=0) as policy:
        response = policy([_request("Q")])[0]
        assert len(policy.outages) == 1
    assert response.text == ACTION and len(server.bodies) == 3 and len(engine.problems) == 2
    assert policy.outages[0].startswith("served engine sub: RemoteProtocolError: ") and policy.outages[0].endswith(
        "retrying for up to 5 s")
    assert capsys.readouterr().out.count("served engine sub:") == 1  # one line per batch, not per retry


def test_an_http_error_is_retried_without_asking_the_engine(server, tokenizer):
    """A 503 came from a server that answers: retried with backoff; the supervisor is for dead or hung ones."""
    server.script = ["503", "503"]
    engine = Engine(server, "restarted")
    with _policy(server, tokenizer, engine=engine) as policy:
        assert policy([_request("Q")])[0].text == ACTION
    assert len(server.bodies) == 3 and engine.problems == []


def test_an_engine_that_stays_down_ends_in_a_policy_error_after_every_retry(server, tokenizer):
    server.script = ["drop"] * 10
    engine = Engine(server, "up")
    with _policy(server, tokenizer, engine=engine, max_retries=2) as policy, pytest.raises(
            PolicyError, match=r"^RemoteProtocolError: .* \(after 3 attempts, \d+ s\)$"):
        policy([_request("Q")])
    assert len(server.bodies) == 3 and len(engine.problems) == 3
