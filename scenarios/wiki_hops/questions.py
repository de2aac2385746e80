"""Question generation for wiki-hops: deterministic, seeded, with a gold decomposition into hops.

Kinds:
    ``lookup`` (stage 1): one fact of a named entity ("Where was Orvel Dunmarch born?").
    ``chain`` (stage 2, 2-4 hops): follow entity-valued relations, then read a fact ("In what year was
        the employer of the creator of The Ashen Codex founded?").
    ``comparison`` (stage 2, 2-4 hops): compare a year or a population of two entities, each side
        optionally reached through one hop first; the answer is the winning entity's name.
    ``aggregation`` (stage 2, 2-4 hops): 1-3 hops, then count a reverse-relation list ("How many works
        were created by the founder of Velmora Press?").

Each task carries ``metadata["chains"]`` (lists of hop indices; within a chain, hop k+1 is about the
answer of hop k) and ``metadata["combine"]`` (``"last"``, ``"min"`` or ``"max"``: the answer is the last
hop's answer, or the entity of the chain whose final value is smallest / largest). The oracle uses
them; the gold answers of the hops are never needed to solve a task.

Splits: for each stage the test part is drawn first; a train candidate is rejected when any of its hop
questions is a hop question of that stage's test part, and question texts are unique overall.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from mgrpo_scenarios.base import Hop, Task

from .world import REVERSES, SCHEMA, TYPES, Entity, World

__all__ = ["SPLITS", "DEFAULT_SIZES", "FACT_QUESTIONS", "COUNT_QUESTIONS", "generate_tasks", "number_words"]

SPLITS = ("stage1/train", "stage1/test", "stage2/train", "stage2/test", "stage2/heldout")
#: ``stage2/heldout`` is drawn after the train part, so asking for it leaves every other split as it was
#: (the warm start's demonstrations included); its questions share no hop question with train or test.
#: Empty by default: ``split_sizes: {stage2/heldout: N}`` asks for N questions that neither the warm
#: start nor RL on ``stage2/train`` ever saw (a larger held-out set than ``stage2/test``'s 100).
DEFAULT_SIZES = {"stage1/train": 400, "stage1/test": 100, "stage2/train": 400, "stage2/test": 100, "stage2/heldout": 0}

FACT_QUESTIONS: dict[tuple[str, str], str] = {
    ("person", "born_in"): "Where was {x} born?",
    ("person", "birth_year"): "In what year was {x} born?",
    ("person", "employer"): "Which organisation employed {x}?",
    ("person", "spouse"): "Who was the spouse of {x}?",
    ("person", "occupation"): "What was the occupation of {x}?",
    ("place", "located_in"): "Where is {x} located?",
    ("place", "founded"): "In what year was {x} founded?",
    ("place", "population"): "What is the population of {x}?",
    ("organisation", "founder"): "Who founded {x}?",
    ("organisation", "headquarters"): "Where is {x} headquartered?",
    ("organisation", "founded"): "In what year was {x} founded?",
    ("organisation", "industry"): "In which industry does {x} operate?",
    ("work", "creator"): "Who created {x}?",
    ("work", "publisher"): "Which organisation published {x}?",
    ("work", "published"): "In what year was {x} published?",
    ("work", "genre"): "What is the genre of {x}?",
    ("event", "location"): "Where did {x} take place?",
    ("event", "year"): "In what year did {x} take place?",
    ("event", "organiser"): "Which organisation organised {x}?",
}

NOUN_PHRASES: dict[tuple[str, str], tuple[str, ...]] = {
    ("person", "born_in"): ("the birthplace of {x}", "the place where {x} was born"),
    ("person", "employer"): ("the employer of {x}", "the organisation that employed {x}"),
    ("person", "spouse"): ("the spouse of {x}",),
    ("place", "located_in"): ("the territory that contains {x}",),
    ("organisation", "founder"): ("the founder of {x}", "the person who founded {x}"),
    ("organisation", "headquarters"): ("the place where {x} is headquartered",),
    ("work", "creator"): ("the creator of {x}", "the person who created {x}"),
    ("work", "publisher"): ("the publisher of {x}", "the organisation that published {x}"),
    ("event", "location"): ("the place where {x} took place",),
    ("event", "organiser"): ("the organiser of {x}", "the organisation that organised {x}"),
}

COUNT_QUESTIONS: dict[str, str] = {
    "works": "How many works were created by {x}?",
    "organisations_founded": "How many organisations were founded by {x}?",
    "people_born": "How many people were born in {x}?",
    "places_within": "How many places are located in {x}?",
    "organisations_based": "How many organisations are headquartered in {x}?",
    "events_held": "How many events were held in {x}?",
    "employees": "How many people were employed by {x}?",
    "works_published": "How many works were published by {x}?",
    "events_organised": "How many events were organised by {x}?",
}

COMPARISONS: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {
    ("person", "birth_year"): (("Who was born earlier, {a} or {b}?", "min"), ("Who was born later, {a} or {b}?", "max")),
    ("place", "founded"): (("Which was founded earlier, {a} or {b}?", "min"), ("Which was founded later, {a} or {b}?", "max")),
    ("place", "population"): (("Which has the larger population, {a} or {b}?", "max"),
                              ("Which has the smaller population, {a} or {b}?", "min")),
    ("organisation", "founded"): (("Which was founded earlier, {a} or {b}?", "min"),
                                  ("Which was founded later, {a} or {b}?", "max")),
    ("work", "published"): (("Which was published earlier, {a} or {b}?", "min"),
                            ("Which was published later, {a} or {b}?", "max")),
    ("event", "year"): (("Which took place earlier, {a} or {b}?", "min"), ("Which took place later, {a} or {b}?", "max")),
}

_ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


def number_words(n: int) -> str | None:
    """English words for 0..99 ("forty-two"); None outside that range."""
    if 0 <= n < 20:
        return _ONES[n]
    if 20 <= n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    return None


def _aliases(world: World, entity: Entity, key: str) -> tuple[str, ...]:
    display, answer = world.display(entity, key), world.answer(entity, key)
    return (display,) if display and display != answer else ()


def _fact_hop(world: World, entity: Entity, key: str) -> Hop:
    return Hop(FACT_QUESTIONS[(entity.type, key)].format(x=entity.name), world.answer(entity, key) or "",
               entity.name, key)


def _count_hop(world: World, entity: Entity, rev_key: str) -> Hop:
    return Hop(COUNT_QUESTIONS[rev_key].format(x=entity.name), str(len(world.members(entity, rev_key))),
               entity.name, rev_key)


def _entity_relations(etype: str) -> list[str]:
    return [r.key for r in SCHEMA[etype] if r.is_entity]


_WALK_WEIGHT = {"located_in": 0.3, "spouse": 0.6}


def _walk(rng: random.Random, world: World, start: Entity, steps: int) -> list[tuple[Entity, str]] | None:
    """Follow ``steps`` entity-valued relations from ``start`` without revisiting an entity.
    Returns [(entity, relation followed from it), ...]; None when stuck."""
    path: list[tuple[Entity, str]] = []
    seen = [start.id]
    current = start
    for _ in range(steps):
        options = [k for k in _entity_relations(current.type)
                   if k in current.facts and int(current.facts[k]) not in seen]
        if not options:
            return None
        key = rng.choices(options, [_WALK_WEIGHT.get(k, 1.0) for k in options])[0]
        path.append((current, key))
        current = world.entities[int(current.facts[key])]
        seen.append(current.id)
    return path


def _noun_phrase(rng: random.Random, path: list[tuple[Entity, str]]) -> str:
    phrase = path[0][0].name if path else ""
    for entity, key in path:
        phrase = rng.choice(NOUN_PHRASES[(entity.type, key)]).format(x=phrase)
    return phrase


def _end_of(world: World, start: Entity, path: list[tuple[Entity, str]]) -> Entity:
    return world.entities[int(path[-1][0].facts[path[-1][1]])] if path else start


def _lookup(rng: random.Random, world: World) -> Task | None:
    entity = rng.choice(world.entities)
    key = rng.choice(list(entity.facts))
    hop = _fact_hop(world, entity, key)
    return Task("", hop.question, hop.answer, kind="lookup", hops=(hop,), aliases=_aliases(world, entity, key),
                metadata={"chains": [[0]], "combine": "last"})


def _chain(rng: random.Random, world: World) -> Task | None:
    start = rng.choice(world.entities)
    n_hops = rng.choices((2, 3, 4), (0.35, 0.35, 0.3))[0]
    path = _walk(rng, world, start, n_hops - 1)
    if path is None:
        return None
    end = _end_of(world, start, path)
    used = [start.id] + [int(e.facts[k]) for e, k in path]
    keys = [k for k in end.facts if not (k in _entity_relations(end.type) and int(end.facts[k]) in used)]
    if not keys:
        return None
    key = rng.choice(keys)
    hops = tuple(_fact_hop(world, e, k) for e, k in path) + (_fact_hop(world, end, key),)
    question = FACT_QUESTIONS[(end.type, key)].format(x=_noun_phrase(rng, path))
    return Task("", question, hops[-1].answer, kind="chain", hops=hops, aliases=_aliases(world, end, key),
                metadata={"chains": [list(range(len(hops)))], "combine": "last"})


def _aggregation(rng: random.Random, world: World) -> Task | None:
    start = rng.choice(world.entities)
    path = _walk(rng, world, start, rng.choices((1, 2, 3), (0.5, 0.3, 0.2))[0])
    if path is None:
        return None
    end = _end_of(world, start, path)
    revs = [r.key for r in REVERSES[end.type] if world.members(end, r.key)]
    if not revs:
        return None
    rev = rng.choice(revs)
    if len(world.members(end, rev)) == 1 and rng.random() < 0.6:
        return None
    hops = tuple(_fact_hop(world, e, k) for e, k in path) + (_count_hop(world, end, rev),)
    count = int(hops[-1].answer)
    words = number_words(count)
    question = COUNT_QUESTIONS[rev].format(x=_noun_phrase(rng, path))
    return Task("", question, str(count), kind="aggregation", hops=hops, aliases=(words,) if words else (),
                metadata={"chains": [list(range(len(hops)))], "combine": "last"})


def _into(etype: str) -> list[tuple[str, str]]:
    return [(src, r.key) for src in TYPES for r in SCHEMA[src] if r.is_entity and r.target == etype]


def _comparison(rng: random.Random, world: World) -> Task | None:
    etype, key = rng.choice(list(COMPARISONS))
    template, combine = rng.choice(COMPARISONS[(etype, key)])
    n_pre = rng.choices((0, 1, 2), (0.35, 0.25, 0.4))[0] if _into(etype) else 0
    sides: list[tuple[list[tuple[Entity, str]], Entity]] = []
    for i in range(2):
        if i < n_pre:
            src_type, rel = rng.choice(_into(etype))
            src = rng.choice(world.by_type(src_type))
            if rel not in src.facts:
                return None
            sides.append(([(src, rel)], world.entities[int(src.facts[rel])]))
        else:
            target = rng.choice(world.by_type(etype))
            sides.append(([], target))
    (path_a, a), (path_b, b) = sides
    if a.id == b.id or a.facts.get(key) == b.facts.get(key) or key not in a.facts or key not in b.facts:
        return None
    if path_a and path_b and path_a[0][0].id == path_b[0][0].id:
        return None
    winner = (min if combine == "min" else max)((a, b), key=lambda e: int(e.facts[key]))
    phrases = [_noun_phrase(rng, p) if p else e.name for p, e in sides]
    hops: list[Hop] = []
    chains = []
    for path, end in sides:
        start = len(hops)
        hops += [_fact_hop(world, e, k) for e, k in path] + [_fact_hop(world, end, key)]
        chains.append(list(range(start, len(hops))))
    question = template.format(a=phrases[0], b=phrases[1])
    return Task("", question, winner.name, kind="comparison", hops=tuple(hops),
                metadata={"chains": chains, "combine": combine})


_STAGE2 = ((_chain, 0.5), (_comparison, 0.25), (_aggregation, 0.25))


def _candidates(rng: random.Random, world: World, stage: str) -> Iterator[Task]:
    makers = [m for m, _ in _STAGE2]
    weights = [w for _, w in _STAGE2]
    while True:
        maker = _lookup if stage == "stage1" else rng.choices(makers, weights)[0]
        task = maker(rng, world)
        if task is not None:
            yield task


def generate_tasks(world: World, sizes: dict[str, int] | None = None) -> dict[str, list[Task]]:
    """All splits' tasks for ``world``: ``{"stage1/train": [...], ...}`` in a fixed order.

    A split may come out smaller than asked when the world is too small to hold that many distinct
    questions (a candidate budget of 60 draws per requested task).
    """
    sizes = {**DEFAULT_SIZES, **(sizes or {})}
    out: dict[str, list[Task]] = {}
    seen_questions: dict[str, None] = {}
    for stage in ("stage1", "stage2"):
        rng = random.Random(f"wiki-hops:{world.seed}:questions:{stage}")
        candidates = _candidates(rng, world, stage)
        test_hops: dict[str, None] = {}
        seen_hops: dict[str, None] = {}  # every hop question of test and train: none may recur held out
        for part in (p for p in ("test", "train", "heldout") if f"{stage}/{p}" in SPLITS):  # stage 1 has no heldout
            split = f"{stage}/{part}"
            want = sizes[split]
            picked: list[Task] = []
            for _ in range(60 * want):
                if len(picked) >= want:
                    break
                task = next(candidates)
                if task.question in seen_questions:
                    continue
                hop_questions = [h.question for h in task.hops]
                if part == "train" and any(q in test_hops for q in hop_questions):
                    continue
                if part == "heldout" and any(q in seen_hops for q in hop_questions):
                    continue
                if part == "test":
                    test_hops.update(dict.fromkeys(hop_questions))
                seen_hops.update(dict.fromkeys(hop_questions))
                seen_questions[task.question] = None
                picked.append(Task(
                    id=f"wh-s{world.seed}-{stage}-{part}-{len(picked):04d}", question=task.question,
                    answer=task.answer, split=split, hops=task.hops, kind=task.kind, aliases=task.aliases,
                    metadata={**task.metadata, "num_hops": len(task.hops)},
                ))
            out[split] = picked
    return {split: out[split] for split in SPLITS}
