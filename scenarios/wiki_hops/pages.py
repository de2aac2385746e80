"""HTML rendering of the wiki-hops world: one page per entity, category pages and a front page.

Page layout (what the oracle and the agents read after HTML-to-text):

- ``<title>`` = the entity's exact name; ``<meta name="description">`` a one-line summary that states no
  relation value (so a JavaScript page leaks no fact through it); ``<h1>`` the name.
- ``<table class="infobox">`` with ``<th>Label</th><td>value</td>`` rows, entity values as
  ``<a href="/wiki/Slug">Name</a>``; rendered as ``Born in | Velmora [3]``; after the facts, one
  ``Number of ... | N`` row per non-empty reverse list (its size, as Wikipedia infoboxes give counts);
- prose paragraphs stating the same facts in words (varied templates) mixed with filler sentences;
- one ``<h2>`` section per non-empty reverse relation (``People born here``, ``Works``, ...), a ``<ul>``
  with one linked item per member (the count row's N items);
- ``See also`` with distractor links (the near-duplicate sibling, other entities of the same type).

On a JavaScript page the whole body (heading, infobox, prose, lists, See also) is absent from the
static HTML: an inline ``<script>`` decodes a base64 JSON blob and builds it at load time. Only
``<title>`` and the description stay static (the search index finds the page through them). The
static text is empty, which is what makes the ``visit`` tool's ``auto`` mode render the page in
Chromium (it renders pages with under 40 characters of text that carry scripts).

Category pages (``/category/People``, ...) list every entity of a type and the front page
(``/``) links them; they live outside ``/wiki/`` and are not in the search index. No page loads any
external resource.
"""

from __future__ import annotations

import base64
import html
import json
import random
from pathlib import Path

from .world import RELATION_BY_KEY, REVERSES, SCHEMA, TYPE_PLURAL, TYPES, Entity, World

__all__ = ["render_entity", "render_category", "render_index", "write_site", "category_path", "page_rng"]

SITE_NAME = "Fictopedia"

_FACT_TEMPLATES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("born_in", "birth_year"): (
        "{n} was born in {born_in} in {birth_year}.",
        "{n} was born in {birth_year} in {born_in}.",
        "Born in {born_in} in {birth_year}, {n} travelled widely as a young adult.",
    ),
    ("occupation",): (
        "{n} worked as {occupation_a}.", "By profession {n} was {occupation_a}.",
        "{n} is remembered chiefly as {occupation_a}.",
    ),
    ("employer",): (
        "{n} was employed by {employer}.", "For most of their career {n} worked for {employer}.",
        "{employer} employed {n} for many years.",
    ),
    ("spouse",): ("{n} was married to {spouse}.", "{n} and {spouse} were married.", "The spouse of {n} was {spouse}."),
    ("located_in",): ("{n} lies in {located_in}.", "{n} is located in {located_in}.", "{n} is part of {located_in}."),
    ("founded", "place"): (
        "{n} was founded in {founded}.", "Records give {founded} as the year {n} was founded.",
        "The founding of {n} dates to {founded}.",
    ),
    ("population",): ("{n} has a population of {population}.", "The population of {n} is {population}."),
    ("founder",): ("{n} was founded by {founder}.", "{founder} founded {n}.", "The founder of {n} was {founder}."),
    ("founded", "organisation"): ("{n} was established in {founded}.", "{n} was founded in {founded}."),
    ("headquarters",): (
        "{n} is headquartered in {headquarters}.", "The headquarters of {n} are in {headquarters}.",
    ),
    ("industry",): ("{n} operates in the {industry} industry.", "{n} is active in {industry}."),
    ("creator",): ("{n} was created by {creator}.", "{creator} is the creator of {n}.", "{creator} created {n}."),
    ("publisher", "published"): (
        "{n} was published by {publisher} in {published}.", "{publisher} published {n} in {published}.",
        "{n} first appeared in {published}, published by {publisher}.",
    ),
    ("genre",): ("{n} is {genre_a}.", "Critics classify {n} as {genre_a}."),
    ("location", "year"): (
        "{n} took place in {location} in {year}.", "In {year}, {n} was held in {location}.",
        "{n} was held in {location} in {year}.",
    ),
    ("organiser",): ("{n} was organised by {organiser}.", "{organiser} organised {n}."),
}

