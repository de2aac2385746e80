"""Real loopback HTTP servers and pytest fixtures for the web-tool tests.

Not a conftest (other suites own that): a test module imports the fixtures it uses, e.g.
``from web_fixtures import policy_fixture, route_server_fixture  # noqa: F401``, and then asks for
them by their pytest names (``route_server``, ``other_server``, ``policy``).

:class:`RouteServer` answers a fixed set of routes that exercise every path of the fetchers: a normal
page with links, a long page, 404, redirects (``/redirect?to=URL``), a slow endpoint, huge pages,
binary responses, pages built by JavaScript, and a page that loads a sub-resource from elsewhere.
It binds 127.0.0.1 on an OS-assigned port and logs every request path it receives.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from mgrpo_tools import UrlPolicy

HOME_HTML = """<!doctype html><html><head><title>Home of the Test Site</title></head><body>
<h1>Test Site</h1>
<p>Welcome to the loopback test site. The capital of Velmora is Ostrava Nova, founded in 1312.</p>
<ul><li><a href="/page2">Second page</a></li><li><a href="/about">About us</a></li>
<li><a href="/long">A long page</a></li></ul>
</body></html>"""

PAGE2_HTML = """<!doctype html><html><head><title>Second Page</title></head><body>
<h2>Details</h2><p>The river Lenta crosses Ostrava Nova from north to south for 42 kilometres.</p>
<p><a href="/">Back home</a></p></body></html>"""

ABOUT_HTML = """<html><head><title>About</title></head><body><p>This site exists for tests only and
holds a few pages about an invented country.</p></body></html>"""

JS_TEXT = "Rendered by JavaScript: the archive of Velmora lists 381 manuscripts."
JS_HTML = f"""<!doctype html><html><head><title>Script Page</title></head><body><div id="app"></div>
<script>document.getElementById('app').innerHTML = '<h1>Archive</h1><p>{JS_TEXT}</p>';</script>
</body></html>"""

JS_FETCH_HTML = """<!doctype html><html><head><title>Fetch Page</title></head><body><div id="app"></div>
<script>fetch('/data.json').then(r => r.json()).then(d => {
  document.getElementById('app').innerHTML = '<p>' + d.message + '</p>'; });</script>
