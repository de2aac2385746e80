"""The ``wiki-hops`` scenario: a seeded fictional encyclopedia served on loopback, with multi-hop questions.

Description:
    A world of ~2,000 invented entities (people, places, organisations, works, events) linked by typed
    relations, rendered as one HTML page per entity (infobox, prose, reverse-relation lists, distractor
    links; a share of pages is built by JavaScript). No model can know the answers in advance: every
    name and fact is generated from the seed. Agents answer with the ``search`` (tantivy index of the
    pages), ``visit`` and ``click`` tools, exactly as on the open web.

URLs:
    Agents see the world at the stable origin :data:`ORIGIN` (``http://wiki-hops.test``, a reserved
    ``.test`` name that never resolves): search results, ``visit``'s ``URL:`` line, page links and
    redirects all use it, whatever loopback port serves the run, so the same calls give the same
    texts in every run and a response cache replays across runs. The tools map that origin to the
    real loopback site (``WikiWorld.served_url``) when they connect (:mod:`mgrpo_tools.origin_map`).
    Titles are MediaWiki-style: ``/wiki/Motochil Crossing`` (or ``%20``) redirects to
    ``/wiki/Motochil_Crossing``.

Splits:
    ``stage1/train``, ``stage1/test`` (one-hop lookups), ``stage2/train``, ``stage2/test`` (2-4 hop
    chains, comparisons, aggregations) and ``stage2/heldout`` (empty unless ``split_sizes`` asks for
    it: stage-2 questions drawn after the train part, sharing no hop with train or test, so adding
    it changes no other split). ``stage1`` and ``stage2`` alone mean their train part.

Arguments:
    seed: the only source of randomness (same seed, version and size -> byte-identical pages and tasks).
    num_entities: world size (default 2000).
    js_fraction: share of pages whose body is built by an inline script (default 0.1).
    data_dir: where worlds are cached; default ``$MGRPO_DATA_DIR`` or ``~/.cache/mgrpo``. A world lives
        in ``<data_dir>/wiki-hops/v{version}-s{seed}-n{num_entities}-js{js_fraction}``.
    browser_mode: ``"auto"`` (render pages that need JavaScript in Chromium), ``"never"``, ``"always"``.
    page_chars: characters per page of text shown by ``visit`` (default 4000; 200 in the tiny profile).
    search_k: results per search query (default 5; 3 in the tiny profile).
    profile: ``"full"`` (default: the protocol as real LLMs see it) or ``"tiny"``, the switch for the
        built-in tiny models: the same world, tasks, tools and env, but every observation compact and
        every oracle action a copy from a known place (see :data:`PROFILES`): short system prompts
        (``prompt_style``), search results without snippets, ``visit`` returning only the line
        that matches its goal (the page when none does) and no link numbers, visit goals written as
        ``"<relation> of <entity>"`` and pages visited by name (MediaWiki-style
        ``/wiki/<Name>``), and :meth:`WikiHops.world_tokens` for a tokenizer in which every entity
        name, slug, value and relation is one token.
    cache_path: optional SQLite response cache shared by the fetchers and the search tool.
    render_cache: render each JavaScript page once per world and browser and serve later visits the
        same DOM (the pages are static files with deterministic scripts; ``mgrpo_tools.render_cache``).
        The renders are kept in the world folder (``rendered/<browser>.jsonl``), so later opens,
        other modes and other runs read them without launching Chromium.
    prerender: at :meth:`open`, render every JavaScript page of the world not rendered yet (four at a
        time; ~10-20 s once per world and browser for the 300-entity world's ~30 pages), so that no
        episode waits for Chromium to launch or render (RL runs: configs/demo.yaml turns it on). Off
        by default: a world opened once for a few visits renders only what it visits.
        False renders at every visit (the behaviour before the cache, for benchmarks).
    near_dup_fraction: share of entities that are near-duplicate siblings of another (default 0.1).
    split_sizes: tasks per split (default 400 train / 100 test per stage).

Version history:
    1: first version. Any change that alters pages or tasks for the same arguments bumps VERSION.
    2: URLs seen by agents changed: the stable origin ``http://wiki-hops.test`` instead of
       ``http://127.0.0.1:PORT``, and titles with spaces redirect to their underscore form. Pages
       and tasks are unchanged.
    3: every entity page's infobox gives the size of each non-empty reverse list as a row
       (``Number of people born here | 5``): a count hop is read like any other fact (in the tiny
       profile, the one evidence line of a visit), where before it took paging through the list, which
       the tiny profile's three sub-agent turns never allowed. Tasks are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mgrpo_scenarios.base import DelegationMatch, Task, Verdict, require_browser
from mgrpo_tools.base import Tool

from .pages import write_site
from .questions import DEFAULT_SIZES, SPLITS, generate_tasks
from .running import ORIGIN, WikiWorld
from .world import World, generate_world

__all__ = ["WikiHops", "WikiWorld", "VERSION", "ORIGIN"]

VERSION = "3"
# The origin agents see; the tools map it to this run's loopback port (see the module docstring).
DEFAULT_NEAR_DUP = 0.1

#: Observation and oracle settings per profile (explicit ``page_chars`` / ``search_k`` win).
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"page_chars": 4000, "search_k": 5, "snippet_chars": 300, "goal_lines": 0, "links": True,
             "evidence_only": False, "prompt_style": "full"},
    "tiny": {"page_chars": 200, "search_k": 3, "snippet_chars": 0, "goal_lines": 1, "links": False,
             "evidence_only": True, "prompt_style": "compact"},
}


def default_data_dir() -> Path:
    return Path(os.environ.get("MGRPO_DATA_DIR") or Path.home() / ".cache" / "mgrpo")


class WikiHops:
    """The built-in offline deep-research scenario (see the module docstring)."""

    name = "wiki-hops"

    def __init__(
        self,
        seed: int = 0,
        num_entities: int = 2000,
        js_fraction: float = 0.1,
        data_dir: str | Path | None = None,
        browser_mode: str = "auto",
        page_chars: int | None = None,
        search_k: int | None = None,
        cache_path: str | Path | None = None,
        near_dup_fraction: float = DEFAULT_NEAR_DUP,
        split_sizes: dict[str, int] | None = None,
        profile: str = "full",
        render_cache: bool = True,
        prerender: bool = False,
    ) -> None:
        if profile not in PROFILES:
            raise ValueError(f"profile must be one of {sorted(PROFILES)}, got {profile!r}")
        self.profile = profile
        settings = PROFILES[profile]
        page_chars = settings["page_chars"] if page_chars is None else int(page_chars)
        search_k = settings["search_k"] if search_k is None else int(search_k)
        #: system prompts of the envs over this scenario (``mgrpo_env.protocol.system_prompt`` style)
        self.prompt_style: str = settings["prompt_style"]
        if browser_mode not in ("auto", "never", "always"):
            raise ValueError(f"browser_mode must be 'auto', 'never' or 'always', got {browser_mode!r}")
        unknown = sorted(set(split_sizes or {}) - set(SPLITS))
        if unknown:
            raise ValueError(f"unknown split(s) {unknown}; valid: {list(SPLITS)}")
        if num_entities < 50:
            raise ValueError(f"num_entities must be >= 50, got {num_entities}")
        if not 0.0 <= js_fraction <= 1.0:
            raise ValueError(f"js_fraction must be in [0, 1], got {js_fraction}")
        self.seed = int(seed)
        self.num_entities = int(num_entities)
        self.js_fraction = float(js_fraction)
        self.near_dup_fraction = float(near_dup_fraction)
        self.split_sizes = {**DEFAULT_SIZES, **(split_sizes or {})}
        self.browser_mode = browser_mode
        if search_k < 1 or page_chars < 200:
            raise ValueError(f"search_k must be >= 1 and page_chars >= 200, got {search_k} and {page_chars}")
        self.page_chars = page_chars
        self.search_k = int(search_k)
        self.cache_path = Path(cache_path) if cache_path is not None else None
        self.render_cache = bool(render_cache)
        self.prerender = bool(prerender) and self.render_cache
        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        self._by_name: Any = None  # (graph, name -> entity), built on the first subtask_answer
        self.metadata: dict[str, Any] = {
            "version": VERSION,
            "seed": self.seed,
            "num_entities": self.num_entities,
            "js_fraction": self.js_fraction,
            "near_dup_fraction": self.near_dup_fraction,
            "split_sizes": dict(self.split_sizes),
            "profile": self.profile,
        }
        self._tasks: dict[str, list[Task]] | None = None

    # ------------------------------------------------------------------------------- building

    @property
    def root(self) -> Path:
        """The folder of this world: ``<data_dir>/wiki-hops/v2-s0-n2000-js0.1`` (plus a hash of any
        non-default generation option)."""
        name = f"v{VERSION}-s{self.seed}-n{self.num_entities}-js{self.js_fraction:g}"
        extra = {}
        if self.near_dup_fraction != DEFAULT_NEAR_DUP:
            extra["near_dup_fraction"] = self.near_dup_fraction
        if self.split_sizes != DEFAULT_SIZES:
            # an empty split that did not exist before keeps the folder name of worlds built before it
            extra["split_sizes"] = {s: n for s, n in self.split_sizes.items() if n or s != "stage2/heldout"}
        if extra:
            blob = json.dumps(extra, sort_keys=True).encode()
            name += "-" + hashlib.sha256(blob).hexdigest()[:8]
        return self.data_dir / "wiki-hops" / name

    def graph(self) -> World:
        """The entity graph (regenerated from the seed; cheap, well under a second at default size)."""
        return generate_world(self.seed, self.num_entities, self.js_fraction, self.near_dup_fraction)

    def build(self) -> Path:
        """Generate the world into :attr:`root` unless it is there already; returns :attr:`root`.

        Writes ``pages/`` (``index.html``, ``wiki/<Slug>.html``, ``category/<Type>.html``),
        ``tasks.jsonl``, ``index/`` (tantivy over ``wiki/*.html``) and ``manifest.json``. It is built
        in a temporary sibling folder and renamed into place, so a concurrent build or a crash never
        leaves a half world: the first rename wins and the other builder discards its copy.
        """
        from mgrpo_tools.search import TantivyIndex

        root = self.root
        if (root / "manifest.json").is_file():
            return root
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = root.parent / f".{root.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        from tqdm import tqdm

        bar = tqdm(total=3, desc=f"building wiki-hops world ({self.num_entities} entities)", unit="phase", leave=False,
                   disable=os.environ.get("MGRPO_PROGRESS", "1") == "0")
        try:
            t0 = time.perf_counter()
            bar.set_postfix_str("entities and questions")
            world = self.graph()
            tasks = generate_tasks(world, self.split_sizes)
            t1 = time.perf_counter()
            bar.update()
            bar.set_postfix_str("pages")
            site = write_site(world, tmp / "pages")
            with (tmp / "tasks.jsonl").open("w", encoding="utf-8") as f:
                for split in SPLITS:
                    for task in tasks[split]:
                        f.write(json.dumps(task.to_dict(), ensure_ascii=False, sort_keys=True) + "\n")
            t2 = time.perf_counter()
            bar.update()
            bar.set_postfix_str("search index")
            TantivyIndex.build(tmp / "pages", tmp / "index", glob="wiki/*.html")
            t3 = time.perf_counter()
            bar.update()
            manifest = {
                "scenario": self.name,
                "metadata": self.metadata,
                "counts": {
                    "entities": {t: len(world.by_type(t)) for t in ("person", "place", "organisation", "work", "event")},
                    "near_duplicates": sum(1 for e in world.entities if e.sibling_of is not None),
                    **site,
                    "tasks": {s: len(tasks[s]) for s in SPLITS},
                },
                "build_seconds": {"generate": round(t1 - t0, 3), "write": round(t2 - t1, 3),
                                  "index": round(t3 - t2, 3), "total": round(t3 - t0, 3)},
            }
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            try:
                os.rename(tmp, root)
            except OSError:
                if not (root / "manifest.json").is_file():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            bar.close()
        return root

    def manifest(self) -> dict[str, Any]:
        return json.loads((self.build() / "manifest.json").read_text())

    # ------------------------------------------------------------------------------- tasks

    def splits(self) -> list[str]:
        return list(SPLITS)

    def _load_tasks(self) -> dict[str, list[Task]]:
        if self._tasks is None:
            out: dict[str, list[Task]] = {s: [] for s in SPLITS}
            with (self.build() / "tasks.jsonl").open(encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        task = Task.from_dict(json.loads(line))
                        out[task.split].append(task)
            self._tasks = out
        return self._tasks

    def tasks(self, split: str) -> Iterator[Task]:
        """The tasks of ``split`` in a fixed order; ``"stage1"``/``"stage2"`` mean their train part."""
        name = split if "/" in split else f"{split}/train"
        if name not in SPLITS:
            raise KeyError(f"unknown split {split!r}; valid: {list(SPLITS)} (or 'stage1', 'stage2')")
        return iter(list(self._load_tasks()[name]))

    # ------------------------------------------------------------------------------- world

    @property
    def browser_needed(self) -> str | None:
        """Why this world needs Chromium (its JavaScript pages would read as empty text), or None.

        Only ``browser_mode="never"`` (or a world without JavaScript pages) runs without one.
        """
        if self.browser_mode == "always":
            return "browser_mode is 'always'"
        if self.browser_mode == "auto" and self.js_fraction > 0:
            return f"{self.js_fraction:.0%} of its pages build their text with JavaScript"
        return None

    def open(self, *, host: str = "127.0.0.1") -> WikiWorld:
        """Build if needed and start the world; use as ``with scenario.open() as world: ...``.

        ``host`` is the address the loopback site binds (``mgrpo serve --host``); keep the default
        unless the site must be reachable from other machines.

        Raises:
            BrowserUnavailable: :attr:`browser_needed` and no Chromium executable (a cheap check; the
                CLI's preflight also launches it once).
        """
        require_browser(self.name, self.browser_needed)
        settings = PROFILES[self.profile]
        world = WikiWorld(self.build(), host=host, browser_mode=self.browser_mode, page_chars=self.page_chars,
                          search_k=self.search_k, cache_path=self.cache_path,
                          snippet_chars=settings["snippet_chars"], goal_lines=settings["goal_lines"],
                          links=settings["links"], evidence_only=settings["evidence_only"],
                          render_cache=self.render_cache)
        if self.prerender and self.browser_mode == "auto":
            try:
                world.prerender()
            except BaseException:
                world.close()
                raise
        return world

    def verify(self, task: Task, prediction: str) -> Verdict:
        from mgrpo_scenarios.verifiers import AnswerVerifier

        return AnswerVerifier().verify(task, prediction)

    def oracle(self, task: Task, tools: dict[str, Tool]) -> Any:
        """Solve ``task`` through ``tools`` only (see :mod:`.oracle`); returns an ``OracleRun``."""
        from .oracle import solve

        return solve(task, tools)

    def oracle_read(self, relation: str, page_text: str) -> str:
        """Read ``relation`` off a visited page's text (the oracle policy's sub-agent uses it)."""
        from .oracle import read_relation

        return read_relation(relation, page_text)

    def oracle_combine(self, task: Task, finals: list[tuple[str, str]]) -> str:
        """Combine each chain's (entity, value) report into the final answer (the oracle's main agent)."""
        from .oracle import combine

        return combine(task, finals)

    def subtask_answer(self, task: Task, subtask: str) -> str | None:
        """The gold answer of ``subtask`` as delegated: one of ``task``'s hop questions asked about
        whatever entity the subtask names (a chained hop names what the previous report said, right
        or wrong). None when the subtask is no hop question of the task, or names no entity of the world.
        The ``expert_reference: subtask`` reward scores a sub-agent's report against it."""
        from .world import REVERSE_BY_KEY

        subtask = subtask.strip()
        for hop in task.hops:
            if not hop.entity or hop.entity not in hop.question:
                continue
            prefix, _, suffix = hop.question.partition(hop.entity)
            if not (subtask.startswith(prefix) and subtask.endswith(suffix) and len(subtask) > len(prefix) + len(suffix)):
                continue
            name = subtask[len(prefix) : len(subtask) - len(suffix)]
            if self._by_name is None:
                graph = self.graph()
                self._by_name = (graph, {e.name: e for e in graph.entities})
            graph, by_name = self._by_name
            entity = by_name.get(name)
            if entity is None:
                return None
            if hop.relation in REVERSE_BY_KEY:
                return str(len(graph.members(entity, hop.relation)))
            return graph.answer(entity, hop.relation)
        return None

    def match_delegation(self, task: Task, subtask: str) -> DelegationMatch:
        """Which hop of ``task`` the delegated ``subtask`` asks: exactly one of its hop questions (compared
        after lower-casing and dropping punctuation), else why not: it names an entity of the hops with
        another relation's question (``other_relation``), or anything else (``other_entity``: another
        entity, including a chained hop asked about a wrongly reported name). :mod:`mgrpo_env.attribution`
        reads it."""
        from mgrpo_scenarios.verifiers import normalize_answer as norm

        asked = norm(subtask)
        for i, hop in enumerate(task.hops):
            if asked == norm(hop.question):
                return DelegationMatch(i)
        padded = f" {asked} "
        named = [norm(h.entity) for h in task.hops if h.entity and f" {norm(h.entity)} " in padded]
        templates = {norm(h.question.replace(h.entity, "@")) for h in task.hops if h.entity}
        bare = padded
        for name in named:
            bare = bare.replace(f" {name} ", " @ ")
        return DelegationMatch(None, "other_relation" if named and norm(bare) not in templates else "other_entity")

    def hop_answered(self, task: Task, hop: int, report: str) -> bool:
        """Whether ``report`` is hop ``hop``'s gold answer (normalised exact match; a count also in words)."""
        from mgrpo_scenarios.verifiers import exact_match

        from .questions import number_words

        gold = task.hops[hop].answer
        words = number_words(int(gold)) if gold.isdigit() and len(gold) <= 2 else None
        return exact_match(report or "", gold, (words,) if words else ())

    def page_url(self, name: str) -> str:
        """The page of an entity by its name, as agents may write it (``http://wiki-hops.test/wiki/<Name>``;
        the site redirects a title with spaces to its slug, as MediaWiki does)."""
        return f"{ORIGIN}/wiki/{name}"

    def world_tokens(self) -> list[str]:
        """Strings that a world-aware tokenizer keeps as one token each; empty in the full profile.

        Tiny profile: every entity name and page slug, every fact value as pages and answers write it,
        every relation key (the sub-agent's visit goal is ``"<relation> of <name>"``), the numbers
        0-99 and the page URL prefix ``http://wiki-hops.test/wiki/``. Copying a name, a URL or a value is then a one-token copy, which a
        small model learns in minutes where a multi-token copy takes it hours (see docs/design.md,
        "The tiny profile"). Sorted, without duplicates.
        """
        if self.profile != "tiny":
            return []
        from .world import REVERSES, SCHEMA

        world = self.graph()
        tokens: set[str] = set()
        for entity in world.entities:
            tokens.update((entity.name, entity.slug))
            for key in entity.facts:
                for value in (world.display(entity, key), world.answer(entity, key)):
                    if value:
                        tokens.add(value)
        tokens.update(r.key for rels in SCHEMA.values() for r in rels)
        tokens.update(r.key for revs in REVERSES.values() for r in revs)
        tokens.update(str(n) for n in range(100))  # counts
        tokens.add(f"{ORIGIN}/wiki/")  # a page URL is then two tokens: this prefix and the name or slug
        return sorted(tokens)

    def world_token_groups(self) -> dict[str, list[tuple[str, ...]]]:
        """Interchangeable world tokens, for relabelling demonstrations (tiny profile; empty otherwise).

        ``entity``: (name, slug) of every entity; ``year``; ``number``: (answer, as pages write it);
        ``text``: occupation / industry / genre values. Swapping the members of a group consistently
        inside one demonstration keeps every copy in it a copy (see ``WarmStartConfig.relabel``).
        """
        if self.profile != "tiny":
            return {}
        from .world import RELATION_BY_KEY

        world = self.graph()
        groups: dict[str, set[tuple[str, ...]]] = {"year": set(), "number": set(), "text": set()}
        for entity in world.entities:
            for key in entity.facts:
                relation = RELATION_BY_KEY[(entity.type, key)]
                if relation.is_entity:
                    continue
                answer, shown = world.answer(entity, key), world.display(entity, key)
                if relation.target == "number":
                    groups["number"].add((answer, shown))
                else:
                    groups[relation.target].add((answer,))
        out = {"entity": [(e.name, e.slug) for e in world.entities]}
        out.update({name: sorted(members) for name, members in groups.items()})
        return out

    def __repr__(self) -> str:
        return (f"WikiHops(seed={self.seed}, num_entities={self.num_entities}, js_fraction={self.js_fraction}, "
                f"root={str(self.root)!r})")