_FILLER: dict[str, tuple[str, ...]] = {
    "person": (
        "Little is recorded about the early years of {n}.",
        "Several archives hold letters written by {n}.",
        "Contemporaries described {n} as patient and exacting.",
        "A portrait of {n} hangs in a provincial gallery.",
        "Accounts of {n} differ on many details of daily life.",
        "A biography of {n} appeared in {y}.",
        "{n} kept a detailed diary for several decades.",
    ),
    "place": (
        "The old market of {n} is known for its copper work.",
        "Travellers often mention the bridges of {n}.",
        "A great flood reshaped the river banks near {n} in {y}.",
        "The climate around {n} is mild and damp.",
        "{n} holds a spring fair each year.",
        "Local histories of {n} disagree about its oldest street.",
    ),
    "organisation": (
        "The archives of {n} are open to researchers by appointment.",
        "{n} moved into larger premises in {y}.",
        "Its members still follow an old charter.",
        "{n} publishes a short annual report.",
        "The emblem of {n} shows a lantern over waves.",
    ),
    "work": (
        "A revised edition of {n} appeared in {y}.",
        "Early reviews of {n} were mixed.",
        "{n} has been translated into several languages.",
        "Scholars still debate the meaning of its final part.",
        "Manuscript drafts of {n} survive in a private collection.",
    ),
    "event": (
        "Eyewitness accounts of {n} vary considerably.",
        "A commemorative plaque for {n} was unveiled in {y}.",
        "Attendance at {n} was recorded in a surviving ledger.",
        "Historians regard {n} as a turning point for the region.",
        "Weather delayed parts of {n}.",
    ),
}

_STYLE = (
    "body{font-family:serif;max-width:52em;margin:1em auto;padding:0 1em}"
    "table.infobox{float:right;border:1px solid #999;margin:0 0 1em 1em;border-collapse:collapse}"
    "table.infobox th,table.infobox td{border:1px solid #ccc;padding:2px 6px;text-align:left}"
)

_JS_BUILDER = (
    "(function(){var d=JSON.parse(atob(document.getElementById('article-data').textContent.trim()));"
    "var h='<p class=\"site\"><a href=\"/\">'+d.site+'</a></p><h1>'+d.title+'</h1>"
    "<table class=\"infobox\"><tr><th colspan=\"2\">'+d.title+'</th></tr>';"
    "d.infobox.forEach(function(r){h+='<tr><th>'+r[0]+'</th><td>'+r[1]+'</td></tr>';});h+='</table>';"
    "d.paragraphs.forEach(function(p){h+='<p>'+p+'</p>';});"
    "d.lists.forEach(function(l){h+='<h2>'+l[0]+'</h2><ul>';"
    "l[1].forEach(function(i){h+='<li>'+i+'</li>';});h+='</ul>';});"
    "document.getElementById('content').innerHTML=h;})();"
)


def page_rng(world: World, entity: Entity) -> random.Random:
    """The page's own generator: a page does not depend on the order pages are rendered in."""
    return random.Random(f"wiki-hops:{world.seed}:page:{entity.id}")


def category_path(etype: str) -> str:
    """URL path of a category page (``/category/People``), outside ``/wiki/`` and the search index."""
    return f"/category/{TYPE_PLURAL[etype]}"


def _a(word: str) -> str:
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def _link(entity: Entity) -> str:
    return f'<a href="/wiki/{entity.slug}">{html.escape(entity.name)}</a>'


def _value_html(world: World, entity: Entity, key: str) -> str:
    if RELATION_BY_KEY[(entity.type, key)].is_entity:
        return _link(world.entities[int(entity.facts[key])])
    return html.escape(world.display(entity, key) or "")


