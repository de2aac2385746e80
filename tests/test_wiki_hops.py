"""wiki-hops: determinism, the entity graph, pages (static and JavaScript), splits, hops, the served site."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import mgrpo_scenarios
from mgrpo_scenarios.base import Scenario, Task
from mgrpo_scenarios.wiki_hops import ORIGIN, WikiHops
from mgrpo_scenarios.wiki_hops.questions import SPLITS, generate_tasks
from mgrpo_scenarios.wiki_hops.world import REVERSE_BY_KEY, SCHEMA, TYPES, generate_world
from mgrpo_tools.cache import ResponseCache
from mgrpo_tools.html_text import html_to_document

N = 300
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> WikiHops:
    s = WikiHops(seed=0, num_entities=N, data_dir=tmp_path_factory.mktemp("wh"))
    s.build()
    return s


@pytest.fixture(scope="module")
def graph(scenario: WikiHops):
    return scenario.graph()


def _all_tasks(scenario: WikiHops) -> dict[str, list[Task]]:
    return {split: list(scenario.tasks(split)) for split in SPLITS}


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------------- determinism


def test_same_seed_builds_byte_identical_pages_and_tasks(scenario: WikiHops, tmp_path: Path) -> None:
    again = WikiHops(seed=0, num_entities=N, data_dir=tmp_path)
    assert again.root != scenario.root
    again.build()
    assert _files(again.root / "pages") == _files(scenario.root / "pages")
    assert (again.root / "tasks.jsonl").read_bytes() == (scenario.root / "tasks.jsonl").read_bytes()


_DIGEST = """
import hashlib, json
from mgrpo_scenarios.wiki_hops.world import generate_world
from mgrpo_scenarios.wiki_hops.pages import render_entity
from mgrpo_scenarios.wiki_hops.questions import generate_tasks
w = generate_world(3, 120)
h = hashlib.sha256()
for e in w.entities:
    h.update(render_entity(w, e).encode())
for split, tasks in generate_tasks(w, {"stage1/train": 40, "stage2/train": 40}).items():
    for t in tasks:
        h.update(json.dumps(t.to_dict(), sort_keys=True).encode())