</body></html>"""
JS_BUSY_HTML = """<!doctype html><html><head><title>Busy Page</title></head><body><p id="n">0</p>
<script>let n = 0; setInterval(() => fetch('/data.json').then(() => {
document.getElementById('n').textContent = String(++n); }), 20);</script></body></html>"""
JS_FETCH_TEXT = "Loaded later by fetch: the harbour of Velmora opened in 1877."
# A page that starts its text's fetch only after `load` and 0.3 s of script work (what a renderer
# slowed by a loaded machine does to /js-fetch), from a server that answers it 0.3 s later: a
# browser that waits for quiet at its own end reads it without its text.
JS_LATE_HTML = """<!doctype html><html><head><title>Late Page</title></head><body><div id="app"></div>
<script>addEventListener('load', () => setTimeout(() => {
  const t = performance.now(); while (performance.now() - t < 300) {}
  fetch('/late.json').then(r => r.json()).then(d => { document.getElementById('app').textContent = d.message; });
}, 0));</script></body></html>"""
JS_LATE_TEXT = "Loaded after load and a busy script: the lighthouse of Velmora was lit in 1902."

STORAGE_HTML = """<!doctype html><html><head><title>Storage</title></head><body><script>
const before = 'cookie=' + (document.cookie || 'none') + ' stored=' + (localStorage.getItem('k') || 'none');
document.cookie = 'visited=yes'; localStorage.setItem('k', 'yes');
document.body.insertAdjacentHTML('beforeend', '<p>' + before + '</p>');
</script></body></html>"""


def long_html(paragraphs: int = 60) -> str:
    """A page with many numbered paragraphs (several pages of text at small ``page_chars``)."""
    body = "\n".join(
        f"<p>Paragraph {i}: the chronicle of Velmora records event number {i} in some detail here.</p>"
        for i in range(1, paragraphs + 1)
    )
    return f"<html><head><title>Long Page</title></head><body><h1>Chronicle</h1>{body}</body></html>"


class _Handler(BaseHTTPRequestHandler):
    server: RouteServer._Server
    timeout = 10

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _send(
        self, status: int, body: bytes, content_type: str | None, *, length: bool = True, **headers: str
    ):
        self.send_response(status)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        if length:
            self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _html(self, html: str, status: int = 200) -> None:
        self._send(status, html.encode("utf-8"), "text/html; charset=utf-8")

    def do_GET(self) -> None:  # noqa: C901 - one branch per route is the point
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        owner = self.server.owner
        with owner.lock:
            owner.requests.append(self.path)
        path = parts.path
        if path in ("/", "/index.html"):
            self._html(HOME_HTML)
        elif path == "/page2":
            self._html(PAGE2_HTML)
        elif path == "/about":
            self._html(ABOUT_HTML)
        elif path == "/long":
            self._html(long_html())
        elif path == "/redirect":
            self._send(int(query.get("code", "302")), b"", "text/html", Location=query.get("to", "/page2"))
        elif path == "/loop":
            self._send(302, b"", "text/html", Location="/loop")
        elif path == "/slow":
            owner.release.wait(float(query.get("s", "3")))  # woken early when the server stops
            self._html("<html><body><p>finally</p></body></html>")
        elif path == "/huge":
            self._send(200, b"<p>" + b"x" * owner.huge_bytes + b"</p>", "text/html")
        elif path == "/huge-stream":  # no Content-Length: the reader must count while streaming
            self._send(200, b"<p>" + b"y" * owner.huge_bytes + b"</p>", "text/html", length=False)
        elif path == "/image.png":
            self._send(200, b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64), "image/png")
        elif path == "/blob":
            self._send(200, b"MZ\x90\x00\x03\x00\x00\x00" * 32, "application/octet-stream")
        elif path == "/nul-text":  # lies about its type: caught by sniffing
            self._send(200, b"GIF89a\x00\x00\x01\x00" * 16, "text/plain")
        elif path == "/plain.txt":
            self._send(200, b"Plain notes: Velmora exports amber.\n", "text/plain; charset=utf-8")
        elif path == "/latin1":
            html = "<html><head><title>Caf\xe9</title></head><body><p>Caf\xe9 cr\xe8me br\xfbl\xe9e.</p></body></html>"
            self._send(200, html.encode("latin-1"), "text/html; charset=iso-8859-1")
        elif path == "/js":
            self._html(JS_HTML)
        elif path == "/js-fetch":
            self._html(JS_FETCH_HTML)
        elif path == "/js-no-store":  # a script page that forbids storing: never served from a cache
            self._send(200, JS_HTML.encode("utf-8"), "text/html; charset=utf-8", Cache_Control="no-store")
        elif path == "/js-busy":  # a script page that never goes quiet: its DOM depends on when it is read
            self._html(JS_BUSY_HTML)
        elif path == "/js-late":
            self._html(JS_LATE_HTML)
        elif path == "/late.json":  # answered late (0.3 s, or ?s=)
            owner.release.wait(float(query.get("s", "0.3")))
            self._send(200, json.dumps({"message": JS_LATE_TEXT}).encode(), "application/json")
        elif path == "/data.json":
            self._send(200, json.dumps({"message": JS_FETCH_TEXT}).encode(), "application/json")
        elif path == "/subresource":
            target = query.get("to", "")
            self._html(
                f"<html><head><title>Embeds</title></head><body><p>{'This page embeds a resource. ' * 3}</p>"
                f'<img src="{target}"><script>fetch("{target}").catch(() => null);</script></body></html>'
            )
        elif path == "/storage":  # shows what an earlier page left in cookies and localStorage
            self._html(STORAGE_HTML)
        elif path == "/secret":
            self._html("<html><body><p>secret data that must not be fetched</p></body></html>")
        elif path == "/error":
            self._html("<html><body>boom</body></html>", status=500)
        else:
            self._html("<html><body><p>not here</p></body></html>", status=404)


class RouteServer:
    """A threaded HTTP server on 127.0.0.1 with the test routes; :attr:`requests` logs request paths."""

    class _Server(ThreadingHTTPServer):
        daemon_threads = True
        owner: RouteServer

    def __init__(self, huge_bytes: int = 300_000) -> None:
        self.huge_bytes = huge_bytes
        self.requests: list[str] = []
        self.lock = threading.Lock()
        self.release = threading.Event()
        self._server = self._Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "/") -> str:
        return self.origin + path

    def hits(self, prefix: str) -> list[str]:
        """Logged request paths starting with ``prefix``."""
        with self.lock:
            return [p for p in self.requests if p.startswith(prefix)]

    def stop(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture(scope="module", name="route_server")
def route_server_fixture() -> Iterator[RouteServer]:
    """The test-route server, shared by a module."""
    server = RouteServer()
    yield server
    server.stop()


@pytest.fixture(scope="module", name="other_server")
def other_server_fixture() -> Iterator[RouteServer]:
    """A second loopback server whose origin the policy does NOT allow."""
    server = RouteServer()
    yield server
    server.stop()


@pytest.fixture(name="policy")
def policy_fixture(route_server: RouteServer) -> UrlPolicy:
    """Default policy (no private networks) plus the route server's exact origin."""
    p = UrlPolicy(deny_hosts=["forbidden.example"])
    p.allow_origin(route_server.origin)
    return p
