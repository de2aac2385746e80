"""The entity graph of the wiki-hops world: a seeded, fictional encyclopedia.

Five entity types (people, places, organisations, works, events) with typed relations. A relation is
either entity-valued (``born_in`` -> a place) or literal (a year, a number, a word). Reverse relations
(a person's works, the people born in a place) are derived from the forward ones and listed on pages,
so counting questions are answerable from the pages alone.

Names are invented from syllables, unique overall (case-insensitive), and a share of entities gets a
*near-duplicate* sibling (one letter changed, or a qualifier added: ``Orvel Dunmarch`` vs
``Orvel Dunmarsh``, ``Velmora`` vs ``Velmora Heights``) as a distractor with its own, different facts.

Everything comes from ``random.Random`` instances seeded from the world's seed; nothing reads the
global random state, the clock or ``hash()`` of a string, and nothing iterates a set. Same seed and
size -> the same world.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import cached_property

__all__ = [
    "TYPES",
    "TYPE_PLURAL",
    "Relation",
    "Reverse",
    "SCHEMA",
    "REVERSES",
    "RELATION_BY_KEY",
    "REVERSE_BY_KEY",
    "Entity",
    "World",
    "generate_world",
    "slugify",
]

TYPES = ("person", "place", "organisation", "work", "event")
TYPE_PLURAL = {"person": "People", "place": "Places", "organisation": "Organisations", "work": "Works", "event": "Events"}
TYPE_SHARE = {"person": 0.35, "place": 0.15, "organisation": 0.15, "work": 0.25, "event": 0.10}


@dataclass(frozen=True)
class Relation:
    """A forward relation. ``target`` is an entity type for entity-valued relations, else
    ``"year"``, ``"number"`` or ``"text"``. ``label`` is the infobox row label."""

    key: str
    source: str
    label: str
    target: str

    @property
    def is_entity(self) -> bool:
        return self.target in TYPES

    @property
    def is_numeric(self) -> bool:
        return self.target in ("year", "number")


@dataclass(frozen=True)
class Reverse:
    """A reverse relation listed on the owner's page under ``heading``: every entity of type
    ``member`` whose forward relation ``via`` points at the owner. ``count_label`` is the infobox row
    that gives the list's size (``Number of employees | 12``), as Wikipedia infoboxes do: a count read
    from one row, not by paging through the list (the tiny profile's sub-agent has three turns)."""

    key: str
    owner: str
    heading: str
    member: str
    via: str
    count_label: str


SCHEMA: dict[str, tuple[Relation, ...]] = {
    "person": (
        Relation("born_in", "person", "Born in", "place"),
        Relation("birth_year", "person", "Birth year", "year"),
        Relation("employer", "person", "Employer", "organisation"),
        Relation("spouse", "person", "Spouse", "person"),
        Relation("occupation", "person", "Occupation", "text"),
    ),
    "place": (
        Relation("located_in", "place", "Located in", "place"),
        Relation("founded", "place", "Founded", "year"),
        Relation("population", "place", "Population", "number"),
    ),
    "organisation": (
        Relation("founder", "organisation", "Founder", "person"),
        Relation("headquarters", "organisation", "Headquarters", "place"),
        Relation("founded", "organisation", "Founded", "year"),
        Relation("industry", "organisation", "Industry", "text"),
    ),
    "work": (
        Relation("creator", "work", "Creator", "person"),
        Relation("publisher", "work", "Publisher", "organisation"),
        Relation("published", "work", "Published", "year"),
        Relation("genre", "work", "Genre", "text"),
    ),
    "event": (
        Relation("location", "event", "Location", "place"),
        Relation("year", "event", "Year", "year"),
        Relation("organiser", "event", "Organiser", "organisation"),
    ),
}

REVERSES: dict[str, tuple[Reverse, ...]] = {
    "person": (
        Reverse("works", "person", "Works", "work", "creator", "Number of works"),
        Reverse("organisations_founded", "person", "Organisations founded", "organisation", "founder",
                "Number of organisations founded"),
    ),
    "place": (
        Reverse("people_born", "place", "People born here", "person", "born_in",
                "Number of people born here"),
        Reverse("places_within", "place", "Places located here", "place", "located_in",
                "Number of places within"),
        Reverse("organisations_based", "place", "Organisations headquartered here", "organisation", "headquarters",
                "Number of organisations based here"),
        Reverse("events_held", "place", "Events held here", "event", "location",
                "Number of events held here"),
    ),
    "organisation": (
        Reverse("employees", "organisation", "Employees", "person", "employer", "Number of employees"),
        Reverse("works_published", "organisation", "Works published", "work", "publisher",
                "Number of works published"),
        Reverse("events_organised", "organisation", "Events organised", "event", "organiser",
                "Number of events organised"),
    ),
    "work": (),
    "event": (),
}

RELATION_BY_KEY: dict[tuple[str, str], Relation] = {(r.source, r.key): r for rels in SCHEMA.values() for r in rels}
REVERSE_BY_KEY: dict[str, Reverse] = {r.key: r for revs in REVERSES.values() for r in revs}

OCCUPATIONS = (
    "cartographer", "poet", "engineer", "composer", "merchant", "astronomer", "architect", "physician",
    "painter", "historian", "botanist", "shipwright", "glassblower", "surveyor", "playwright", "clockmaker",
)
INDUSTRIES = (
    "shipbuilding", "publishing", "textiles", "cartography", "brewing", "banking", "glassmaking", "clockmaking",
    "printing", "mining", "rail transport", "salt trading", "instrument making", "insurance",
)
GENRES = (
    "novel", "epic poem", "treatise", "symphony", "atlas", "stage play", "chronicle", "opera",
    "essay collection", "travelogue", "song cycle", "almanac",
)

_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr",
           "kr", "tr", "th", "st", "sh", "ch", "vr", "fl", "gl", "sk", "w", "c", "j", "m", "l", "r", "n", "d")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "a", "e", "i", "o", "ae", "ei", "ou", "ia")
