"""HttpFetcher, the visit/click tools and LoopbackSite against real loopback servers (no browser)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from web_fixtures import JS_TEXT, RouteServer, other_server_fixture, policy_fixture, route_server_fixture  # noqa: F401 - fixtures

from mgrpo_tools import (
    BrowserFetcher,
    ClickTool,
    HttpFetcher,
    Link,
    LoopbackSite,
    ToolError,
    UrlPolicy,
    VisitTool,
    make_browsing_tools,
)


@pytest.fixture
def http(policy: UrlPolicy) -> Iterator[HttpFetcher]:
    fetcher = HttpFetcher(policy, timeout_s=5.0, max_bytes=100_000)
    yield fetcher
    fetcher.close()


@pytest.fixture
def tools(http: HttpFetcher) -> dict:
    return make_browsing_tools(http, None, browser_mode="never", page_chars=600)


def redirect_to(server: RouteServer, target: str, code: int = 302) -> str:
    return server.url(f"/redirect?code={code}&to={quote(target, safe='')}")


# -- HttpFetcher -----------------------------------------------------------------------------------


def test_fetch_normal_page(http: HttpFetcher, route_server: RouteServer) -> None:
    result = http.fetch(route_server.url("/"))
    assert result.status == 200 and result.via == "http" and not result.from_cache
    assert result.url == route_server.url("/")
    assert result.content_type == "text/html"
    assert "Ostrava Nova" in result.text
    assert result.elapsed_s > 0


def test_fetch_404_and_500(http: HttpFetcher, route_server: RouteServer) -> None:
    with pytest.raises(ToolError) as info:
        http.fetch(route_server.url("/nope"))
    assert info.value.kind == "http"
    assert info.value.message == f"HTTP 404 Not Found for {route_server.url('/nope')}"
    assert info.value.meta["status"] == 404
    with pytest.raises(ToolError, match="HTTP 500 Internal Server Error"):
        http.fetch(route_server.url("/error"))


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_fetch_follows_allowed_redirects(http: HttpFetcher, route_server: RouteServer, code: int) -> None:
    result = http.fetch(redirect_to(route_server, "/page2", code))
    assert result.url == route_server.url("/page2")
    assert "river Lenta" in result.text


def test_fetch_redirect_chain_and_loop(http: HttpFetcher, route_server: RouteServer) -> None:
    chain = redirect_to(route_server, redirect_to(route_server, route_server.url("/about")))
    assert http.fetch(chain).url == route_server.url("/about")
    with pytest.raises(ToolError, match="too many redirects"):
        http.fetch(route_server.url("/loop"))


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("http://10.0.0.1/admin", "private"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://forbidden.example/", "deny-list"),
        ("file:///etc/passwd", "scheme"),
    ],
)
def test_fetch_redirect_to_forbidden_target_is_refused(
    http: HttpFetcher, route_server: RouteServer, target: str, words: str
) -> None:
    with pytest.raises(ToolError) as info:
        http.fetch(redirect_to(route_server, target))
    assert info.value.kind == "policy" and words in info.value.message


def test_fetch_redirect_to_other_loopback_port_never_reaches_it(
    http: HttpFetcher, route_server: RouteServer, other_server: RouteServer
) -> None:
    with pytest.raises(ToolError, match="loopback"):
        http.fetch(redirect_to(route_server, other_server.url("/secret")))
    assert other_server.hits("/secret") == []


def test_fetch_refuses_disallowed_url_before_connecting(http: HttpFetcher, other_server: RouteServer) -> None:
    with pytest.raises(ToolError) as info:
        http.fetch(other_server.url("/secret"))
    assert info.value.kind == "policy"
    assert other_server.hits("/secret") == []


def test_fetch_timeout(policy: UrlPolicy, route_server: RouteServer) -> None:
    with HttpFetcher(policy, timeout_s=0.3) as quick:
        start = time.perf_counter()
        with pytest.raises(ToolError) as info:
            quick.fetch(route_server.url("/slow?s=3"))
        assert info.value.kind == "timeout" and "did not answer within 0.3 s" in info.value.message
        assert time.perf_counter() - start < 2.0
        visit = VisitTool(quick, browser_mode="never")
        result = visit({"url": route_server.url("/slow?s=3"), "goal": "g"})
        assert not result.ok and result.error.startswith("timeout: ")


@pytest.mark.parametrize("path", ["/huge", "/huge-stream"])
def test_fetch_stops_at_max_bytes(http: HttpFetcher, route_server: RouteServer, path: str) -> None:
    with pytest.raises(ToolError) as info:
        http.fetch(route_server.url(path))
    assert info.value.kind == "content"
    assert "page larger than 100000 bytes" in info.value.message


@pytest.mark.parametrize(
    ("path", "words"),
    [("/image.png", "image/png"), ("/blob", "application/octet-stream"), ("/nul-text", "NUL")],
)
def test_fetch_refuses_binary(http: HttpFetcher, route_server: RouteServer, path: str, words: str) -> None:
    with pytest.raises(ToolError) as info:
        http.fetch(route_server.url(path))
    assert info.value.kind == "content" and words in info.value.message


def test_fetch_decodes_declared_charset(http: HttpFetcher, route_server: RouteServer) -> None:
    assert "Café crème brûlée" in http.fetch(route_server.url("/latin1")).text


def test_fetch_connection_refused_is_http_error() -> None:
    with LoopbackSite(Path(__file__).parent) as site:
        origin = site.origin
    policy = UrlPolicy()
    policy.allow_origin(origin)  # the port is free again: nothing listens there
    with HttpFetcher(policy, timeout_s=2) as fetcher, pytest.raises(ToolError) as info:
        fetcher.fetch(origin + "/")
    assert info.value.kind == "http" and "cannot fetch" in info.value.message


def test_fetch_is_thread_safe(http: HttpFetcher, route_server: RouteServer) -> None:
    urls = [route_server.url(p) for p in ("/", "/page2", "/about", "/long")] * 5
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(http.fetch, urls))
    assert [r.url for r in results] == urls


# -- visit -----------------------------------------------------------------------------------------


def test_visit_normal_page(tools: dict, route_server: RouteServer) -> None:
    result = tools["visit"]({"url": route_server.url("/"), "goal": "find the capital"})
    assert result.ok, result.error
    lines = result.text.splitlines()
    assert lines[0] == "Goal: find the capital"
    assert "Title: Home of the Test Site" in result.text
    assert "Ostrava Nova" in result.text
    assert "Second page [1]" in result.text and "Links:" in result.text
    assert result.meta == {
        "url": route_server.url("/"),
        "status": 200,
        "via": "http",
        "from_cache": False,
        "page": 1,
        "pages": 1,
    }
    assert result.latency_s > 0


@pytest.mark.parametrize(
    ("path", "error_prefix"),
    [
        ("/nope", "http: HTTP 404 Not Found"),
        ("/huge", "content: page larger than"),
        ("/image.png", "content: "),
        ("/blob", "content: "),
        ("/redirect?to=http%3A%2F%2F10.0.0.1%2F", "policy: "),
        (
            "/redirect?to=http%3A%2F%2Fforbidden.example%2F",
            "policy: host 'forbidden.example' is on the deny-list",
        ),
    ],
)
def test_visit_failures_are_results(
    tools: dict, route_server: RouteServer, path: str, error_prefix: str
) -> None:
    result = tools["visit"]({"url": route_server.url(path), "goal": "g"})
    assert not result.ok
    assert result.error.startswith(error_prefix), result.error
    assert result.text.startswith("Error (visit): ")


def test_visit_follows_allowed_redirect(tools: dict, route_server: RouteServer) -> None:
    result = tools["visit"]({"url": redirect_to(route_server, "/page2"), "goal": "g"})
    assert result.ok and result.meta["url"] == route_server.url("/page2")
    assert "river Lenta" in result.text


def test_visit_plain_text(tools: dict, route_server: RouteServer) -> None:
    result = tools["visit"]({"url": route_server.url("/plain.txt"), "goal": "g"})
    assert result.ok and "Velmora exports amber" in result.text


def test_visit_js_page_without_browser_shows_no_script_text(tools: dict, route_server: RouteServer) -> None:
    result = tools["visit"]({"url": route_server.url("/js"), "goal": "g"})
    assert result.ok and result.meta["via"] == "http"
    assert JS_TEXT not in result.text
    assert "(no readable text on this page)" in result.text


def test_visit_auto_mode_falls_back_when_browser_unavailable(
    http: HttpFetcher, route_server: RouteServer
) -> None:
    missing = BrowserFetcher(http.policy, executable_path="/nonexistent/chromium")
    visit = VisitTool(http, missing, browser_mode="auto")
    result = visit({"url": route_server.url("/js"), "goal": "g"})
    assert result.ok and result.meta["via"] == "http"
    assert result.meta["browser_error"].startswith("backend: Chromium not found at /nonexistent/chromium; install it with `apt-get install -y chromium`")
    plain = visit({"url": route_server.url("/"), "goal": "g"})  # enough text: no browser attempt
    assert "browser_error" not in plain.meta


def test_visit_pagination(tools: dict, route_server: RouteServer) -> None:
    visit = tools["visit"]
    first = visit({"url": route_server.url("/long"), "goal": "chronicle"})
    pages = first.meta["pages"]
    assert first.ok and pages >= 5
    assert f"Page 1 of {pages} (call visit with page=2 to read on)" in first.text
    assert "Paragraph 1:" in first.text and "Paragraph 60:" not in first.text
    requests_before = len(route_server.hits("/long"))
    last = visit({"url": route_server.url("/long"), "goal": "chronicle", "page": pages})
    assert last.ok and last.meta["page"] == pages
    assert "Paragraph 60:" in last.text and "Paragraph 1:" not in last.text
    middle = visit({"url": route_server.url("/long#x"), "goal": "chronicle", "page": "2"})  # numeric string
    assert middle.ok and middle.meta["page"] == 2
    assert len(route_server.hits("/long")) == requests_before  # reading on does not download again
    seen = "".join(
        visit({"url": route_server.url("/long"), "goal": "c", "page": p}).text for p in range(1, pages + 1)
    )
    assert all(f"Paragraph {i}:" in seen for i in range(1, 61))  # nothing lost between pages


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"goal": "g"}, "missing required argument 'url'"),
        ({"url": 42, "goal": "g"}, "'url' must be a string, got int"),
        ({"url": ["http://x"], "goal": "g"}, "'url' must be a string, got list"),
        ({"url": "  ", "goal": "g"}, "'url' must not be empty"),
        ({"url": "{base}/"}, "missing required argument 'goal'"),
        ({"url": "{base}/", "goal": "g", "page": 0}, "'page' must be between 1 and 10000, got 0"),
        ({"url": "{base}/", "goal": "g", "page": "two"}, "'page' must be an integer"),
        ({"url": "{base}/", "goal": "g", "page": 999}, "page must be between 1 and 1 for"),
        ({"url": "ftp://{host}/", "goal": "g"}, "scheme 'ftp' not allowed"),
    ],
)
def test_visit_bad_arguments(tools: dict, route_server: RouteServer, arguments: dict, message: str) -> None:
    base, host = route_server.origin, route_server.origin.split("//")[1]
    arguments = {k: v.format(base=base, host=host) if isinstance(v, str) else v for k, v in arguments.items()}
    result = tools["visit"](arguments)
    assert not result.ok
    assert message in result.error, result.error


def test_visit_rejects_non_mapping_arguments(tools: dict) -> None:
    result = tools["visit"]("http://example.org")  # type: ignore[arg-type]
    assert not result.ok and result.error.startswith("arguments:")


def test_visit_tool_schema() -> None:
    assert VisitTool.name == "visit" and ClickTool.name == "click"
    assert VisitTool.parameters["required"] == ["url", "goal"]
    assert set(VisitTool.parameters["properties"]) == {"url", "goal", "page"}
    assert ClickTool.parameters["required"] == ["link"]
    with pytest.raises(ValueError):
        VisitTool(HttpFetcher(UrlPolicy()), None, browser_mode="always")
    with pytest.raises(ValueError):
        VisitTool(HttpFetcher(UrlPolicy()), None, browser_mode="sometimes")


# -- click -----------------------------------------------------------------------------------------


def test_click_before_visit(tools: dict) -> None:
    result = tools["click"]({"link": 1})
    assert not result.ok and "no page visited yet" in result.error


def test_click_by_number_and_text(tools: dict, route_server: RouteServer) -> None:
    visit, click = tools["visit"], tools["click"]
    assert visit({"url": route_server.url("/"), "goal": "learn about the river"}).ok
    by_number = click({"link": 1})
    assert by_number.ok, by_number.error
    assert by_number.meta["url"] == route_server.url("/page2") and by_number.meta["clicked"] == 1
    assert by_number.text.startswith("Goal: learn about the river\n")  # the goal carries over
    assert "river Lenta" in by_number.text
    back = click({"link": "Back home"})  # exact anchor text on page2
    assert back.ok and back.meta["url"] == route_server.url("/")
    about = click({"link": "  about US "})  # case and spacing forgiven when nothing matches exactly
    assert about.ok and "invented country" in about.text
    assert visit({"url": route_server.url("/"), "goal": "g"}).ok
    assert click({"link": "2"}).meta["url"] == route_server.url("/about")  # numeric string
    assert visit({"url": route_server.url("/"), "goal": "g"}).ok
    assert click({"link": "[3]"}).meta["url"] == route_server.url("/long")  # as written in the text


@pytest.mark.parametrize(
    ("link", "message"),
    [
        (99, "no link [99] on the current page (links are numbered 1 to 3)"),
        ("Nonexistent anchor", "no link with the anchor text 'Nonexistent anchor'"),
        (True, "'link' must be a link number or anchor text, got bool"),
        (None, "missing required argument 'link'"),
        (1.5, "'link' must be a whole number"),
        ("", "'link' must not be empty"),
    ],
)
def test_click_bad_link(tools: dict, route_server: RouteServer, link: object, message: str) -> None:
    assert tools["visit"]({"url": route_server.url("/"), "goal": "g"}).ok
    result = tools["click"]({"link": link})
    assert not result.ok and message in result.error, result.error


def test_click_goes_through_the_policy(
    http: HttpFetcher, route_server: RouteServer, other_server: RouteServer
) -> None:
    tools = make_browsing_tools(http, None, browser_mode="never")
    page = route_server.url("/subresource?to=" + quote(other_server.url("/secret"), safe=""))
    visit = tools["visit"]({"url": page, "goal": "g"})
    assert visit.ok
    # The page has no <a> links: give the session one that points at the forbidden origin.
    session = tools["visit"].session
    session.document.links.append(Link(1, "secret", other_server.url("/secret")))
    result = tools["click"]({"link": 1})
    assert not result.ok and result.error.startswith("policy:")
    assert other_server.hits("/secret") == []


def test_sessions_are_per_agent(http: HttpFetcher, route_server: RouteServer) -> None:
    a = make_browsing_tools(http, None, browser_mode="never")
    b = make_browsing_tools(http, None, browser_mode="never")
    assert a["visit"]({"url": route_server.url("/page2"), "goal": "g"}).ok
    assert not b["click"]({"link": 1}).ok  # b visited nothing
    assert a["click"]({"link": 1}).meta["url"] == route_server.url("/")


# -- LoopbackSite ----------------------------------------------------------------------------------


def test_loopback_site_serves_clean_urls(tmp_path: Path) -> None:
    (tmp_path / "wiki").mkdir()
    (tmp_path / "index.html").write_text("<html><head><title>Home</title></head><body>home</body></html>")
    (tmp_path / "wiki" / "Foo_Bar.html").write_text("<html><body><p>Foo Bar article</p></body></html>")
    (tmp_path / "notes.txt").write_text("plain notes")
    site = LoopbackSite(tmp_path)
    with pytest.raises(RuntimeError):
        _ = site.url
    with site:
        assert site.url.startswith("http://127.0.0.1:") and site.port > 0 and site.origin == site.url
        get = httpx.get
        assert "Foo Bar article" in get(site.url + "/wiki/Foo_Bar").text
        assert get(site.url + "/wiki/Foo_Bar.html").status_code == 200
        assert get(site.url + "/wiki/Foo_Bar?x=1").status_code == 200
        assert get(site.url + "/").text.startswith("<html><head><title>Home")
        assert get(site.url + "/notes.txt").text == "plain notes"
        assert get(site.url + "/wiki/Missing").status_code == 404
        assert get(site.url + "/wiki/").status_code == 404  # no directory listings
        assert get(site.url + "/../../etc/passwd").status_code == 404
        url = site.url
    assert not site.running
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/", timeout=2)
    site.stop()  # idempotent


def test_loopback_site_with_visit_tool(tmp_path: Path) -> None:
    (tmp_path / "wiki").mkdir()
    (tmp_path / "wiki" / "Amber.html").write_text(
        '<html><head><title>Amber</title></head><body><p>Amber is fossil tree resin, see <a href="/wiki/Resin">Resin</a>.</p></body></html>'
    )
    (tmp_path / "wiki" / "Resin.html").write_text(
        "<html><head><title>Resin</title></head><body><p>Resin is a sticky plant secretion.</p></body></html>"
    )
    with LoopbackSite(tmp_path) as site:
        policy = UrlPolicy()
        policy.allow_origin(site.origin)
        with HttpFetcher(policy) as http:
            tools = make_browsing_tools(http, None, "never")
            first = tools["visit"]({"url": site.url + "/wiki/Amber", "goal": "what is amber"})
            assert first.ok and "fossil tree resin" in first.text and "Resin [1]" in first.text
            second = tools["click"]({"link": "Resin"})
            assert second.ok and "sticky plant secretion" in second.text


def test_loopback_site_redirects_titles_with_spaces(tmp_path: Path) -> None:
    (tmp_path / "wiki").mkdir()
    (tmp_path / "wiki" / "Motochil_Crossing.html").write_text("<html><body><p>Crossing article</p></body></html>")
    (tmp_path / "Other Folder").mkdir()
    (tmp_path / "Other Folder" / "a b.html").write_text("outside the title prefix")
    with pytest.raises(ValueError):
        LoopbackSite(tmp_path, title_prefixes=("wiki",))
    with LoopbackSite(tmp_path, title_prefixes=("/wiki/",)) as site:
        for spelled in ("/wiki/Motochil Crossing", "/wiki/Motochil%20Crossing", "/wiki/Motochil  Crossing "):
            moved = httpx.get(site.url + spelled)
            assert moved.status_code == 301 and moved.headers["location"] == site.url + "/wiki/Motochil_Crossing"
            assert "Crossing article" in httpx.get(site.url + spelled, follow_redirects=True).text
        moved = httpx.get(site.url + "/wiki/Motochil%20Crossing?x=1")
        assert moved.headers["location"] == site.url + "/wiki/Motochil_Crossing?x=1"  # the query is kept
        assert httpx.get(site.url + "/wiki/No%20Such%20Page", follow_redirects=True).status_code == 404
        assert httpx.get(site.url + "/Other%20Folder/a%20b").text == "outside the title prefix"  # served as is
    with LoopbackSite(tmp_path) as plain:  # the option is off by default
        assert httpx.get(plain.url + "/wiki/Motochil%20Crossing").status_code == 404


def test_virtual_origin_is_fetched_from_the_real_one(route_server: RouteServer, other_server: RouteServer) -> None:
    policy = UrlPolicy(allow_hosts=())  # nothing but the virtual origin may be fetched
    policy.map_origin("http://routes.test", route_server.origin)
    with HttpFetcher(policy, timeout_s=5) as http:
        page = http.fetch("http://routes.test/page2")
        assert page.url == "http://routes.test/page2" and "river Lenta" in page.text
        # Redirects show the virtual origin, whether the Location is relative or names the real origin.
        for target in ("/about", route_server.url("/about")):
            moved = http.fetch("http://routes.test/redirect?to=" + quote(target, safe=""))
            assert moved.url == "http://routes.test/about"
        tools = make_browsing_tools(http, None, "never")
        shown = tools["visit"]({"url": "http://routes.test/", "goal": "g"})
        assert shown.ok and "URL: http://routes.test/" in shown.text and "127.0.0.1" not in shown.text
        assert tools["click"]({"link": 1}).meta["url"] == "http://routes.test/page2"
        # A redirect to an origin the policy refuses is still refused at the hop.
        with pytest.raises(ToolError, match="allow-list"):
            http.fetch("http://routes.test/redirect?to=" + quote(other_server.url("/secret"), safe=""))
        assert other_server.hits("/secret") == []
        before = len(route_server.hits("/"))
        for other in ("http://example.com/page2", "http://routes.test:8080/page2", "https://routes.test/page2",
                      route_server.url("/page2")):
            with pytest.raises(ToolError) as info:  # never remapped: the policy decides as before
                http.fetch(other)
            assert info.value.kind == "policy" and "allow-list" in info.value.message
        assert len(route_server.hits("/")) == before  # none of them reached the site


def test_loopback_site_requires_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        LoopbackSite(tmp_path / "missing")


def test_fetch_needs_the_origin_allowed(route_server: RouteServer) -> None:
    # A policy without the origin refuses even the first request of the allowed-looking site.
    with HttpFetcher(UrlPolicy()) as fetcher, pytest.raises(ToolError, match="loopback"):
        fetcher.fetch(route_server.url("/"))
