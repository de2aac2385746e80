"""Contract tests of the HTTP search backends against loopback servers that speak their APIs."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from mgrpo_tools.base import ToolError
from mgrpo_tools.search import BraveSearchBackend, SearchHit, SearchTool, SearxngBackend


class _Server:
    """A loopback HTTP server: records each GET (path, params, headers) and answers with ``reply``
    (status, body bytes or a JSON-able object, content type), after ``delay_s``."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.reply: tuple[int, object, str] = (200, {}, "application/json")
        self.delay_s = 0.0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                parts = urlsplit(self.path)
                outer.requests.append(
                    {
                        "path": parts.path,
                        "params": parse_qs(parts.query),
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                    }
                )
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                status, body, ctype = outer.reply
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- SearxNG

SEARXNG_REPLY = {
    "query": "velmora press",
    "number_of_results": 3,
    "results": [
        {
            "title": "Velmora Press",
            "url": "https://en.example.org/wiki/Velmora_Press",
            "content": "A <b>publisher</b> founded in 1901.",
            "score": 4.5,
            "engine": "wikipedia",
        },
        {
            "title": "Velmora shop",
            "url": "https://shop.example.com/velmora",
            "content": "Buy books",
            "engines": ["bing"],
        },
        {"title": "", "url": "https://blog.other.net/velmora", "content": None, "score": 1.0},
    ],
}


def test_searxng_request_and_parsing(server: _Server) -> None:
    server.reply = (200, SEARXNG_REPLY, "application/json")
    backend = SearxngBackend(server.url + "/", timeout_s=5)
    hits = backend.search("velmora press", sites=None, k=5)
    [req] = server.requests
    assert req["path"] == "/search"
    assert req["params"]["q"] == ["velmora press"] and req["params"]["format"] == ["json"]
    assert req["headers"]["accept"] == "application/json"
    assert hits[0] == SearchHit(
        "Velmora Press", "https://en.example.org/wiki/Velmora_Press", "A publisher founded in 1901.", 4.5
    )
    assert hits[1].score == pytest.approx(0.5)  # no score: 1 / rank
    assert hits[2].title == "https://blog.other.net/velmora" and hits[2].snippet == ""
    assert len(backend.search("velmora press", sites=None, k=2)) == 2
    assert backend.name == f"searxng:{server.url}"


def test_searxng_sites_become_site_terms_and_filter(server: _Server) -> None:
    server.reply = (200, SEARXNG_REPLY, "application/json")
    backend = SearxngBackend(server.url, timeout_s=5)
    hits = backend.search("velmora", sites=["example.org"], k=5)
    assert server.requests[-1]["params"]["q"] == ["velmora site:example.org"]
    assert [h.url for h in hits] == ["https://en.example.org/wiki/Velmora_Press"]  # engines may ignore site:
    backend.search("velmora", sites=["example.org", "example.com"], k=5)
    assert server.requests[-1]["params"]["q"] == ["velmora site:example.org OR site:example.com"]


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ((500, {"error": "boom"}, "application/json"), "SearxNG answered HTTP 500"),
        ((403, b"forbidden", "text/plain"), "refused the credentials (HTTP 403)"),
        ((429, b"slow down", "text/plain"), "rate limit reached (HTTP 429)"),
        ((200, b"<html>format not allowed</html>", "text/html"), "did not return JSON"),
        ((200, {"answers": []}, "application/json"), "no 'results' list"),
        ((200, {"results": [{"title": "no url"}]}, "application/json"), "result 0 has no 'url'"),
        ((200, [1, 2], "application/json"), "no 'results' list"),
    ],
)
def test_searxng_errors(server: _Server, reply: tuple, message: str) -> None:
    server.reply = reply
    with pytest.raises(ToolError) as info:
        SearxngBackend(server.url, timeout_s=5).search("x", sites=None, k=5)
    assert info.value.kind == "backend" and message in info.value.message


def test_searxng_timeout(server: _Server) -> None:
    server.delay_s = 0.5
    with pytest.raises(ToolError) as info:
        SearxngBackend(server.url, timeout_s=0.1).search("x", sites=None, k=5)
    assert info.value.kind == "timeout"


def test_searxng_down() -> None:
    with pytest.raises(ToolError) as info:
        SearxngBackend(f"http://127.0.0.1:{_free_port()}", timeout_s=1).search("x", sites=None, k=5)
    assert info.value.kind == "backend" and "unreachable" in info.value.message