_MEDIAL = ("n", "r", "l", "s", "m")
_CODAS = ("", "", "", "", "n", "r", "l", "s", "th", "m", "rn", "st", "nd", "x", "v", "ch", "sh", "ld", "rk")
_SIMILAR = {
    "a": "eo", "e": "ai", "i": "eo", "o": "au", "u": "oa", "y": "i", "b": "pv", "c": "kg", "d": "tb",
    "f": "vp", "g": "kc", "h": "k", "j": "g", "k": "cg", "l": "rn", "m": "n", "n": "m", "p": "bf", "q": "k",
    "r": "l", "s": "zc", "t": "d", "v": "fw", "w": "v", "x": "s", "z": "s",
}
_PLACE_QUALIFIERS = ("{} Heights", "New {}", "Upper {}", "{} Falls", "Port {}", "{} Crossing", "Lower {}")
_ORG_SUFFIXES = ("Press", "Guild", "Company", "Institute", "Society", "Works", "Trading House", "Foundry",
                 "Bank", "Academy", "Collective", "Observatory", "Brewery")
_ORG_QUALIFIERS = ("Royal {}", "Northern {}", "{} International", "United {}", "New {}")
_WORK_PATTERNS = ("The {}", "Songs of {}", "The {} Codex", "Letters from {}", "A History of {}",
                  "The {} Variations", "Tales of {}", "The Book of {}", "Nights in {}")
_WORK_QUALIFIERS = ("{} II", "{} Revisited", "{} Retold")
_EVENT_PATTERNS = ("Battle of {}", "Treaty of {}", "{} Festival", "Siege of {}", "{} Exposition",
                   "Council of {}", "{} Regatta", "Great {} Fire", "{} Games", "Congress of {}")
_EVENT_QUALIFIERS = ("Second {}", "{} Reprise", "Little {}")
_FIXED_WORDS = frozenset({"the", "of", "from", "a", "in", "and", "history", "book", "songs", "letters", "tales",
                          "nights", "codex", "variations", "battle", "treaty", "festival", "siege", "exposition",
                          "council", "regatta", "great", "fire", "games", "congress", "category"}
                         | {w.lower() for suffix in _ORG_SUFFIXES for w in suffix.split()})