def _fact_sentences(world: World, entity: Entity, rng: random.Random) -> list[str]:
    values = {key: _value_html(world, entity, key) for key in entity.facts}
    for key in ("occupation", "genre"):
        if key in entity.facts:
            values[f"{key}_a"] = html.escape(_a(str(entity.facts[key])))
    keys_of_type = {r.key for r in SCHEMA[entity.type]}
    out = []
    for group, templates in _FACT_TEMPLATES.items():
        keys = tuple(k for k in group if k not in TYPES)
        if len(group) > len(keys) and group[-1] != entity.type:
            continue
        if not all(k in keys_of_type and k in entity.facts for k in keys):
            continue
        out.append(rng.choice(templates).format(n=html.escape(entity.name), **values))
    return out


def _fillers(entity: Entity, rng: random.Random, count: int) -> list[str]:
    pool = list(_FILLER[entity.type])
    rng.shuffle(pool)
    return [s.format(n=html.escape(entity.name), y=rng.randint(1750, 2020)) for s in pool[:count]]


def _paragraphs(world: World, entity: Entity, rng: random.Random) -> list[str]:
    facts = _fact_sentences(world, entity, rng)
    rng.shuffle(facts)
    fillers = _fillers(entity, rng, rng.randint(2, 4))
    cut = max(1, len(facts) // 2)
    first = facts[:cut] + fillers[:1]
    second = facts[cut:] + fillers[1:2]
    rng.shuffle(second)
    paragraphs = [" ".join(first), " ".join(second), " ".join(fillers[2:])]
    return [p for p in paragraphs if p]


def _infobox_rows(world: World, entity: Entity) -> list[tuple[str, str]]:
    rows = [("Type", entity.type.capitalize())]
    rows += [(r.label, _value_html(world, entity, r.key)) for r in SCHEMA[entity.type] if r.key in entity.facts]
    # the size of each non-empty reverse list, as one row (world version 3): a count is then read like
    # any other fact, where before it took paging through the whole list
    rows += [(rev.count_label, str(len(world.members(entity, rev.key))))
             for rev in REVERSES[entity.type] if world.members(entity, rev.key)]
    return rows


def _reverse_lists(world: World, entity: Entity) -> list[tuple[str, list[str]]]:
    out = []
    for rev in REVERSES[entity.type]:
        members = world.members(entity, rev.key)
        if members:
            out.append((rev.heading, [_link(m) for m in members]))
    return out


def _see_also(world: World, entity: Entity, rng: random.Random) -> list[Entity]:
    related = {int(v) for k, v in entity.facts.items() if isinstance(v, int) and k in _entity_keys(entity.type)}
    related |= {m.id for rev in REVERSES[entity.type] for m in world.members(entity, rev.key)}
    related.add(entity.id)
    picks: list[Entity] = []
    picks += [world.entities[i] for i in world.siblings.get(entity.id, []) if i not in related]
    same = world.by_type(entity.type)
    for e in rng.sample(same, min(len(same), 8)):
        if e.id not in related and e not in picks and len(picks) < 4:
            picks.append(e)
    return picks


def _entity_keys(etype: str) -> frozenset[str]:
    return frozenset(r.key for r in SCHEMA[etype] if r.is_entity)


def _description(entity: Entity) -> str:
    return f"{entity.name}: {_a(entity.type)} article of the {SITE_NAME}, an encyclopedia of an invented world."


def _head(title: str, description: str, nav: bool = True) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html.escape(title)}</title>\n"
        f"<meta name=\"description\" content=\"{html.escape(description)}\">\n"
        f"<style>{_STYLE}</style>\n</head>\n<body>\n"
        + (f"<p class=\"site\"><a href=\"/\">{SITE_NAME}</a></p>\n" if nav else "")
    )


