"""GAIA, XBench-DeepSearch and WebWalkerQA loaders, their scoring rules, and an evaluation run against a
loopback site standing in for the open web (pages + a SearxNG-style JSON search + a judge endpoint)."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

import mgrpo_scenarios
from mgrpo_algo.experiments.evaluate import evaluate
from mgrpo_scenarios import Scenario, Task
from mgrpo_scenarios.web_qa import (
    Gaia,
    OpenWebWorld,
    WebWalkerQA,
    XBenchDeepSearch,
    default_cache_path,
    gaia_match,
    gaia_normalize_number,
    make_search_backend,
    xbench_decrypt,
    xbench_encrypt,
)

FIXTURES = Path(__file__).parent / "fixtures"
GAIA_DIR = FIXTURES / "gaia"
XBENCH_DIR = FIXTURES / "xbench"
WEBWALKER_FILE = FIXTURES / "webwalkerqa" / "main.json"


def _xbench_builder() -> Any:
    spec = importlib.util.spec_from_file_location("xbench_build_fixture", XBENCH_DIR / "build_fixture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _no_env_backends(monkeypatch):
    monkeypatch.delenv("MGRPO_SEARXNG_URL", raising=False)
    monkeypatch.delenv("BRAVE_SEARCH_API_KEY", raising=False)


# ----------------------------------------------------------------------------- GAIA


def test_gaia_loads_validation_with_levels_and_attachments():
    scenario = Gaia(GAIA_DIR)
    assert isinstance(scenario, Scenario)
    assert scenario.metadata["version"]
    assert scenario.splits() == ["validation", "test"]
    tasks = list(scenario.tasks("validation"))
    assert len(tasks) == 4
    assert [t.metadata["level"] for t in tasks] == [1, 2, 3, 1]
    assert [t.kind for t in tasks] == ["level1", "level2", "level3", "level1"]
    assert tasks[0].id == "a1f0c2d4-0001-4e7a-9b11-000000000001"
    assert tasks[0].answer == "17" and tasks[0].metadata["file_path"] is None
    assert tasks[0].metadata["annotator_metadata"]["Number of steps"] == "3"

    csv_task = tasks[1]
    assert csv_task.metadata["file_name"] == "b2c3d4e5-ledger.csv"
    assert Path(csv_task.metadata["file_path"]).is_file()
    assert csv_task.question.startswith(csv_task.metadata["raw_question"])
    assert "1877,Morning Lark,220" in csv_task.question  # text attachment inlined
    assert "truncated" not in csv_task.question

    png_task = tasks[2]
    assert "c3d4e5f6-door.png" in png_task.question and "image/png" in png_task.question
    assert "binary" in png_task.question and "\x89PNG" not in png_task.question

    test_tasks = list(scenario.tasks("test"))
    assert len(test_tasks) == 1 and test_tasks[0].answer == "?"


def test_gaia_long_attachment_is_truncated_with_a_note(tmp_path):
    split = tmp_path / "validation"
    split.mkdir()
    (split / "notes.txt").write_text("x" * 500)
    row = {"task_id": "t1", "Question": "Count the x.", "Level": "2", "Final answer": "500",
           "file_name": "notes.txt", "Annotator Metadata": {}}
    (split / "metadata.jsonl").write_text(json.dumps(row) + "\n")
    task = next(Gaia(tmp_path, attachment_chars=100).tasks("validation"))
    assert "x" * 100 in task.question and "x" * 101 not in task.question
    assert "truncated: showing the first 100 of 500 characters" in task.question
    assert task.metadata["level"] == 2
    # a metadata.jsonl file given directly works too
    assert next(Gaia(split / "metadata.jsonl").tasks()).id == "t1"


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("17", "17", True),
        ("17.0", "17", True),
        ("$1,250", "1250", True),
        ("45%", "45", True),
        ("2.50", "2.5", True),
        ("seventeen", "17", False),
        ("17 bridges", "17", False),
        ("Kestrel, Morning Lark", "Kestrel, Morning Lark", True),
        ("kestrel;morning lark", "Kestrel, Morning Lark", True),
        ("Morning Lark, Kestrel", "Kestrel, Morning Lark", False),  # order matters
        ("Kestrel", "Kestrel, Morning Lark", False),  # lengths differ
        ("3, 1,000", "3, 1000", False),  # the comma of 1,000 splits it: 3 elements vs 2
        ("3; 4.0", "3, 4", True),  # numbers inside lists compared as numbers
        ("St. Ives, Penzance", "St Ives, Penzance", False),  # punctuation kept inside lists
        ("Sea gull", "seagull", True),  # whitespace removed
        ("St. Ives!", "st ives", True),  # punctuation removed for plain strings
        (None, "None", True),
    ],
)
def test_gaia_quasi_exact_match_rules(prediction, gold, expected):
    assert gaia_match(prediction, gold) is expected


def test_gaia_number_reading():
    assert gaia_normalize_number("$1,000") == 1000.0
    assert gaia_normalize_number("12%") == 12.0
    assert gaia_normalize_number("about 3") == float("inf")


def test_gaia_verify_uses_its_rules():
    scenario = Gaia(GAIA_DIR)
    tasks = {t.id[-1]: t for t in scenario.tasks("validation")}
    assert scenario.verify(tasks["1"], "17.0").correct
    assert scenario.verify(tasks["4"], "$2.50").correct
    assert scenario.verify(tasks["2"], "Kestrel; Morning Lark").correct
    verdict = scenario.verify(tasks["2"], "Morning Lark")
    assert not verdict.correct and 0 < verdict.score < 1  # graded by token F1
    assert verdict.details["method"] == "gaia"


# ----------------------------------------------------------------------------- XBench-DeepSearch


def test_xbench_obfuscation_round_trip():
    key = "a canary key, ключ, 鍵"
    for text in ("", "1877", "Velmora 港口在哪一年开放？", "line\nbreak, \"quotes\""):
        assert xbench_decrypt(xbench_encrypt(text, key), key) == text
    assert xbench_encrypt("AB", "AB") == "AAA="  # XOR with the key itself gives zero bytes
    with pytest.raises(ValueError):
        xbench_decrypt("not base64 at all!", key)


def test_xbench_fixture_decodes_to_the_builders_rows():
    builder = _xbench_builder()
    raw = list(csv.DictReader((XBENCH_DIR / "DeepSearch.csv").open(encoding="utf-8")))
    assert all(r["canary"] == builder.CANARY for r in raw)
    assert all(r["prompt"] != p for r, (_, p, _) in zip(raw, builder.ROWS, strict=True))  # stored obfuscated
    scenario = XBenchDeepSearch(XBENCH_DIR)
    assert scenario.splits() == ["test"]
    tasks = list(scenario.tasks("test"))
    assert [(t.id, t.question, t.answer) for t in tasks] == [
        (f"xbench-{rid}", prompt, answer) for rid, prompt, answer in builder.ROWS
    ]
    assert all(t.kind == "deepsearch" and "canary" not in t.metadata for t in tasks)
    assert scenario.verify(tasks[1], "saltwind").correct


def test_xbench_own_rows_encoded_in_the_test(tmp_path):
    builder = _xbench_builder()
    rows = [("a7", "Quelle rivière traverse Ostrava Nova ?", "La Lenta"), ("b8", "Wer gründete das Archiv?", "Ilse")]
    path = builder.write(tmp_path / "mine.csv", rows, canary="my own key 123")
    # an extra column (as later releases carry) is kept as metadata
    lines = path.read_text(encoding="utf-8").splitlines()
    lines = [lines[0] + ",type"] + [line + ",multi-hop" for line in lines[1:]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tasks = list(XBenchDeepSearch(path).tasks())
    assert [(t.question, t.answer) for t in tasks] == [(p, a) for _, p, a in rows]
    assert [t.kind for t in tasks] == ["multi-hop", "multi-hop"]
    assert tasks[0].metadata["id"] == "a7"
    # an already-decrypted copy loads as it is
    plain = tmp_path / "plain.csv"
    with plain.open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "prompt", "answer", "canary"])
        w.writerow(["1", "In which year did the Velmora harbour open?", "1877", "k"])
    (task,) = XBenchDeepSearch(plain).tasks()
    assert (task.question, task.answer) == ("In which year did the Velmora harbour open?", "1877")


# ----------------------------------------------------------------------------- WebWalkerQA


def test_webwalkerqa_loads_types_and_difficulties():
    scenario = WebWalkerQA(WEBWALKER_FILE)
    assert scenario.splits() == ["main"]
    tasks = list(scenario.tasks("main"))
    assert len(tasks) == 3
    assert [t.kind for t in tasks] == ["single_source/easy", "multi_source/medium", "single_source/hard"]
    first = tasks[0]
    assert first.metadata["root_url"] == "https://rowing.velmora.example/"
    assert first.metadata["difficulty_level"] == "easy" and first.metadata["type"] == "single_source"
    assert first.metadata["lang"] == "en" and first.metadata["domain"] == "organization"
    assert first.metadata["golden_path"] == ["root->events->spring"]
    assert "Start from the website https://rowing.velmora.example/" in first.question
    assert scenario.verify(first, "the spring regatta starts at 9:30").correct
    assert not scenario.verify(first, "at ten").correct
    # a folder holding the file works too, and the question can leave the root URL out
    assert len(list(WebWalkerQA(WEBWALKER_FILE.parent, include_root_url=False).tasks())) == 3


def test_webwalkerqa_readme_spelling(tmp_path):
    row = {"Question": "Q?", "Answer": "A", "Root_Url": "https://x.example/",
           "Info": {"Hop": "multi-source", "Domain": "Game", "Language": "English", "Difficulty_Level": "Medium",
                    "Source_Website": ["https://x.example/a"], "Golden_Path": ["root->a"]}}
    path = tmp_path / "ww.json"
    path.write_text(json.dumps([row]))
    (task,) = WebWalkerQA(path).tasks()
    assert task.kind == "multi_source/medium" and task.metadata["lang"] == "English"


# ----------------------------------------------------------------------------- registry and world


def test_found_through_the_registry():
    assert {"gaia", "xbench-deepsearch", "webwalkerqa"} <= set(mgrpo_scenarios.names())
    assert isinstance(mgrpo_scenarios.get("gaia", data=GAIA_DIR), Gaia)
    assert isinstance(mgrpo_scenarios.get("xbench-deepsearch", data=XBENCH_DIR), XBenchDeepSearch)
    assert isinstance(mgrpo_scenarios.get("webwalkerqa", data=WEBWALKER_FILE), WebWalkerQA)
    with pytest.raises(FileNotFoundError):
        mgrpo_scenarios.get("gaia", data=GAIA_DIR / "missing")
    with pytest.raises(TypeError):
        mgrpo_scenarios.get("gaia", data=GAIA_DIR, no_such_option=1)


def test_search_backend_needs_configuration(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="MGRPO_SEARXNG_URL"):
        make_search_backend()
    with pytest.raises(ValueError, match="BRAVE_SEARCH_API_KEY"):
        Gaia(GAIA_DIR, cache_path=tmp_path / "c.sqlite").open()
    monkeypatch.setenv("MGRPO_SEARXNG_URL", "http://127.0.0.1:9")
    backend = make_search_backend()
    assert backend.name == "searxng:http://127.0.0.1:9"
    backend.close()
    monkeypatch.delenv("MGRPO_SEARXNG_URL")
    monkeypatch.setenv("BRAVE_SEARCH_API_KEY", "k")
    backend = make_search_backend()
    assert backend.name == "brave"
    backend.close()


def test_default_cache_path(monkeypatch, tmp_path):
    monkeypatch.setenv("MGRPO_DATA_DIR", str(tmp_path))
    assert default_cache_path() == tmp_path / "responses.sqlite"
    with OpenWebWorld(searxng_url="http://127.0.0.1:9", browser_mode="never") as world:
        assert world.cache is not None and world.cache.path == tmp_path / "responses.sqlite"
    with OpenWebWorld(searxng_url="http://127.0.0.1:9", browser_mode="never", cache_path=False) as world:
        assert world.cache is None


# ----------------------------------------------------------------------------- loopback web

PAGES = {
    "/ostrava": ("Ostrava Nova - Velmora travel", "Ostrava Nova sits on the river Lenta.\nKey fact: 17\n"
                 "Seventeen bridges cross the Lenta inside the town."),
    "/ferry": ("Lenta ferry - Velmora travel", "The Lenta ferry ran until 1950.\nKey fact: $2.50\n"
               "That was the toll in 1901."),
    "/regatta": ("Spring regatta - Velmora Rowing Club",
                 "Key fact: The spring regatta starts at 9:30.\nBoats gather at the boathouse."),
}
ROUTES = {"bridges": "/ostrava", "toll": "/ferry", "regatta": "/regatta"}


class _Site(BaseHTTPRequestHandler):
    requests: list[str] = []
    lock = threading.Lock()

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: str, ctype: str) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        parts = urlsplit(self.path)
        with self.lock:
            self.requests.append(parts.path)
        origin = f"http://{self.headers['Host']}"
        if parts.path == "/search":
            query = parse_qs(parts.query)
            assert query.get("format") == ["json"]
            q = query.get("q", [""])[0].lower()
            results = [
                {"url": origin + path, "title": PAGES[path][0], "content": PAGES[path][1][:60], "score": 1.0}
                for word, path in ROUTES.items() if word in q
            ]
            self._send(200, json.dumps({"query": q, "results": results}), "application/json")
        elif parts.path in PAGES:
            title, text = PAGES[parts.path]
            paragraphs = "".join(f"<p>{line}</p>" for line in text.splitlines())
            self._send(200, f"<!doctype html><html><head><title>{title}</title></head><body>"
                       f"<h1>{title}</h1>{paragraphs}</body></html>", "text/html; charset=utf-8")
        else:
            self._send(404, "not found", "text/plain")

    def do_POST(self) -> None:  # noqa: N802 - an OpenAI-compatible judge that accepts "9:30 am"
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        verdict = "CORRECT" if "Predicted answer: 9:30 am" in prompt else "INCORRECT"
        self._send(200, json.dumps({"choices": [{"message": {"content": verdict}}]}), "application/json")


@pytest.fixture()
def web() -> Iterator[str]:
    _Site.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def scripted_agent(task: Task, tools: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """Search with the question, visit the first result, answer with the page's "Key fact"."""
    steps: list[dict[str, Any]] = []
    query = str(task.metadata.get("raw_question") or task.question)
    found = tools["search"]({"queries": [query]})
    steps.append({"tool": "search", "ok": found.ok, "latency_s": found.latency_s})
    hits = found.meta.get("hits") or []
    if not hits:
        return "", steps
    page = tools["visit"]({"url": hits[0]["url"], "goal": "find the key fact"})
    steps.append({"tool": "visit", "ok": page.ok, "latency_s": page.latency_s})
    m = re.search(r"Key fact: ([^\n]+)", page.text)
    return (m.group(1).strip() if m else ""), steps


