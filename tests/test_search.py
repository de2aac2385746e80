"""The local tantivy search index and the ``search`` tool."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mgrpo_tools.base import ToolError
from mgrpo_tools.cache import ResponseCache
from mgrpo_tools.search import (
    SearchBackend,
    SearchHit,
    SearchTool,
    TantivyIndex,
    dedup_url,
    default_url_path,
    meta_description,
    normalize_site,
)

PREFIX = "http://127.0.0.1:8765"

ENTITIES = {
    # file stem: (title, body paragraphs)
    "Velmora_Press": (
        "Velmora Press",
        "Velmora Press is a publishing house founded by Ada Lin in 1901 in Tevaro.",
    ),
    "Velmora_Pressworks": (
        "Velmora Pressworks",
        "Velmora Pressworks is a printing plant in Dunmere, unrelated to the publisher.",
    ),
    "Ada_Lin": (
        "Ada Lin",
        "Ada Lin was a printer and the founder of a publishing house. She was born in Kestrel Bay.",
    ),
    "Aldric_Venn": ("Aldric Venn", "Aldric Venn was a cartographer who mapped the Orrin coast."),
    "Aldric_Vennor": (
        "Aldric Vennor",
        "Aldric Vennor was a sailor on the ship Gull, a namesake of the cartographer.",
    ),
    "Kestrel_Bay": ("Kestrel Bay", "Kestrel Bay is a harbour town with a lighthouse built in 1777."),
    "Tevaro": ("Tevaro", "Tevaro is the capital city of the Orrin province and home of several presses."),
    "Cafe_Lumiere": ("Café Lumière", "Café Lumière is a coffee house in Tevaro known for its glass roof."),
    "Dunmere": ("Dunmere", "Dunmere is an industrial town. Printing plants and mills line its river."),
    "Gull_ship": ("Gull (ship)", "The Gull was a three-masted ship launched in 1850 at Kestrel Bay."),
}
FILLER_TOPICS = [
    "river",
    "mill",
    "bridge",
    "festival",
    "library",
    "museum",
    "market",
    "tower",
    "school",
    "garden",
]


def _page(title: str, body: str, *, description: str = "") -> str:
    meta = f'<meta name="description" content="{description}">' if description else ""
    return (
        f"<!doctype html><html><head><title>{title}</title>{meta}</head><body>"
        f"<nav><a href='/'>Home</a></nav><h1>{title}</h1><p>{body}</p>"
        f"<p>See also <a href='/wiki/Tevaro'>Tevaro</a>.</p></body></html>"
    )


def _write_pages(root: Path) -> None:
    wiki = root / "wiki"
    wiki.mkdir(parents=True)
    for stem, (title, body) in ENTITIES.items():
        (wiki / f"{stem}.html").write_text(_page(title, body), encoding="utf-8")
    for i, topic in enumerate(FILLER_TOPICS * 2):
        title = f"Orrin {topic.title()} {i}"
        body = f"The {topic} number {i} of the Orrin province. " + " ".join(FILLER_TOPICS[: i % 7 + 1]) * 3
        (wiki / f"Orrin_{topic}_{i}.html").write_text(_page(title, body), encoding="utf-8")
    # A page whose body is built by JavaScript: only its title and meta description are static.
    (wiki / "Orrin_Glass_Works.html").write_text(
        "<html><head><title>Orrin Glass Works</title>"
        '<meta name="description" content="Orrin Glass Works is a glassmaker in Tevaro, founded in 1832.">'
        "</head><body><div id='root'></div><script>render({name: 'x'})</script></body></html>",
        encoding="utf-8",
    )
    # Pages that the url_path mapping puts on other hosts.
    ext = root / "ext"
    ext.mkdir()
    (ext / "docs_velmora.html").write_text(
        _page("Velmora Press archive", "Archive of Velmora Press catalogues.")
    )
    (ext / "com_velmora.html").write_text(_page("Velmora Press shop", "Buy Velmora Press books online."))


def _url_path(rel: str) -> str:
    if rel == "ext/docs_velmora.html":
        return "https://docs.example.org/velmora"
    if rel == "ext/com_velmora.html":
        return "https://shop.example.com/velmora"
    return default_url_path(rel)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> TantivyIndex:
    root = tmp_path_factory.mktemp("search")
    _write_pages(root / "pages")
    TantivyIndex.build(root / "pages", root / "index", url_path=_url_path)
    return TantivyIndex(root / "index", url_prefix=PREFIX)


# ----------------------------------------------------------------------------- the index


def test_index_holds_every_page(index: TantivyIndex) -> None:
    assert index.num_docs == len(ENTITIES) + 2 * len(FILLER_TOPICS) + 1 + 2
    assert isinstance(index, SearchBackend)
    assert index.name.startswith("tantivy:") and index.name.endswith("@" + PREFIX)


@pytest.mark.parametrize("stem", sorted(ENTITIES))
def test_exact_title_ranks_first(index: TantivyIndex, stem: str) -> None:
    title = ENTITIES[stem][0]
    hits = index.search(title, k=5)
    assert hits and hits[0].title == title
    assert hits[0].url == f"{PREFIX}/wiki/{stem}"
    assert hits == sorted(hits, key=lambda h: -h.score)


def test_near_duplicate_names_are_both_found(index: TantivyIndex) -> None:
    titles = [h.title for h in index.search("Aldric Venn", k=5)]
    assert titles[0] == "Aldric Venn" and "Aldric Vennor" in titles
    titles = [h.title for h in index.search("Velmora", k=10)]
    assert {"Velmora Press", "Velmora Pressworks"} <= set(titles)


def test_body_search_stemming_and_snippet(index: TantivyIndex) -> None:
    hits = index.search("who founded the publishing house", k=3)
    assert hits[0].title in {"Velmora Press", "Ada Lin"}
    assert "founde" in hits[0].snippet.lower()
    hit = index.search("lighthouse harbour", k=1)[0]
    assert hit.title == "Kestrel Bay" and "lighthouse" in hit.snippet
    assert "[1]" not in hit.snippet  # link markers of the readable text are not indexed


def test_javascript_page_found_through_description(index: TantivyIndex) -> None:
    hits = index.search("glassmaker", k=3)
    assert hits and hits[0].title == "Orrin Glass Works"
    assert hits[0].snippet.startswith("Orrin Glass Works is a glassmaker")
    assert index.search("Orrin Glass Works", k=1)[0].title == "Orrin Glass Works"


def test_accents_are_folded(index: TantivyIndex) -> None:
    assert index.search("cafe lumiere", k=1)[0].title == "Café Lumière"
    assert index.search("CAFÉ LUMIÈRE", k=1)[0].title == "Café Lumière"


def test_phrases(index: TantivyIndex) -> None:
    assert [h.title for h in index.search('"harbour town"', k=10)] == ["Kestrel Bay"]
    assert {h.title for h in index.search("harbour town", k=10)} >= {"Kestrel Bay", "Dunmere"}
    # phrases match stemmed words: "printing plants" in Dunmere's text
    assert {h.title for h in index.search('"printing plant"', k=10)} == {"Velmora Pressworks", "Dunmere"}


def test_sites_filter(index: TantivyIndex) -> None:
    local = index.search("Velmora Press", sites=["127.0.0.1"], k=10)
    assert local and all(h.url.startswith(PREFIX) for h in local)
    org = index.search("Velmora Press", sites=["example.org"], k=10)
    assert [h.url for h in org] == ["https://docs.example.org/velmora"]
    both = index.search("Velmora Press", sites=["example.org", "shop.example.com"], k=10)
    assert {h.url for h in both} == {"https://docs.example.org/velmora", "https://shop.example.com/velmora"}
    assert index.search("Velmora Press", sites=["elsewhere.net"], k=10) == []
    assert index.search("Velmora Press", sites=["ample.org"], k=10) == []  # a suffix match is per label
    # a site: operator in the query text works like ``sites``
    assert [h.url for h in index.search("site:example.org Velmora", k=10)] == [
        "https://docs.example.org/velmora"
    ]
    with pytest.raises(ToolError) as info:
        index.search("Velmora", sites=["not a host"], k=3)
    assert info.value.kind == "arguments"
    unfiltered = {h.url for h in index.search("Velmora Press", k=10)}
    assert {"https://docs.example.org/velmora", f"{PREFIX}/wiki/Velmora_Press"} <= unfiltered


def test_k_limits_hits(index: TantivyIndex) -> None:
    assert len(index.search("Orrin", k=3)) == 3
    assert index.search("Orrin", k=0) == []


HOSTILE = [
    "",
    "   ",
    '"',
    '"unbalanced quote',
    'a "b" "c',
    "title:Velmora",
    "nofield:x",
    "(((",
    ")))",
    "a AND",
    "OR OR",
    "NOT",
    "-velmora",
    "+",
    "*",
    "[a TO b]",
    "{x TO y}",
    "velmora^2",
    "press~2",
    "/regex.*/",
    "\\",
    '""',
    '" "',
    "site:",
    "site:!!!",
    "a:b:c",
    "IN [1 2]",
    "\x00\x01",
    "🦜 emoji",
    "Velmora Press" * 200,
]


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_queries_never_raise(index: TantivyIndex, query: str) -> None:
    hits = index.search(query, k=5)
    assert isinstance(hits, list) and len(hits) <= 5


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(query=st.text(max_size=80) | st.text(alphabet='abcvelmora "():^~*-+[]{}!ANDORNOT\\/', max_size=40))
def test_random_queries_never_raise(index: TantivyIndex, query: str) -> None:
    hits = index.search(query, k=3)
    assert len(hits) <= 3
    result = SearchTool(index)({"queries": [query + " x"]})
    assert result.ok, result.error


def test_parser_fallback_to_term_queries(index: TantivyIndex) -> None:
    # text the query parser rejects (never produced by the sanitizer) still gives a usable query
    for text in ("nofield:velmora press", "(((velmora", "-velmora"):
        hits = index._index.searcher().search(index._text_query(text), 5).hits
        assert hits, text


def test_many_threads_search_at_once(index: TantivyIndex) -> None:
    queries = [ENTITIES[s][0] for s in ENTITIES] + ["Orrin river", "printing", "site:example.org velmora"]
    expected = {q: index.search(q, k=5) for q in queries}
    barrier = threading.Barrier(8)

    def worker(i: int) -> bool:
        barrier.wait()
        return all(index.search(q, k=5) == expected[q] for q in queries[i % 3 :] * 5)

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(worker, range(8)))


def test_build_is_deterministic_and_replaces(tmp_path: Path) -> None:
    _write_pages(tmp_path / "pages")
    TantivyIndex.build(tmp_path / "pages", tmp_path / "a")
    TantivyIndex.build(tmp_path / "pages", tmp_path / "b")
    a, b = TantivyIndex(tmp_path / "a"), TantivyIndex(tmp_path / "b")
    assert a.name == b.name
    assert a.search("Velmora", k=10) == b.search("Velmora", k=10)
    (tmp_path / "pages" / "wiki" / "Ada_Lin.html").unlink()
    TantivyIndex.build(tmp_path / "pages", tmp_path / "a")  # rebuilt in place
    rebuilt = TantivyIndex(tmp_path / "a")
    assert rebuilt.num_docs == b.num_docs - 1 and rebuilt.name != b.name
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folder left
    with pytest.raises(FileNotFoundError):
        TantivyIndex(tmp_path / "missing")
    with pytest.raises(FileNotFoundError):
        TantivyIndex.build(tmp_path / "nowhere", tmp_path / "c")


def test_helpers() -> None:
    assert default_url_path("wiki/Velmora_Press.html") == "/wiki/Velmora_Press"
    assert default_url_path("wiki/Café Lumière.html") == "/wiki/Caf%C3%A9%20Lumi%C3%A8re"
    assert meta_description("<meta content='A &amp; B' name=\"Description\">") == "A & B"
    assert meta_description('<meta property="og:description" content="og">') == "og"
    assert meta_description("<p>none</p>") == ""
    assert dedup_url("HTTP://Example.ORG:80/a/b/#frag") == "http://example.org/a/b"
    assert dedup_url("https://example.org/") == "https://example.org"
    assert dedup_url("https://example.org/a?x=1") == "https://example.org/a?x=1"
    assert normalize_site("https://www.Example.org:8080/wiki") == "example.org"
    assert normalize_site("a.example.org") == "a.example.org"
    for bad in ("", "not a host", "exa_mple.org", "-x.org"):
        with pytest.raises(ValueError):
            normalize_site(bad)


# ----------------------------------------------------------------------------- the tool


class FakeBackend:
    """Serves fixed ranked lists per query; counts calls; fails on queries that start with 'fail'."""

    remote = False

    def __init__(self, results: dict[str, list[str]]) -> None:
        self.name = "fake"
        self.results = results
        self.calls: list[tuple[str, tuple[str, ...] | None, int]] = []
        self._lock = threading.Lock()

    def search(self, query: str, *, sites: list[str] | None, k: int) -> list[SearchHit]:
        with self._lock:
            self.calls.append((query, tuple(sites) if sites else None, k))
        if query.startswith("fail"):
            raise ToolError("backend", f"engine down for {query!r}")
        urls = self.results.get(query.lower().strip(), [])
        return [
            SearchHit(title=f"T {u}", url=u, snippet=f"about {u}", score=1.0 / (i + 1))
            for i, u in enumerate(urls)
        ][:k]


def test_tool_merges_round_robin_and_dedups() -> None:
    backend = FakeBackend(
        {
            "q1": ["http://a.org/1", "http://a.org/2", "http://a.org/3"],
            "q2": ["HTTP://A.ORG/1/", "http://b.org/1", "http://b.org/2"],
            "q3": ["http://c.org/1#top", "http://a.org/2/", "http://c.org/2"],
        }
    )
    result = SearchTool(backend, k=3, max_results=6)({"queries": ["q1", "q2", "q3"]})
    assert result.ok
    urls = [h["url"] for h in result.meta["hits"]]
    # rank 1: a1, (a1 dup), c1; rank 2: a2, b1, (a2 dup); rank 3: a3, b2 -> capped at 6
    assert urls == [
        "http://a.org/1",
        "http://c.org/1#top",
        "http://a.org/2",
        "http://b.org/1",
        "http://a.org/3",
        "http://b.org/2",
    ]
    assert [p["count"] for p in result.meta["per_query"]] == [3, 3, 3]
    assert result.text.startswith('Search results for "q1" | "q2" | "q3" (6 results):')
    assert "[1] T http://a.org/1\nURL: http://a.org/1\nabout http://a.org/1" in result.text
    assert "[6] T http://b.org/2" in result.text and "[7]" not in result.text


def test_tool_on_index(index: TantivyIndex) -> None:
    tool = SearchTool(index, k=5, max_results=10)
    result = tool({"queries": ["Velmora Press founder", "Kestrel Bay", "Velmora Press"]})
    assert result.ok
    urls = [h["url"] for h in result.meta["hits"]]
    assert len(urls) == len({dedup_url(u) for u in urls}) <= 10
    assert urls[:2] == [f"{PREFIX}/wiki/Velmora_Press", f"{PREFIX}/wiki/Kestrel_Bay"]
    result = tool({"queries": ["Velmora"], "sites": ["https://docs.example.org/"]})
    assert [h["url"] for h in result.meta["hits"]] == ["https://docs.example.org/velmora"]
    assert result.meta["sites"] == ["docs.example.org"]


def test_tool_says_when_nothing_found(index: TantivyIndex) -> None:
    result = SearchTool(index)({"queries": ["zzqx nonexistent"], "sites": ["example.net"]})
    assert result.ok and result.meta["hits"] == []
    assert result.text.startswith('No results found for "zzqx nonexistent" on example.net.')


def test_tool_cache_hit_on_repeat(tmp_path: Path) -> None:
    backend = FakeBackend({"velmora press": ["http://a.org/1"], "ada lin": ["http://a.org/2"]})
    with ResponseCache(tmp_path / "cache.sqlite") as cache:
        tool = SearchTool(backend, cache=cache)
        first = tool({"queries": ["Velmora Press", "Ada Lin"], "sites": ["a.org"]})
        assert first.ok and first.meta["from_cache"] is False and len(backend.calls) == 2
        again = tool({"queries": ["  velmora   PRESS ", "Ada Lin"], "sites": ["www.A.org"]})
        assert again.ok and again.meta["from_cache"] is True and len(backend.calls) == 2
        assert again.meta["hits"] == first.meta["hits"]
        other_sites = tool({"queries": ["Velmora Press"]})
        assert other_sites.meta["from_cache"] is False and len(backend.calls) == 3
        assert len(cache) == 3


def test_tool_failures(tmp_path: Path) -> None:
    backend = FakeBackend({"ok": ["http://a.org/1"]})
    with ResponseCache(tmp_path / "cache.sqlite") as cache:
        tool = SearchTool(backend, cache=cache)
        partial = tool({"queries": ["ok", "fail one"]})
        assert partial.ok and len(partial.meta["hits"]) == 1
        assert "failed: backend: engine down" in partial.text
        assert partial.meta["per_query"][1]["error"].startswith("backend:")
        failed = tool({"queries": ["fail one", "fail two"]})
        assert not failed.ok and failed.error == "backend: engine down for 'fail one'"
        assert len(cache) == 1  # failures are not cached


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "missing required argument 'queries'"),
        ({"queries": []}, "1 to 3 non-empty strings, got 0"),
        ({"queries": ["a", "b", "c", "d"]}, "1 to 3 non-empty strings, got 4"),
        ({"queries": ["", "  "]}, "got 0"),
        ({"queries": [1, 2]}, "must be a list of strings"),
        ({"queries": "x" * 600}, "too long"),
        ({"queries": {"q": "a"}}, "must be a list of strings"),
        ({"query": "velmora"}, "use 'queries'"),
        ({"queries": ["a"], "k": 3}, "unknown argument"),
        ({"queries": ["a"], "sites": "not a host"}, "host names"),
        ({"queries": ["a"], "sites": [3]}, "must be a list of strings"),
    ],
)
def test_tool_bad_arguments(arguments: dict, message: str) -> None:
    backend = FakeBackend({})
    result = SearchTool(backend)(arguments)
    assert not result.ok and result.error.startswith("arguments:")
    assert message in result.error
    assert result.text.startswith("Error (search): arguments:")
    assert backend.calls == []


def test_tool_single_string_and_sites_passed_to_backend() -> None:
    backend = FakeBackend({"velmora": ["http://a.org/1"]})
    result = SearchTool(backend, k=4)({"queries": "velmora", "sites": ["b.org", "A.org", "a.org"]})
    assert result.ok
    assert backend.calls == [("velmora", ("a.org", "b.org"), 4)]


def test_tool_schema() -> None:
    tool = SearchTool(FakeBackend({}))
    assert tool.name == "search" and tool.description
    props = tool.parameters["properties"]
    assert props["queries"]["maxItems"] == 3 and tool.parameters["required"] == ["queries"]
    assert props["sites"]["type"] == "array"
