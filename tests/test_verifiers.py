"""Verifiers: hand-computed EM / F1 values, and the LLM judge against a loopback OpenAI-compatible server."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mgrpo_scenarios.base import Task
from mgrpo_scenarios.verifiers import (
    AnswerVerifier,
    JudgeError,
    LLMJudge,
    exact_match,
    normalize_answer,
    parse_correctness,
    parse_grade,
    token_f1,
)

# ----------------------------------------------------------------------------- normalisation, EM, F1


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Velmora Press.", "velmora press"),
        ("  an   Apple  ", "apple"),
        ("New-York", "new york"),
        ("O'Brien", "obrien"),
        ("O\u2019Brien", "obrien"),
        ("1,000,000", "1000000"),
        ("3.5 km", "3.5 km"),
        ("Ｖｅｌｍｏｒａ１２", "velmora12"),  # NFKC folds full-width letters and digits
        ("Ω  (ohm)", "ω ohm"),
        ("Théâtre", "théâtre"),
        ("", ""),
        ("a the an", ""),
        ("theatre", "theatre"),  # articles only as whole words
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_exact_match_with_aliases() -> None:
    assert exact_match("the velmora press", "Velmora Press")
    assert not exact_match("Velmora", "Velmora Press")
    assert exact_match("VP", "Velmora Press", aliases=("V.P.", "VP"))
    assert exact_match("1,901", "1901")
    assert not exact_match("", "x")


def test_token_f1_hand_computed() -> None:
    # pred tokens [ada, lin, founder], gold [ada, lin]: p = 2/3, r = 1, F1 = 0.8
    assert token_f1("Ada Lin, founder", "Ada Lin") == pytest.approx(0.8)
    # pred [ada], gold [ada, lin]: p = 1, r = 1/2, F1 = 2/3
    assert token_f1("Ada", "Ada Lin") == pytest.approx(2 / 3)
    # duplicates count once per occurrence: pred [a b b], gold [b b c] ("a" is an article: dropped) ->
    # pred [b b] vs gold [b b c]: common 2, p = 1, r = 2/3, F1 = 0.8
    assert token_f1("a b b", "b b c") == pytest.approx(0.8)
    assert token_f1("Kestrel", "Ada Lin") == 0.0
    assert token_f1("", "") == 1.0
    assert token_f1("the", "Ada") == 0.0  # normalises to empty vs non-empty
    # maximum over gold and aliases
    assert token_f1("Ada", "Ada Lin", aliases=("Ada",)) == 1.0


def test_verifier_without_judge() -> None:
    task = Task(id="t", question="Who founded Velmora Press?", answer="Ada Lin", aliases=("A. Lin",))
    v = AnswerVerifier().verify(task, "ada lin")
    assert v.correct and v.score == 1.0 and v.details["method"] == "exact_match"
    v = AnswerVerifier().verify(task, "a lin")  # "a" is an article: "lin" vs alias "a lin" -> "lin"
    assert v.correct
    v = AnswerVerifier().verify(task, "Ada Lindqvist")
    assert not v.correct and v.score == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("CORRECT", True),
        ("INCORRECT", False),
        ("correct.", True),
        ("The answer is NOT correct", False),
        ("<think>maybe CORRECT? no.</think>INCORRECT", False),
        ("<think>it looks INCORRECT at first</think>\n\nCORRECT", True),
        ("Verdict: **CORRECT**", True),
        ("I cannot tell", None),
        ("", None),
    ],
)
def test_parse_correctness(reply: str, expected: bool | None) -> None:
    assert parse_correctness(reply) is expected


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("7", 7),
        ("Score: 10", 10),
        ("grade = 3/10", 3),
        ("I'd say 8/10.", 8),
        ("0", 0),
        ("eleven", None),
        ("42", None),
    ],
)
def test_parse_grade(reply: str, expected: int | None) -> None:
    assert parse_grade(reply) == expected


# ----------------------------------------------------------------------------- a loopback judge server


class _JudgeServer:
    """Records request bodies and answers with queued (status, reply text) pairs; the last one repeats."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.paths: list[str] = []
        self.script: list[tuple[int, str]] = [(200, "CORRECT")]
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                outer.requests.append(json.loads(self.rfile.read(length)))
                outer.headers.append(dict(self.headers))
                outer.paths.append(self.path)
                status, text = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                if status == 200:
                    payload = {
                        "id": "x",
                        "object": "chat.completion",
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": text},
                                "finish_reason": "stop",
                            }
                        ],
                    }
                    body = json.dumps(payload).encode()
                else:
                    body = json.dumps({"error": {"message": text}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def judge_server():
    server = _JudgeServer()
    yield server
    server.close()


def _judge(server: _JudgeServer, **kw) -> LLMJudge:
    kw.setdefault("backoff_s", 0.0)
    return LLMJudge(server.base_url, "judge-model", api_key="sk-test", timeout_s=5, **kw)


def test_judge_request_body_and_verdicts(judge_server: _JudgeServer) -> None:
    judge = _judge(judge_server)
    judge_server.script = [(200, "CORRECT"), (200, "INCORRECT")]
    v = judge.judge("Who founded Velmora Press?", "Ada Lin", "It was Ada Lin.", aliases=("A. Lin",))
    assert v.correct and v.score == 1.0 and v.details["raw"] == "CORRECT"
    body = judge_server.requests[0]
    assert judge_server.paths[0] == "/v1/chat/completions"
    assert body["model"] == "judge-model"
    assert body["temperature"] == 0.0
    [message] = body["messages"]
    assert message["role"] == "user"
    for part in (
        "Who founded Velmora Press?",
        "Ada Lin",
        "It was Ada Lin.",
        "A. Lin",
        "CORRECT or INCORRECT",
    ):
        assert part in message["content"]
    assert judge_server.headers[0]["Authorization"] == "Bearer sk-test"
    v = judge.judge("q", "gold", "pred")
    assert not v.correct and v.score == 0.0


def test_judge_unparseable_reply_is_incorrect(judge_server: _JudgeServer) -> None:
    judge_server.script = [(200, "I am not sure.")]
    v = _judge(judge_server).judge("q", "gold", "pred")
    assert not v.correct and v.details["parse_error"] is True


def test_score_subtask(judge_server: _JudgeServer) -> None:
    judge = _judge(judge_server)
    judge_server.script = [(200, "Score: 7/10"), (200, "no idea")]
    assert judge.score_subtask(
        "Find the founder of Velmora Press", "Ada Lin", "Ada Lin founded it."
    ) == pytest.approx(0.7)
    content = judge_server.requests[0]["messages"][0]["content"]
    assert (
        "Find the founder of Velmora Press" in content
        and "Ada Lin founded it." in content
        and "0 to 10" in content
    )
    v = judge.grade_subtask("t", "g", "r")
    assert v.score == 0.0 and v.details["parse_error"] is True


def test_judge_retries_after_500(judge_server: _JudgeServer) -> None:
    judge_server.script = [(500, "boom"), (503, "busy"), (200, "CORRECT")]
    assert _judge(judge_server, max_retries=2).judge("q", "g", "p").correct
    assert len(judge_server.requests) == 3


def test_judge_gives_up_after_retries(judge_server: _JudgeServer) -> None:
    judge_server.script = [(500, "boom")]
    with pytest.raises(JudgeError, match="after 2 attempts.*HTTP 500"):
        _judge(judge_server, max_retries=1).judge("q", "g", "p")
    assert len(judge_server.requests) == 2


def test_judge_client_error_is_not_retried(judge_server: _JudgeServer) -> None:
    judge_server.script = [(400, "bad model")]
    with pytest.raises(JudgeError, match="HTTP 400"):
        _judge(judge_server).judge("q", "g", "p")
    assert len(judge_server.requests) == 1


def test_judge_down_raises_judge_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    judge = LLMJudge(f"http://127.0.0.1:{port}/v1", "m", timeout_s=1, max_retries=1, backoff_s=0.0)
    with pytest.raises(JudgeError, match="failed after 2 attempts"):
        judge.judge("q", "g", "p")


def test_api_key_from_environment(monkeypatch: pytest.MonkeyPatch, judge_server: _JudgeServer) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("MGRPO_JUDGE_API_KEY", "sk-env")
    LLMJudge(judge_server.base_url, "m", backoff_s=0.0).judge("q", "g", "p")
    assert judge_server.headers[-1]["Authorization"] == "Bearer sk-env"
    monkeypatch.delenv("MGRPO_JUDGE_API_KEY")
    LLMJudge(judge_server.base_url, "m", backoff_s=0.0).judge("q", "g", "p")
    assert "Authorization" not in judge_server.headers[-1]


def test_verifier_asks_judge_only_when_em_fails(judge_server: _JudgeServer) -> None:
    task = Task(id="t", question="Who founded Velmora Press?", answer="Ada Lin")
    verifier = AnswerVerifier(judge=_judge(judge_server))
    v = verifier.verify(task, "Ada Lin")
    assert v.correct and not judge_server.requests
    judge_server.script = [(200, "CORRECT")]
    v = verifier.verify(task, "The founder was the printer Ada Lin")
    assert v.correct and v.score == 1.0 and v.details["method"] == "llm_judge"
    assert v.details["judge"]["raw"] == "CORRECT"
    judge_server.script = [(200, "INCORRECT")]
    v = verifier.verify(task, "Ada Lindqvist")
    assert not v.correct and v.score == pytest.approx(0.5)
    assert len(judge_server.requests) == 2
    v = verifier.verify(task, "   ")  # nothing to judge
    assert not v.correct and len(judge_server.requests) == 2