def test_evaluation_on_a_loopback_web(web, tmp_path):
    cache = tmp_path / "responses.sqlite"
    gaia = mgrpo_scenarios.get("gaia", data=GAIA_DIR, searxng_url=web, allow_origins=[web],
                               cache_path=cache, browser_mode="never")
    report = evaluate(gaia, "validation", scripted_agent, agent_name="scripted", workers=2, progress=False)
    assert report.num_tasks == 4
    assert {o.task_id[-1]: o.prediction for o in report.outcomes} == {"1": "17", "2": "", "3": "", "4": "$2.50"}
    assert report.exact_match == pytest.approx(0.5)
    assert report.by_kind["level1"]["exact_match"] == 1.0 and report.by_kind["level1"]["n"] == 2
    assert report.by_kind["level2"]["exact_match"] == 0.0 and report.by_kind["level3"]["n"] == 1
    assert report.tool_calls["visit"] == 2 and not report.tool_errors.get("visit")
    page_fetches = sum(p in PAGES for p in _Site.requests)
    assert page_fetches == 2 and cache.is_file()

    # a second evaluation replays searches and pages from the response cache
    again = evaluate(gaia, "validation", scripted_agent, workers=2, progress=False)
    assert again.exact_match == report.exact_match
    assert sum(p in PAGES for p in _Site.requests) == page_fetches
    assert _Site.requests.count("/search") == 4

    walker = WebWalkerQA(WEBWALKER_FILE, searxng_url=web, allow_origins=[web], cache_path=cache,
                         browser_mode="never")
    report = evaluate(walker, "main", scripted_agent, workers=1, progress=False)
    assert report.by_kind["single_source/easy"]["exact_match"] == 1.0
    assert report.by_kind["multi_source/medium"]["exact_match"] == 0.0
    assert set(report.by_kind) == {"single_source/easy", "multi_source/medium", "single_source/hard"}