print(h.hexdigest())
"""


def test_generation_does_not_depend_on_pythonhashseed() -> None:
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", _DIGEST], env=env, capture_output=True, text=True, check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1


def test_different_seed_differs() -> None:
    a, b = generate_world(0, N), generate_world(1, N)
    assert [e.name for e in a.entities] != [e.name for e in b.entities]
    qa = [t.question for t in generate_tasks(a)["stage2/test"]]
    qb = [t.question for t in generate_tasks(b)["stage2/test"]]
    assert qa != qb


def test_metadata_and_root(scenario: WikiHops) -> None:
    meta = scenario.metadata
    assert meta["version"] == "3" and meta["seed"] == 0 and meta["num_entities"] == N and meta["js_fraction"] == 0.1
    assert scenario.root.name == f"v3-s0-n{N}-js0.1"
    manifest = scenario.manifest()
    assert manifest["metadata"] == json.loads(json.dumps(meta))
    assert set(manifest["build_seconds"]) == {"generate", "write", "index", "total"}
    assert (scenario.root / "index").is_dir()
    other = WikiHops(seed=0, num_entities=N, data_dir=scenario.data_dir, split_sizes={"stage1/train": 5})
    assert other.root != scenario.root  # a non-default option never reuses another world's files


def test_concurrent_builds_do_not_corrupt(tmp_path: Path) -> None:
    sizes = {s: 5 for s in SPLITS}
    builders = [WikiHops(seed=5, num_entities=60, data_dir=tmp_path, split_sizes=sizes) for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:
        roots = list(pool.map(lambda s: s.build(), builders))
    assert roots[0] == roots[1]
    assert (roots[0] / "manifest.json").is_file()
    leftovers = [p.name for p in roots[0].parent.iterdir() if p.name != roots[0].name]
    assert leftovers == []
    assert len(list(builders[0].tasks("stage2/test"))) == 5


# ----------------------------------------------------------------------------------- the graph


def test_default_size_has_five_types_and_unique_names() -> None:
    world = generate_world(0)
    assert len(world.entities) >= 2000
    counts = Counter(e.type for e in world.entities)
    assert set(counts) == set(TYPES) and min(counts.values()) >= 150
    names = [e.name.lower() for e in world.entities]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[A-Za-z]+( [A-Za-z]+)*", e.name) for e in world.entities)


def test_small_world_counts_and_facts(graph) -> None:
    assert len(graph.entities) == N
    for e in graph.entities:
        keys = {r.key for r in SCHEMA[e.type]}
        assert set(e.facts) <= keys
        for rel in SCHEMA[e.type]:
            if rel.is_entity and rel.key in e.facts:
                assert graph.entities[int(e.facts[rel.key])].type == rel.target
    spouses = [e for e in graph.entities if "spouse" in e.facts]
    assert spouses and all(graph.entities[int(e.facts["spouse"])].facts["spouse"] == e.id for e in spouses)


def test_near_duplicates_exist(graph) -> None:
    pairs = [(graph.entities[e.sibling_of].name, e.name) for e in graph.entities if e.sibling_of is not None]
    assert len(pairs) >= 0.05 * N
    one_letter = qualified = 0
    for base, sib in pairs:
        assert base != sib
        if len(base) == len(sib) and sum(a != b for a, b in zip(base, sib, strict=True)) == 1:
            one_letter += 1
        elif base in sib:
            qualified += 1
    assert one_letter > 0 and qualified > 0
    assert one_letter + qualified >= 0.9 * len(pairs)


# ----------------------------------------------------------------------------------- pages


def test_pages_exist_with_title_description_infobox(scenario: WikiHops, graph) -> None:
    wiki = scenario.root / "pages" / "wiki"
    assert len(list(wiki.glob("*.html"))) == N
    assert (scenario.root / "pages" / "index.html").is_file()
    static = next(e for e in graph.entities if not e.js and e.type == "person" and "employer" in e.facts)
    html = (wiki / f"{static.slug}.html").read_text()
    doc = html_to_document(html, "http://127.0.0.1:1/wiki/" + static.slug)
    assert doc.title == static.name
    assert '<meta name="description"' in html and '<table class="infobox">' in html
    lines = doc.text.split("\n")
    born = graph.entities[int(static.facts["born_in"])].name
    assert any(re.fullmatch(rf"Born in \| {re.escape(born)} \[\d+\]", line) for line in lines)
    assert f"Birth year | {static.facts['birth_year']}" in lines
    assert "## See also" in lines


def test_no_page_loads_external_resources(scenario: WikiHops) -> None:
    for page in (scenario.root / "pages").rglob("*.html"):
        html = page.read_text()
        assert " src=" not in html and "<link" not in html and "@import" not in html
        assert not re.search(r"""(href|src)=["']?(https?:)?//""", html), page


def _decoded(html: str) -> str:
    m = re.search(r'id="article-data">([^<]+)</script>', html)
    assert m, "a JavaScript page carries its data blob"
    return json.dumps(json.loads(base64.b64decode(m.group(1))))


def test_js_pages_hide_their_facts_from_static_html(scenario: WikiHops, graph) -> None:
    js_pages = [e for e in graph.entities if e.js]
    assert abs(len(js_pages) - 0.1 * N) <= 1
    for e in js_pages:
        html = (scenario.root / "pages" / "wiki" / f"{e.slug}.html").read_text()
        doc = html_to_document(html, "http://127.0.0.1:1/wiki/" + e.slug)
        assert doc.title == e.name and '<meta name="description"' in html
        assert len(doc.text) < 40  # what makes visit's auto mode use the browser
        body = html.split("</head>", 1)[1]
        for key in e.facts:
            shown = graph.display(e, key)
            assert shown not in doc.text and shown in _decoded(html)
            if " " in shown or len(shown) >= 6:  # (a short word could occur in base64 by chance)
                assert shown not in body, (e.name, key)


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium")
def test_js_pages_render_in_the_browser(scenario: WikiHops, graph) -> None:
    js_pages = [e for e in graph.entities if e.js][:3]
    with scenario.open() as world:
        visit = world.make_tools()["visit"]
        for e in js_pages:
            result = visit({"url": f"{world.url}/wiki/{e.slug}", "goal": "facts"})
            assert result.ok, result.error
            assert result.meta["via"] == "browser"
            for rel in SCHEMA[e.type]:
                if rel.key in e.facts:
                    assert f"{rel.label} | {graph.display(e, rel.key)}" in result.text


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium")
def test_js_pages_render_once_per_world_with_the_same_observation(scenario: WikiHops, graph) -> None:
    """Once per world and browser: the render is kept in the world folder, and a later open of the world
    (another mode, an evaluation, another run) serves it without rendering."""
    import shutil

    from mgrpo_scenarios.wiki_hops.scenario import WikiWorld

    page = next(e for e in graph.entities if e.js)
    shutil.rmtree(scenario.build() / "rendered", ignore_errors=True)  # other tests of the module render too
    with scenario.open() as world, WikiWorld(scenario.build(), render_cache=False) as plain:
        url = f"{world.url}/wiki/{page.slug}"
        first, second = (world.make_tools()["visit"]({"url": url, "goal": "facts"}) for _ in range(2))
        reference = plain.make_tools()["visit"]({"url": url, "goal": "facts"})
        assert plain.render_cache is None and world.render_cache is not None
        assert first.meta["via"] == second.meta["via"] == reference.meta["via"] == "browser"
        assert not first.meta["from_cache"] and second.meta["from_cache"] and not reference.meta["from_cache"]
        assert second.text == first.text == reference.text
        assert world.render_cache.stats.misses == 1 and world.render_cache.stats.hits == 1
        assert world.render_cache.path.parent == scenario.build() / "rendered"
    with scenario.open() as later:
        third = later.make_tools()["visit"]({"url": url, "goal": "facts"})
        stats = later.render_cache.stats
        assert third.text == first.text and third.meta["from_cache"]
        assert stats.loaded == 1 and stats.misses == 0 and stats.hits == 1
        assert later.browser is not None and not later.browser.started  # Chromium never launched