def slugify(name: str) -> str:
    """The page slug of a name: spaces become underscores (names hold only letters and spaces)."""
    return name.replace(" ", "_")


@dataclass
class Entity:
    """One encyclopedia entry. ``facts`` maps a relation key to its value: an entity id for
    entity-valued relations, an int for years and numbers, a str for text. ``sibling_of`` is the id of
    the entity this one is a near-duplicate of (or None)."""

    id: int
    type: str
    name: str
    facts: dict[str, int | str] = field(default_factory=dict)
    sibling_of: int | None = None
    js: bool = False

    @property
    def slug(self) -> str:
        return slugify(self.name)


@dataclass
class World:
    """The generated graph: entities by id plus reverse relations (owner id -> key -> member ids,
    in id order)."""

    seed: int
    entities: list[Entity]
    reverse: dict[int, dict[str, list[int]]]

    @cached_property
    def _by_type(self) -> dict[str, list[Entity]]:
        out: dict[str, list[Entity]] = {t: [] for t in TYPES}
        for e in self.entities:
            out[e.type].append(e)
        return out

    @cached_property
    def siblings(self) -> dict[int, list[int]]:
        """Near-duplicate pairs, both ways: entity id -> ids of its siblings."""
        out: dict[int, list[int]] = {}
        for e in self.entities:
            if e.sibling_of is not None:
                out.setdefault(e.sibling_of, []).append(e.id)
                out.setdefault(e.id, []).append(e.sibling_of)
        return out

    def by_type(self, etype: str) -> list[Entity]:
        """The entities of one type, in id order (a shared list: do not modify it)."""
        return self._by_type[etype]

    def display(self, entity: Entity, key: str) -> str | None:
        """The fact as pages show it: a name, a year, a number with thousands separators, a word."""
        value = self.answer(entity, key)
        if value is not None and RELATION_BY_KEY[(entity.type, key)].target == "number":
            return f"{int(value):,}"
        return value

    def answer(self, entity: Entity, key: str) -> str | None:
        """The canonical gold answer of a fact (numbers without separators); None when absent."""
        value = entity.facts.get(key)
        if value is None:
            return None
        return self.entities[int(value)].name if RELATION_BY_KEY[(entity.type, key)].is_entity else str(value)

    def members(self, entity: Entity, key: str) -> list[Entity]:
        return [self.entities[i] for i in self.reverse.get(entity.id, {}).get(key, [])]


# ----------------------------------------------------------------------------------------- names


def _word(rng: random.Random, syllables: int) -> str:
    parts = []
    for i in range(syllables):
        onset = rng.choice(_ONSETS) if i == 0 or rng.random() < 0.9 else ""
        vowel = rng.choice(_VOWELS) if onset else rng.choice(_VOWELS[:5])
        medial = rng.choice(_MEDIAL) if i < syllables - 1 and rng.random() < 0.25 else ""
        parts.append(onset + vowel + medial)
    parts.append(rng.choice(_CODAS))
    return "".join(parts).capitalize()


def _one_letter_variant(rng: random.Random, name: str) -> str:
    words = name.split(" ")
    candidates = [i for i, w in enumerate(words) if w.lower() not in _FIXED_WORDS and len(w) >= 4]
    if not candidates:
        return name
    wi = rng.choice(candidates)
    word = words[wi]
    pos = rng.randrange(1, len(word))
    letter = word[pos]
    options = _SIMILAR.get(letter.lower(), "")
    if not options:
        return name
    words[wi] = word[:pos] + rng.choice(options) + word[pos + 1:]
    return " ".join(words)


def _qualified_variant(rng: random.Random, name: str, etype: str) -> str:
    if etype == "place":
        return rng.choice(_PLACE_QUALIFIERS).format(name)
    if etype == "organisation":
        return rng.choice(_ORG_QUALIFIERS).format(name)
    if etype == "work":
        return rng.choice(_WORK_QUALIFIERS).format(name)
    if etype == "event":
        return rng.choice(_EVENT_QUALIFIERS).format(name)
    return _one_letter_variant(rng, name)