def test_open_web_policy_refuses_loopback_unless_allowed(web, tmp_path):
    with OpenWebWorld(searxng_url=web, cache_path=False, browser_mode="never") as world:
        refused = world.tools["visit"]({"url": web + "/ostrava", "goal": "g"})
        assert not refused.ok and "policy" in (refused.error or "")
        hits = world.tools["search"]({"queries": ["bridges"]})
        assert hits.ok and hits.meta["hits"][0]["url"] == web + "/ostrava"
    with OpenWebWorld(searxng_url=web, allow_origins=[web], cache_path=False, browser_mode="never") as world:
        tools = world.make_tools()
        assert set(tools) == {"search", "visit", "click"}
        page = tools["visit"]({"url": web + "/ostrava", "goal": "g"})
        assert page.ok and "Key fact: 17" in page.text


def test_judge_decides_what_exact_match_rejects(web):
    walker = WebWalkerQA(WEBWALKER_FILE, judge={"base_url": web + "/v1", "model": "judge"})
    task = next(walker.tasks())
    assert walker.verify(task, "The spring regatta starts at 9:30.").details["method"] == "exact_match"
    verdict = walker.verify(task, "9:30 am")
    assert verdict.correct and verdict.details["method"] == "llm_judge"
    assert not walker.verify(task, "noon").correct
    with pytest.raises(ValueError, match="model"):
        WebWalkerQA(WEBWALKER_FILE, judge={"base_url": web})


def test_cli_eval_with_model_agents_three_runs(web, tmp_path, small_scenario, capsys):
    from mgrpo_algo.cli import main
    from mgrpo_algo.policies.models import build_role_models

    sizes = {r: {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1} for r in ("main", "sub")}
    build_role_models(small_scenario, tmp_path / "agent", sizes, vocab_size=512, roles=["main", "sub"])
    out = tmp_path / "out"
    code = main([
        "eval", "--scenario", "gaia", "--data", str(GAIA_DIR), "--set", f"searxng_url={web}",
        "--set", f"allow_origins=[{web}]", "--set", "browser_mode=never", "--set", f"cache_path={tmp_path / 'c.sqlite'}",
        "--agent", str(tmp_path / "agent"), "--runs", "3", "--limit", "2", "--max-new-tokens", "8", "--quiet",
        "--out", str(out),
    ])
    assert code == 0
    printed = capsys.readouterr().out
    assert "3 runs: exact match" in printed and "gaia validation" in printed  # the scenario's default split
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 2 * 3