def test_search_tool_over_searxng(server: _Server) -> None:
    server.reply = (200, SEARXNG_REPLY, "application/json")
    with SearxngBackend(server.url, timeout_s=5) as backend:
        result = SearchTool(backend, k=3)({"queries": ["velmora press", "velmora founder"]})
    assert result.ok and len(server.requests) == 2  # run in parallel threads, one request each
    assert [h["url"] for h in result.meta["hits"]] == [r["url"] for r in SEARXNG_REPLY["results"]]
    assert (
        "[1] Velmora Press\nURL: https://en.example.org/wiki/Velmora_Press\nA publisher founded in 1901."
        in result.text
    )
    server.reply = (502, b"bad gateway", "text/plain")
    failed = SearchTool(SearxngBackend(server.url, timeout_s=5))({"queries": ["x"]})
    assert not failed.ok and failed.error.startswith("backend: SearxNG answered HTTP 502")


# ----------------------------------------------------------------------------- Brave

BRAVE_REPLY = {
    "type": "search",
    "query": {"original": "velmora press"},
    "web": {
        "type": "search",
        "results": [
            {
                "title": "Velmora <strong>Press</strong>",
                "url": "https://en.example.org/wiki/Velmora_Press",
                "description": "The <strong>Velmora</strong> Press &amp; its founder.",
            },
            {"title": "Shop", "url": "https://shop.example.com/velmora", "description": "Buy"},
        ],
    },
}


def test_brave_request_and_parsing(server: _Server) -> None:
    server.reply = (200, BRAVE_REPLY, "application/json")
    backend = BraveSearchBackend("key-123", base_url=server.url + "/res/v1/web/search", timeout_s=5)
    hits = backend.search("velmora press", sites=None, k=7)
    [req] = server.requests
    assert req["path"] == "/res/v1/web/search"
    assert req["params"] == {"q": ["velmora press"], "count": ["7"]}
    assert req["headers"]["x-subscription-token"] == "key-123"
    assert req["headers"]["accept"] == "application/json"
    assert hits[0] == SearchHit(
        "Velmora Press", "https://en.example.org/wiki/Velmora_Press", "The Velmora Press & its founder.", 1.0
    )
    assert hits[1].score == pytest.approx(0.5)
    backend.search("velmora", sites=["example.org", "example.com"], k=50)
    assert server.requests[-1]["params"] == {
        "q": ["velmora site:example.org OR site:example.com"],
        "count": ["20"],
    }


def test_brave_no_web_results_is_empty(server: _Server) -> None:
    server.reply = (200, {"type": "search", "query": {"original": "zzz"}}, "application/json")
    assert BraveSearchBackend("k", base_url=server.url, timeout_s=5).search("zzz", sites=None, k=5) == []


@pytest.mark.parametrize(
    ("status", "message"),
    [(401, "refused the credentials (HTTP 401)"), (429, "rate limit reached (HTTP 429)"), (503, "HTTP 503")],
)
def test_brave_error_statuses(server: _Server, status: int, message: str) -> None:
    server.reply = (status, {"type": "ErrorResponse"}, "application/json")
    with pytest.raises(ToolError) as info:
        BraveSearchBackend("k", base_url=server.url, timeout_s=5).search("x", sites=None, k=5)
    assert info.value.kind == "backend" and message in info.value.message
    assert info.value.meta["status"] == status


def test_brave_non_json_and_timeout(server: _Server) -> None:
    server.reply = (200, b"not json", "text/plain")
    with pytest.raises(ToolError, match="did not return JSON"):
        BraveSearchBackend("k", base_url=server.url, timeout_s=5).search("x", sites=None, k=5)
    server.reply = (200, {"web": {"results": "nope"}}, "application/json")
    with pytest.raises(ToolError, match="no 'web.results' list"):
        BraveSearchBackend("k", base_url=server.url, timeout_s=5).search("x", sites=None, k=5)
    server.delay_s = 0.5
    with pytest.raises(ToolError) as info:
        BraveSearchBackend("k", base_url=server.url, timeout_s=0.1).search("x", sites=None, k=5)
    assert info.value.kind == "timeout"


def test_brave_api_key_from_environment(monkeypatch: pytest.MonkeyPatch, server: _Server) -> None:
    monkeypatch.delenv("BRAVE_SEARCH_API_KEY", raising=False)
    with pytest.raises(ValueError, match="BRAVE_SEARCH_API_KEY"):
        BraveSearchBackend()
    monkeypatch.setenv("BRAVE_SEARCH_API_KEY", "env-key")
    server.reply = (200, BRAVE_REPLY, "application/json")
    BraveSearchBackend(base_url=server.url, timeout_s=5).search("x", sites=None, k=5)
    assert server.requests[-1]["headers"]["x-subscription-token"] == "env-key"