class _Namer:
    """Invents unique names per type; ``taken`` holds every lower-cased name already used."""

    def __init__(self, rng: random.Random, n_people: int) -> None:
        self.rng = rng
        self.taken: dict[str, None] = {}
        self.given = [_word(rng, rng.choice((1, 2, 2))) for _ in range(max(8, n_people // 4))]

    def _claim(self, name: str) -> bool:
        key = name.lower()
        if key in self.taken or not name.replace(" ", "").isalpha() or key.startswith("category"):
            return False
        self.taken[key] = None
        return True

    def fresh(self, etype: str) -> str:
        rng = self.rng
        while True:
            if etype == "person":
                name = f"{rng.choice(self.given)} {_word(rng, rng.choice((2, 2, 3)))}"
            elif etype == "place":
                base = _word(rng, rng.choice((2, 3, 3)))
                name = rng.choice(_PLACE_QUALIFIERS).format(base) if rng.random() < 0.15 else base
            elif etype == "organisation":
                name = f"{_word(rng, rng.choice((2, 3)))} {rng.choice(_ORG_SUFFIXES)}"
            elif etype == "work":
                name = rng.choice(_WORK_PATTERNS).format(_word(rng, rng.choice((2, 3))))
            else:
                name = rng.choice(_EVENT_PATTERNS).format(_word(rng, rng.choice((2, 3))))
            if self._claim(name):
                return name

    def sibling(self, etype: str, base: str) -> str | None:
        for _ in range(20):
            if self.rng.random() < 0.6 or etype == "person":
                name = _one_letter_variant(self.rng, base)
            else:
                name = _qualified_variant(self.rng, base, etype)
            if name != base and self._claim(name):
                return name
        return None


# ----------------------------------------------------------------------------------------- graph


def _type_counts(n: int) -> dict[str, int]:
    counts = {t: max(2, round(TYPE_SHARE[t] * n)) for t in TYPES[:-1]}
    counts["event"] = max(2, n - sum(counts.values()))
    return counts


def _popularity(rng: random.Random, ids: list[int], exponent: float = 0.7) -> list[float]:
    """Zipf-like weights over a shuffled copy of ``ids`` (returned aligned with ``ids``)."""
    order = ids[:]
    rng.shuffle(order)
    rank = {eid: r for r, eid in enumerate(order)}
    return [1.0 / (rank[eid] + 1) ** exponent for eid in ids]


def generate_world(seed: int, num_entities: int = 2000, js_fraction: float = 0.1,
                   near_dup_fraction: float = 0.1) -> World:
    """Generate the entity graph.

    Args:
        seed: the only source of randomness.
        num_entities: total number of entities (>= 50), split over the five types.
        js_fraction: share of entities whose page body is built by JavaScript.
        near_dup_fraction: share of entities that are a near-duplicate sibling of another one.
    """
    if num_entities < 50:
        raise ValueError(f"num_entities must be >= 50, got {num_entities}")
    if not 0.0 <= js_fraction <= 1.0 or not 0.0 <= near_dup_fraction <= 0.5:
        raise ValueError("js_fraction must be in [0, 1] and near_dup_fraction in [0, 0.5]")
    rng = random.Random(seed)
    counts = _type_counts(num_entities)
    namer = _Namer(rng, counts["person"])
    entities: list[Entity] = []
    for etype in TYPES:
        n = counts[etype]
        n_dup = round(near_dup_fraction * n)
        start = len(entities)
        for _ in range(n - n_dup):
            entities.append(Entity(len(entities), etype, namer.fresh(etype)))
        bases = rng.sample(range(start, len(entities)), min(n_dup, len(entities) - start))
        for base_id in bases:
            name = namer.sibling(etype, entities[base_id].name) or namer.fresh(etype)
            entities.append(Entity(len(entities), etype, name, sibling_of=base_id))
    ids = {t: [e.id for e in entities if e.type == t] for t in TYPES}
    _assign_places(rng, entities, ids["place"])
    _assign_people(rng, entities, ids)
    _assign_organisations(rng, entities, ids)
    _assign_works(rng, entities, ids)
    _assign_events(rng, entities, ids)
    for eid in rng.sample(range(len(entities)), round(js_fraction * len(entities))):
        entities[eid].js = True
    return World(seed, entities, _reverse(entities))


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return int(round(low * (high / low) ** rng.random()))


def _assign_places(rng: random.Random, entities: list[Entity], place_ids: list[int]) -> None:
    order = place_ids[:]
    rng.shuffle(order)
    n_countries = max(2, round(0.08 * len(order)))
    n_regions = max(2, round(0.25 * len(order)))
    countries, regions, towns = order[:n_countries], order[n_countries:n_countries + n_regions], order[n_countries + n_regions:]
    for eid in countries:
        entities[eid].facts.update(founded=rng.randint(600, 1750), population=_log_uniform(rng, 800_000, 60_000_000))
    for eid in regions:
        entities[eid].facts.update(located_in=rng.choice(countries), founded=rng.randint(700, 1850),
                                   population=_log_uniform(rng, 60_000, 4_000_000))
    parents = regions + countries
    weights = [3.0] * len(regions) + [1.0] * len(countries)
    for eid in towns:
        entities[eid].facts.update(located_in=rng.choices(parents, weights)[0], founded=rng.randint(800, 1960),
                                   population=_log_uniform(rng, 400, 900_000))


def _assign_people(rng: random.Random, entities: list[Entity], ids: dict[str, list[int]]) -> None:
    places, orgs, people = ids["place"], ids["organisation"], ids["person"]
    place_w = _popularity(rng, places)
    org_w = _popularity(rng, orgs, 0.5)
    for eid in people:
        facts = entities[eid].facts
        facts["born_in"] = rng.choices(places, place_w)[0]
        facts["birth_year"] = rng.randint(1720, 1995)
        if rng.random() < 0.85:
            facts["employer"] = rng.choices(orgs, org_w)[0]
        facts["occupation"] = rng.choice(OCCUPATIONS)
    married = rng.sample(people, 2 * (len(people) * 2 // 10))
    for a, b in zip(married[0::2], married[1::2], strict=True):
        entities[a].facts["spouse"] = b
        entities[b].facts["spouse"] = a


def _assign_organisations(rng: random.Random, entities: list[Entity], ids: dict[str, list[int]]) -> None:
    people, places = ids["person"], ids["place"]
    founder_w = _popularity(rng, people, 0.7)
    place_w = _popularity(rng, places)
    for eid in ids["organisation"]:
        founder = rng.choices(people, founder_w)[0]
        born = int(entities[founder].facts["birth_year"])
        entities[eid].facts.update(founder=founder, headquarters=rng.choices(places, place_w)[0],
                                   founded=min(2020, born + rng.randint(20, 60)), industry=rng.choice(INDUSTRIES))


def _assign_works(rng: random.Random, entities: list[Entity], ids: dict[str, list[int]]) -> None:
    people, orgs = ids["person"], ids["organisation"]
    creators = rng.sample(people, max(2, len(people) * 4 // 10))
    creator_w = _popularity(rng, creators, 0.6)
    pub_w = _popularity(rng, orgs)
    for eid in ids["work"]:
        creator = rng.choices(creators, creator_w)[0]
        year = min(2023, int(entities[creator].facts["birth_year"]) + rng.randint(18, 70))
        entities[eid].facts.update(creator=creator, publisher=rng.choices(orgs, pub_w)[0], published=year,
                                   genre=rng.choice(GENRES))


def _assign_events(rng: random.Random, entities: list[Entity], ids: dict[str, list[int]]) -> None:
    places, orgs = ids["place"], ids["organisation"]
    place_w = _popularity(rng, places)
    org_w = _popularity(rng, orgs)
    for eid in ids["event"]:
        entities[eid].facts.update(location=rng.choices(places, place_w)[0], year=rng.randint(1750, 2022),
                                   organiser=rng.choices(orgs, org_w)[0])


def _reverse(entities: list[Entity]) -> dict[int, dict[str, list[int]]]:
    out: dict[int, dict[str, list[int]]] = {}
    for revs in REVERSES.values():
        for rev in revs:
            for e in entities:
                if e.type == rev.member and rev.via in e.facts:
                    out.setdefault(int(e.facts[rev.via]), {}).setdefault(rev.key, []).append(e.id)
    return out
