"""The response cache behind visit: record then replay by normalised URL, replay misses, cache modes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from web_fixtures import JS_TEXT, RouteServer, route_server_fixture  # noqa: F401 - fixtures

from mgrpo_tools import (
    BrowserFetcher,
    HttpFetcher,
    LoopbackSite,
    ResponseCache,
    UrlPolicy,
    make_browsing_tools,
)


@pytest.fixture
def site_root(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    (root / "wiki").mkdir(parents=True)
    (root / "wiki" / "Amber.html").write_text(
        "<html><head><title>Amber</title></head><body><p>Amber is fossilised tree resin, "
        'often found on the Baltic coast.</p><p><a href="/wiki/Resin">Resin</a></p></body></html>'
    )
    (root / "wiki" / "Resin.html").write_text(
        "<html><head><title>Resin</title></head><body><p>Resin is a sticky secretion of plants.</p></body></html>"
    )
    return root


@pytest.fixture
def site(site_root: Path) -> Iterator[LoopbackSite]:
    with LoopbackSite(site_root) as running:
        yield running


def tools_for(origin: str, cache: ResponseCache) -> tuple[HttpFetcher, dict]:
    site_policy = UrlPolicy()
    site_policy.allow_origin(origin)
    http = HttpFetcher(site_policy, timeout_s=5, cache=cache)
    return http, make_browsing_tools(http, None, "never")


def test_record_then_replay_after_server_stopped(site: LoopbackSite, tmp_path: Path) -> None:
    db = tmp_path / "cache" / "web.sqlite"
    origin = site.origin
    with ResponseCache(db) as cache:
        http, tools = tools_for(origin, cache)
        first = tools["visit"]({"url": f"{origin}/wiki/Amber", "goal": "amber"})
        assert first.ok and first.meta["from_cache"] is False
        assert "Baltic coast" in first.text
        assert len(cache) == 1
        site.stop()
        # A fresh agent (no session to reuse), another spelling of the same URL: served from cache.
        _, other = tools_for(origin, cache)
        spelled = origin.replace("http://", "HTTP://") + "/wiki/Amber#history"
        again = other["visit"]({"url": spelled, "goal": "amber"})
        assert again.ok, again.error
        assert again.meta["from_cache"] is True
        assert again.text == first.text
        # What was never recorded needs the (stopped) server.
        miss = other["click"]({"link": "Resin"})
        assert not miss.ok and miss.error.startswith("http: cannot fetch")
        http.close()
    # Another process, replay mode on the same file: the recorded page is still there.
    with ResponseCache(db, mode="replay") as replay:
        http, tools = tools_for(origin, replay)
        result = tools["visit"]({"url": f"{origin}/wiki/Amber", "goal": "amber"})
        assert result.ok and result.meta["from_cache"] is True and "Baltic coast" in result.text
        http.close()


def test_replay_miss_is_a_clear_error_and_stays_offline(route_server: RouteServer, tmp_path: Path) -> None:
    with ResponseCache(tmp_path / "replay.sqlite", mode="replay") as cache:
        http, tools = tools_for(route_server.origin, cache)
        before = len(route_server.hits("/about"))
        result = tools["visit"]({"url": route_server.url("/about"), "goal": "g"})
        assert not result.ok
        assert result.error == "cache: no recorded response for this fetch request (replay mode)"
        assert len(route_server.hits("/about")) == before  # replay never goes online
        http.close()


def test_failures_are_not_cached(route_server: RouteServer, tmp_path: Path) -> None:
    with ResponseCache(tmp_path / "c.sqlite") as cache:
        http, tools = tools_for(route_server.origin, cache)
        for path in ("/nope", "/image.png", "/error"):
            assert not tools["visit"]({"url": route_server.url(path), "goal": "g"}).ok
        assert len(cache) == 0
        http.close()


def test_cache_does_not_bypass_the_policy(site: LoopbackSite, tmp_path: Path) -> None:
    with ResponseCache(tmp_path / "c.sqlite") as cache:
        http, tools = tools_for(site.origin, cache)
        assert tools["visit"]({"url": f"{site.url}/wiki/Amber", "goal": "g"}).ok
        http.close()
        strict = HttpFetcher(UrlPolicy(), cache=cache)  # the loopback origin is not allowed here
        result = make_browsing_tools(strict, None, "never")["visit"](
            {"url": f"{site.url}/wiki/Amber", "goal": "g"}
        )
        assert not result.ok and result.error.startswith("policy:")
        strict.close()


def test_record_mode_refetches_and_overwrites(site: LoopbackSite, site_root: Path, tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite"
    url = f"{site.url}/wiki/Resin"
    with ResponseCache(db, mode="record") as cache:
        http, _ = tools_for(site.origin, cache)
        assert "sticky secretion" in make_browsing_tools(http)["visit"]({"url": url, "goal": "g"}).text
        (site_root / "wiki" / "Resin.html").write_text(
            "<html><body><p>Resin, revised edition of the page.</p></body></html>"
        )
        second = make_browsing_tools(http)["visit"]({"url": url, "goal": "g"})
        assert second.meta["from_cache"] is False and "revised edition" in second.text
        assert len(cache) == 1
        http.close()
    with ResponseCache(db, mode="readwrite") as cache:
        http, tools = tools_for(site.origin, cache)
        third = tools["visit"]({"url": url, "goal": "g"})
        assert third.meta["from_cache"] is True and "revised edition" in third.text
        http.close()


def test_readwrite_serves_stale_copy_and_off_mode_stores_nothing(
    site: LoopbackSite, site_root: Path, tmp_path: Path
) -> None:
    url = f"{site.url}/wiki/Resin"
    with ResponseCache(tmp_path / "rw.sqlite") as cache:
        http, _ = tools_for(site.origin, cache)
        make_browsing_tools(http)["visit"]({"url": url, "goal": "g"})
        (site_root / "wiki" / "Resin.html").write_text(
            "<html><body><p>Changed after recording.</p></body></html>"
        )
        hit = make_browsing_tools(http)["visit"]({"url": url, "goal": "g"})
        assert hit.meta["from_cache"] is True and "sticky secretion" in hit.text  # the recorded copy
        assert cache.hits == 1
        http.close()
    with ResponseCache(tmp_path / "off.sqlite", mode="off") as cache:
        http, _ = tools_for(site.origin, cache)
        for _ in range(2):
            result = make_browsing_tools(http)["visit"]({"url": url, "goal": "g"})
            assert (
                result.ok and result.meta["from_cache"] is False and "Changed after recording" in result.text
            )
        assert len(cache) == 0
        http.close()


def test_cache_value_round_trips(site: LoopbackSite, tmp_path: Path) -> None:
    with ResponseCache(tmp_path / "c.sqlite") as cache:
        http, _ = tools_for(site.origin, cache)
        live = http.fetch(f"{site.url}/wiki/Amber")
        hit = http.fetch(f"{site.url}/wiki/Amber")
        assert (hit.url, hit.status, hit.content_type, hit.text, hit.via) == (
            live.url,
            live.status,
            live.content_type,
            live.text,
            live.via,
        )
        assert hit.from_cache and not live.from_cache
        assert cache.get("fetch", f"{site.url}/wiki/Amber")["url"] == live.url  # key = normalised URL
        http.close()


@pytest.mark.browser
@pytest.mark.skipif(
    not os.access("/usr/bin/chromium", os.X_OK), reason="Chromium not installed at /usr/bin/chromium"
)
def test_browser_results_are_cached_under_their_own_namespace(
    route_server: RouteServer, tmp_path: Path
) -> None:
    with ResponseCache(tmp_path / "c.sqlite") as cache:
        site_policy = UrlPolicy()
        site_policy.allow_origin(route_server.origin)
        with BrowserFetcher(site_policy, cache=cache) as browser:
            first = browser.fetch(route_server.url("/js"))
            second = browser.fetch(route_server.url("/js#again"))
            assert not first.from_cache and second.from_cache
            assert second.via == "browser" and JS_TEXT in second.text
        assert cache.get("browser", route_server.url("/js")) is not None
        assert cache.get("fetch", route_server.url("/js")) is None


def test_world_cache_replays_in_another_world_on_another_port(tmp_path):
    """Entries name the stable origin only, so another run (another port) replays them as they are."""
    import sqlite3

    from mgrpo_scenarios.wiki_hops import ORIGIN, WikiHops

    cache = tmp_path / "responses.sqlite"

    def run(mode: str | None, *, stop_site: bool = False):
        scenario = WikiHops(seed=0, num_entities=100, data_dir=tmp_path / "data", cache_path=cache,
                            browser_mode="never")
        entity = next(e for e in scenario.graph().entities if not e.js)
        with scenario.open() as world:
            if mode is not None:
                world.cache.mode = mode
            if stop_site:
                world.site.stop()  # replay needs no server
            tools = world.make_tools()
            calls = [tools["search"]({"queries": [entity.name]}),
                     tools["visit"]({"url": f"{ORIGIN}/wiki/{entity.name}", "goal": "facts"}),  # a redirect
                     tools["click"]({"link": 2})]
            assert all(c.ok for c in calls), [c.error for c in calls]
            return world.served_url, [(c.text, c.meta.get("url"), c.meta.get("from_cache")) for c in calls]

    first_port, recorded = run(None)
    second_port, again = run(None)
    third_port, replayed = run("replay", stop_site=True)
    assert len({first_port, second_port, third_port}) == 3
    assert [r[:2] for r in again] == [r[:2] for r in replayed] == [r[:2] for r in recorded]
    assert [r[2] for r in recorded[1:]] == [False, False] and [r[2] for r in replayed[1:]] == [True, True]
    with sqlite3.connect(cache) as db:
        stored = "\n".join(k + r + v for k, r, v in db.execute("SELECT key, request, value FROM responses"))
    assert ORIGIN in stored and "127.0.0.1" not in stored


def test_world_replays_a_recorded_run_after_a_restart(tmp_path):
    from mgrpo_scenarios.wiki_hops import WikiHops

    cache = tmp_path / "responses.sqlite"
    scenario = WikiHops(seed=0, num_entities=100, data_dir=tmp_path / "data", cache_path=cache, browser_mode="never")
    task = next(scenario.tasks("stage2/test"))
    with scenario.open() as world:
        first = scenario.oracle(task, world.make_tools())
    replay = WikiHops(seed=0, num_entities=100, data_dir=tmp_path / "data", cache_path=cache, browser_mode="never")
    with replay.open() as world:
        world.cache.mode = "replay"  # every response must come from the cache
        world.site.stop()  # and the site is not even there
        second = replay.oracle(task, world.make_tools())
    assert second.error is None and second.answer == first.answer