def test_prerender_renders_every_script_page_once_and_later_opens_launch_no_browser(tmp_path, graph) -> None:
    small = WikiHops(seed=0, num_entities=60, data_dir=tmp_path, prerender=True)
    script_slugs = sorted(e.slug for e in small.graph().entities if e.js)
    assert script_slugs  # the world has JavaScript pages
    with small.open() as world:
        urls = world.script_pages()
        assert sorted(u.rsplit("/", 1)[1] for u in urls if "/wiki/" in u) == script_slugs
        assert world.render_cache.stats.misses == len(urls)  # each rendered once, by the open itself
        hits = world.render_cache.stats.hits
        assert world.prerender() == {"pages": len(urls), "rendered": 0, "failed": 0}  # nothing left to render
        assert world.render_cache.stats.hits == hits  # and the kept pages are not visited again
    with small.open() as later:
        stats = later.render_cache.stats
        assert stats.loaded == len(urls) and stats.misses == 0
        texts = [later.make_tools()["visit"]({"url": u, "goal": "facts"}) for u in urls]
        assert all(t.ok and t.meta["via"] == "browser" and t.meta["from_cache"] for t in texts)
        assert not later.browser.started  # no episode waits for Chromium


# ----------------------------------------------------------------------------------- tasks


def test_splits_sizes_disjoint_and_named(scenario: WikiHops) -> None:
    tasks = _all_tasks(scenario)
    assert scenario.splits() == list(SPLITS)
    assert {s: len(t) for s, t in tasks.items()} == {"stage1/train": 400, "stage1/test": 100,
                                                     "stage2/train": 400, "stage2/test": 100, "stage2/heldout": 0}
    questions = [t.question for ts in tasks.values() for t in ts]
    assert len(set(questions)) == len(questions)
    ids = [t.id for ts in tasks.values() for t in ts]
    assert len(set(ids)) == len(ids)
    for stage in ("stage1", "stage2"):
        train_hops = {h.question for t in tasks[f"{stage}/train"] for h in t.hops}
        test_hops = {h.question for t in tasks[f"{stage}/test"] for h in t.hops}
        assert not train_hops & test_hops
        assert [t.id for t in scenario.tasks(stage)] == [t.id for t in tasks[f"{stage}/train"]]
    assert all(t.split == s for s, ts in tasks.items() for t in ts)
    with pytest.raises(KeyError):
        scenario.tasks("stage3")


def test_task_kinds_and_hop_counts(scenario: WikiHops) -> None:
    tasks = _all_tasks(scenario)
    assert {t.kind for t in tasks["stage1/train"]} == {"lookup"}
    assert all(len(t.hops) == 1 for t in tasks["stage1/test"])
    stage2 = tasks["stage2/train"] + tasks["stage2/test"]
    assert {t.kind for t in stage2} == {"chain", "comparison", "aggregation"}
    assert {len(t.hops) for t in stage2} == {2, 3, 4}


def _expected(graph, names, hop) -> str:
    entity = graph.entities[names[hop.entity]]
    if hop.relation in REVERSE_BY_KEY:
        return str(len(graph.members(entity, hop.relation)))
    return graph.answer(entity, hop.relation)