def render_entity(world: World, entity: Entity) -> str:
    """The full HTML of one entity's page (static or JavaScript-built body)."""
    rng = page_rng(world, entity)
    name = html.escape(entity.name)
    rows = _infobox_rows(world, entity)
    paragraphs = _paragraphs(world, entity, rng)
    lists = _reverse_lists(world, entity)
    see_also = _see_also(world, entity, rng)
    if see_also:
        lists.append(("See also", [_link(e) for e in see_also]))
    head = _head(entity.name, _description(entity), nav=not entity.js)
    if entity.js:
        # The whole body is built at load time: the static text is empty, which is also what tells
        # the visit tool's "auto" mode to render the page in the browser.
        blob = json.dumps({"site": SITE_NAME, "title": name, "infobox": rows, "paragraphs": paragraphs,
                           "lists": lists}, ensure_ascii=True, separators=(",", ":"))
        encoded = base64.b64encode(blob.encode("ascii")).decode("ascii")
        return (head + "<div id=\"content\"></div>\n"
                "<noscript>This article is built by JavaScript; enable it to read the article.</noscript>\n"
                f"<script type=\"application/octet-stream\" id=\"article-data\">{encoded}</script>\n"
                f"<script>{_JS_BUILDER}</script>\n</body>\n</html>\n")
    parts = [head, f"<h1>{name}</h1>\n<div id=\"content\">\n<table class=\"infobox\">\n"
                   f"<tr><th colspan=\"2\">{name}</th></tr>\n"]
    parts += [f"<tr><th>{label}</th><td>{value}</td></tr>\n" for label, value in rows]
    parts.append("</table>\n")
    parts += [f"<p>{p}</p>\n" for p in paragraphs]
    for heading, items in lists:
        parts.append(f"<h2>{heading}</h2>\n<ul>\n" + "".join(f"<li>{i}</li>\n" for i in items) + "</ul>\n")
    parts.append("</div>\n</body>\n</html>\n")
    return "".join(parts)


def render_category(world: World, etype: str) -> str:
    """A category page listing every entity of one type, alphabetically."""
    members = sorted(world.by_type(etype), key=lambda e: e.name)
    title = f"Category: {TYPE_PLURAL[etype]}"
    items = "".join(f"<li>{_link(e)}</li>\n" for e in members)
    return (_head(title, f"All {len(members)} {TYPE_PLURAL[etype].lower()} of the {SITE_NAME}.")
            + f"<h1>{title}</h1>\n<ul>\n{items}</ul>\n</body>\n</html>\n")


def render_index(world: World) -> str:
    """The front page: what the site is and a link to every category."""
    items = "".join(
        f"<li><a href=\"{category_path(t)}\">{TYPE_PLURAL[t]}</a> ({len(world.by_type(t))} articles)</li>\n"
        for t in TYPES
    )
    return (_head(SITE_NAME, f"The {SITE_NAME}: an encyclopedia of an invented world.")
            + f"<h1>{SITE_NAME}</h1>\n<p>An encyclopedia of an invented world with {len(world.entities)} articles. "
            f"Browse by category:</p>\n<ul>\n{items}</ul>\n</body>\n</html>\n")


def write_site(world: World, pages_dir: Path) -> dict[str, int]:
    """Write every page under ``pages_dir``: ``index.html``, ``wiki/<Slug>.html`` (one per entity) and
    ``category/<Type>.html``; returns counts for the manifest."""
    wiki = pages_dir / "wiki"
    wiki.mkdir(parents=True, exist_ok=True)
    total = 0
    for entity in world.entities:
        text = render_entity(world, entity)
        (wiki / f"{entity.slug}.html").write_text(text, encoding="utf-8")
        total += len(text.encode("utf-8"))
    (pages_dir / "category").mkdir(exist_ok=True)
    for etype in TYPES:
        (pages_dir / f"{category_path(etype).lstrip('/')}.html").write_text(render_category(world, etype), encoding="utf-8")
    (pages_dir / "index.html").write_text(render_index(world), encoding="utf-8")
    return {"entity_pages": len(world.entities), "category_pages": len(TYPES), "entity_bytes": total,
            "js_pages": sum(1 for e in world.entities if e.js)}