def test_every_hop_answer_matches_the_graph(scenario: WikiHops, graph) -> None:
    names = {e.name: e.id for e in graph.entities}
    for split, tasks in _all_tasks(scenario).items():
        for task in tasks:
            chains = task.metadata["chains"]
            assert sorted(i for c in chains for i in c) == list(range(len(task.hops)))
            finals = []
            for chain in chains:
                first = task.hops[chain[0]]
                assert first.entity in task.question  # mentioned by its exact name
                for a, b in zip(chain[:-1], chain[1:], strict=True):
                    assert task.hops[b].entity == task.hops[a].answer
                for i in chain:
                    hop = task.hops[i]
                    assert hop.entity in hop.question
                    assert hop.answer == _expected(graph, names, hop), (split, task.question, hop)
                finals.append((task.hops[chain[-1]].entity, int(task.hops[chain[-1]].answer)
                               if task.kind == "comparison" else task.hops[chain[-1]].answer))
            if task.kind == "comparison":
                (ea, va), (eb, vb) = finals
                assert va != vb
                best = (ea, eb)[(vb < va) if task.metadata["combine"] == "min" else (vb > va)]
                assert task.answer == best
            else:
                assert task.answer == task.hops[-1].answer


def test_verify_accepts_answer_and_aliases(scenario: WikiHops) -> None:
    assert scenario.verify(Task("x", "q", "Velmora"), "velmora").correct
    assert not scenario.verify(Task("x", "q", "Velmora"), "Velmora Heights").correct
    tasks = [t for ts in _all_tasks(scenario).values() for t in ts]
    with_alias = [t for t in tasks if t.aliases]
    assert with_alias
    for task in with_alias[:20]:
        assert scenario.verify(task, task.aliases[0]).correct
        assert scenario.verify(task, task.answer).correct


# ----------------------------------------------------------------------------------- the world


def test_registry_finds_the_scenario(scenario: WikiHops) -> None:
    assert "wiki-hops" in mgrpo_scenarios.names()
    s = mgrpo_scenarios.get("wiki-hops", data_dir=scenario.data_dir, num_entities=N)
    assert isinstance(s, WikiHops) and isinstance(s, Scenario)
    assert s.root == scenario.root


def _hrefs(html: str) -> list[str]:
    if 'id="article-data"' in html:
        html += _decoded(html).replace('\\"', '"')
    return re.findall(r'href="([^"]+)"', html)


def test_served_site_links_resolve_and_unknown_pages_404(scenario: WikiHops) -> None:
    pages = scenario.root / "pages"
    links = {h for p in pages.rglob("*.html") for h in _hrefs(p.read_text())}
    assert len(links) > N
    with scenario.open() as world, httpx.Client(base_url=world.served_url, timeout=10) as client:
        assert set(world.tools) == {"search", "visit", "click"}
        for link in sorted(links):
            assert client.get(link).status_code == 200, link
        for missing in ("/wiki/No_Such_Page", "/wiki/", "/nothing", "/wiki/Category_People"):
            assert client.get(missing).status_code == 404, missing
        refused = world.tools["visit"]({"url": "http://127.0.0.1:9/wiki/X", "goal": "x"})
        assert not refused.ok and refused.error.startswith("policy")


def test_search_finds_pages_by_exact_title(scenario: WikiHops, graph) -> None:
    with scenario.open() as world:
        search = world.tools["search"]
        for e in graph.entities[::15] + [e for e in graph.entities if e.js][:5]:
            result = search({"queries": [e.name]})
            assert result.ok
            assert any(h["title"] == e.name and h["url"].endswith(f"/wiki/{e.slug}") for h in result.meta["hits"])


def test_response_cache_records_tool_calls(scenario: WikiHops, graph, tmp_path: Path) -> None:
    cached = WikiHops(seed=0, num_entities=N, data_dir=scenario.data_dir, cache_path=tmp_path / "cache.sqlite")
    entity = next(e for e in graph.entities if not e.js)
    with cached.open() as world:
        assert world.tools["search"]({"queries": [entity.name]}).ok
        assert world.tools["visit"]({"url": f"{world.url}/wiki/{entity.slug}", "goal": "g"}).ok
    with ResponseCache(tmp_path / "cache.sqlite") as cache:
        assert len(cache) >= 2


def test_two_worlds_show_the_same_texts(scenario: WikiHops, graph) -> None:
    """Agents see http://wiki-hops.test whatever port serves the run: same calls, same texts."""
    static = next(e for e in graph.entities if not e.js and e.sibling_of is None)
    texts, served = [], []
    for _ in range(2):
        with scenario.open() as world:
            assert world.url == ORIGIN and world.served_url.startswith("http://127.0.0.1:")
            served.append(world.served_url)
            tools = world.make_tools()
            found = tools["search"]({"queries": [static.name, "botanist"]})
            page = tools["visit"]({"url": f"{ORIGIN}/wiki/{static.slug}", "goal": "facts"})
            clicked = tools["click"]({"link": 2})
            assert found.ok and page.ok and clicked.ok, (found.error, page.error, clicked.error)
            texts.append([found.text, page.text, clicked.text, clicked.meta["url"], found.meta["hits"]])
    assert served[0] != served[1]  # another port...
    assert texts[0] == texts[1]  # ...and not a character of difference
    joined = "\n".join(texts[0][:3])
    assert f"URL: {ORIGIN}/wiki/{static.slug}" in joined and "127.0.0.1" not in joined
    assert all(h["url"].startswith(f"{ORIGIN}/wiki/") for h in texts[0][4])


def test_titles_with_spaces_reach_the_page(scenario: WikiHops, graph) -> None:
    """MediaWiki-style: a name typed into the URL (spaces or %20) reaches the underscore page."""
    entity = next(e for e in graph.entities if " " in e.name and not e.js)
    with scenario.open() as world:
        canonical = world.make_tools()["visit"]({"url": f"{ORIGIN}/wiki/{entity.slug}", "goal": "g"})
        for spelled in (entity.name, entity.name.replace(" ", "%20")):
            result = world.make_tools()["visit"]({"url": f"{ORIGIN}/wiki/{spelled}", "goal": "g"})
            assert result.ok, result.error
            assert result.meta["url"] == f"{ORIGIN}/wiki/{entity.slug}"  # redirected to the one page URL
            assert result.text == canonical.text
        missing = world.make_tools()["visit"]({"url": f"{ORIGIN}/wiki/No Such Page", "goal": "g"})
        assert not missing.ok and f"HTTP 404 File not found for {ORIGIN}/wiki/No_Such_Page" in missing.error


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium")
def test_browser_path_shows_stable_urls(scenario: WikiHops, graph) -> None:
    entity = next(e for e in graph.entities if e.js)
    always = WikiHops(seed=0, num_entities=N, data_dir=scenario.data_dir, browser_mode="always")
    with always.open() as world:
        tools = world.make_tools()
        result = tools["visit"]({"url": f"{ORIGIN}/wiki/{entity.name}", "goal": "facts"})
        assert result.ok, result.error
        assert result.meta["via"] == "browser" and result.meta["url"] == f"{ORIGIN}/wiki/{entity.slug}"
        assert f"URL: {ORIGIN}/wiki/{entity.slug}" in result.text and "127.0.0.1" not in result.text
        assert entity.name in result.text  # the script ran: the page's body is built by JavaScript
        linked = tools["click"]({"link": 2})
        assert linked.ok and linked.meta["url"].startswith(f"{ORIGIN}/wiki/"), linked.error


def test_world_stops_everything_on_error(scenario: WikiHops) -> None:
    with pytest.raises(RuntimeError, match="boom"), scenario.open() as world:
        url = world.served_url
        a, b = world.make_tools(), world.make_tools()
        assert a["visit"] is not b["visit"] and a["search"] is b["search"]
        assert httpx.get(url + "/").status_code == 200
        raise RuntimeError("boom")
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/", timeout=2)



def test_heldout_split_changes_no_other_split_and_shares_no_hop() -> None:
    """``stage2/heldout`` is drawn after train: asking for it leaves every other split (and the folder
    of worlds built without it) as it was, and none of its hop questions is a train or test hop."""
    world = generate_world(0, 300)
    plain = generate_tasks(world)
    with_heldout = generate_tasks(world, {"stage2/heldout": 60})
    assert plain["stage2/heldout"] == [] and len(with_heldout["stage2/heldout"]) == 60
    for split in SPLITS:
        if split != "stage2/heldout":
            assert [t.question for t in with_heldout[split]] == [t.question for t in plain[split]], split
    seen = {h.question for s in ("stage2/train", "stage2/test") for t in plain[s] for h in t.hops}
    assert not any(h.question in seen for t in with_heldout["stage2/heldout"] for h in t.hops)
    questions = {t.question for s in SPLITS if s != "stage2/heldout" for t in plain[s]}
    assert not questions & {t.question for t in with_heldout["stage2/heldout"]}
    assert WikiHops(seed=0, num_entities=300, split_sizes={"stage2/heldout": 0}).root == WikiHops(seed=0, num_entities=300).root
