"""The imperfect teacher's decisions on chats written here, in the full profile (the protocol real LLMs see:
search hits carry their own URLs, pages come in parts): no env runs, so each decision is checked where the
env's runs of the tiny world never go (a hop's page in two parts, a search that finds nothing, a search
that lists only the entity, a delegation with a context). Where no mistake is drawn the teacher must decide
as :class:`~mgrpo_env.scripted.OraclePolicy` does on the same chat; where one is drawn, as its kind says.
Draws at rates strictly between 0 and 1 are computed here from the documented hash (seed, task, episode,
agent, chat length, kind), and the seed is picked so the draw falls where the check needs it."""

from __future__ import annotations

import hashlib
import json

import pytest

from mgrpo_env.rollout import PolicyRequest
from mgrpo_env.scripted import OraclePolicy
from mgrpo_env.teacher import GUESS_THINK, ImperfectTeacher
from mgrpo_scenarios.wiki_hops.world import RELATION_BY_KEY, REVERSE_BY_KEY

LABELS = {key: relation.label for (_, key), relation in RELATION_BY_KEY.items()}
NOT_FOUND = "<think>not found</think><answer>unknown</answer>"
MISSING = "<think>missing</think><answer>unknown</answer>"


@pytest.fixture(scope="module")
def task(small_scenario):
    """A two-hop chain question of the small world whose relations are infobox rows (no reverse lists)."""
    return next(t for t in small_scenario.tasks("stage2/train") if t.kind == "chain" and len(t.hops) == 2
                and all(h.relation not in REVERSE_BY_KEY for h in t.hops))


def _tool(name: str, **arguments) -> str:
    return f"<think>{name} next</think><tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _hit_url(title: str) -> str:
    """A hit's URL as the full profile's search lists it: the slug, not ``page_url``'s spelling."""
    return f"http://wiki-hops.test/wiki/{title.replace(' ', '_')}"


def _results(query: str, titles: list[str]) -> dict:
    lines = [f'Search results for "{query}" ({len(titles)} results):', ""]
    for i, title in enumerate(titles, 1):
        lines += [f"[{i}] {title}", f"URL: {_hit_url(title)}", f"Fictopedia {title} Type | Person", ""]
    return {"role": "user", "content": "<tool_response>\n" + "\n".join(lines).rstrip() + "\n</tool_response>"}


def _page(title: str, goal: str, page: int, pages: int, body: str) -> dict:
    text = f"Goal: {goal}\nTitle: {title}\nURL: {_hit_url(title)}\nPage {page} of {pages}\n\n{body}"
    return {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}


def _said(text: str) -> dict:
    return {"role": "assistant", "content": text}


def _u(seed: int, task_id: str, agent: str, at: int, kind: str) -> float:
    key = f"{seed}|{task_id}|0|{agent}|{at}|{kind}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


def _seed(task_id: str, agent: str, kind: str, p: float, draws: dict[int, bool]) -> int:
    """The first seed whose draws of ``kind`` at the chat lengths ``draws`` come out as given."""
    return next(s for s in range(1000) if all((_u(s, task_id, agent, at, kind) < p) == want for at, want in draws.items()))


class Agent:
    """One agent's teacher and oracle, asked about the same chats."""

    def __init__(self, scenario, task, role: str, rates: dict, seed: int = 0) -> None:
        self.task, self.role, self.agent = task, role, f"{role}_0"
        self.teacher = ImperfectTeacher(scenario, role, rates, seed=seed)
        self.oracle = OraclePolicy(scenario, role)

    def _request(self, messages: list[dict]) -> PolicyRequest:
        return PolicyRequest(0, self.agent, self.role, messages[-1]["content"], messages, self.task)

    def teacher_says(self, messages: list[dict]) -> str:
        return self.teacher([self._request(messages)])[0]

    def oracle_says(self, messages: list[dict]) -> str:
        return self.oracle([self._request(messages)])[0]


def _start(task) -> list[dict]:
    return [{"role": "system", "content": "You are a research agent."}, {"role": "user", "content": task.question}]


def test_single_agent_without_a_drawn_mistake_decides_as_the_oracle_in_the_full_profile(small_scenario, task):
    """The teacher's own walk (on whenever a rate is above 0): the hit's URL, a page in two parts read
    together, a search that finds nothing retried quoted once, then given up; a page without the row."""
    first, second = task.hops
    single = Agent(small_scenario, task, "single", {"visit_wrong_hit": 1.0})  # no other hit listed: never drawn
    chat = _start(task)
    steps = [
        # the first hop's search lists its entity only: visit the hit's URL
        _results(first.entity, [first.entity]),
        # part 1 of 2 has no row of the relation: read on
        _page(first.entity, f"{first.relation} of {first.entity}", 1, 2, "Type | Person\nA long life."),
        # the row opens part 2: read from both parts, then search the next hop's entity (the value read)
        _page(first.entity, f"{first.relation} of {first.entity}", 2, 2, f"{LABELS[first.relation]} | Value One [2]\nMore."),
        _results("Value One", []),  # nothing found: the quoted retry
        _results('"Value One"', []),  # nothing again: give up
    ]
    expected = [
        _tool("search", queries=[first.entity]),
        _tool("visit", url=_hit_url(first.entity), goal=f"{first.relation} of {first.entity}"),
        _tool("visit", url=_hit_url(first.entity), goal=f"{first.relation} of {first.entity}", page=2),
        _tool("search", queries=["Value One"]),
        _tool("search", queries=['"Value One"']),
        NOT_FOUND,
    ]
    for step, want in zip([None, *steps], expected, strict=True):
        if step is not None:
            chat = [*chat, _said(single.teacher_says(chat)), step]
        assert single.teacher_says(chat) == single.oracle_says(chat) == want, len(chat)
    # the second part without the row: nothing to read, the oracle's "missing" answer
    missing = [*chat[:6], _said(expected[2]), _page(first.entity, "goal", 2, 2, "Type | Person")]
    assert single.teacher_says(missing) == single.oracle_says(missing) == MISSING
    assert second.relation in LABELS  # the walk above stopped at the second hop's search on purpose


def test_single_agent_mistakes_in_the_full_profile(small_scenario, task):
    first = task.hops[0]
    read = _page(first.entity, "goal", 1, 1, f"{LABELS[first.relation]} | Value One")
    # report_without_visit where the search lists the entity only: the hop's value is the entity itself,
    # so the next hop's search is about it
    skip = Agent(small_scenario, task, "single", {"report_without_visit": 1.0})
    chat = [*_start(task), _said(_tool("search", queries=[first.entity])), _results(first.entity, [first.entity])]
    assert skip.teacher_says(chat) == _tool("search", queries=[first.entity])
    # answer_early at the start of the second hop guesses the value the first hop read, not the question's entity
    kind, p = "answer_early", 0.5
    chat = [*_start(task), _said(_tool("search", queries=[first.entity])), _results(first.entity, [first.entity]),
            _said(_tool("visit", url=_hit_url(first.entity), goal=f"{first.relation} of {first.entity}")), read]
    seed = _seed(task.id, "single_0", kind, p, {2: False, len(chat): True})
    early = Agent(small_scenario, task, "single", {kind: p}, seed=seed)
    assert early.teacher_says(chat[:2]) == early.oracle_says(chat[:2])  # not drawn at the first hop
    assert early.teacher_says(chat) == f"<think>{GUESS_THINK[kind]}</think><answer>Value One</answer>"
    # visit_wrong_hit drawn when the search came back (chat length 4), not when later parts are asked for: the
    # wrong page's second part follows the wrong page, though a draw at the later length would say no mistake
    kind = "visit_wrong_hit"
    seed = _seed(task.id, "single_0", kind, p, {4: True, 6: False})
    wrong = Agent(small_scenario, task, "single", {kind: p}, seed=seed)
    chat = [*_start(task), _said(_tool("search", queries=[first.entity])), _results(first.entity, ["Other Hit", first.entity])]
    goal = f"{first.relation} of {first.entity}"
    assert wrong.teacher_says(chat) == _tool("visit", url=_hit_url("Other Hit"), goal=goal)
    chat = [*chat, _said(_tool("visit", url=_hit_url("Other Hit"), goal=goal)), _page("Other Hit", goal, 1, 2, "Type | Person")]
    assert wrong.teacher_says(chat) == _tool("visit", url=_hit_url("Other Hit"), goal=goal, page=2)


def _sub_chat(hop, context: str | None, titles: list[str]) -> list[dict]:
    first = f"Subtask: {hop.question}" + (f"\nContext: {context}" if context else "")
    return [{"role": "system", "content": "You are a sub-agent."}, {"role": "user", "content": first},
            _said(_tool("search", queries=[hop.entity])), _results(hop.entity, titles)]


@pytest.mark.parametrize("context", [None, "the main agent's note"])
def test_sub_agent_mistakes_in_the_full_profile_with_or_without_a_context(small_scenario, task, context):
    hop = task.hops[0]
    goal = f"{hop.relation} of {hop.entity}"
    wrong = Agent(small_scenario, task, "sub", {"visit_wrong_hit": 1.0})
    chat = _sub_chat(hop, context, [hop.entity, "Other Hit", "Third Hit"])
    assert wrong.oracle_says(chat) == _tool("visit", url=_hit_url(hop.entity), goal=goal)
    assert wrong.teacher_says(chat) == _tool("visit", url=_hit_url("Other Hit"), goal=goal)  # the first other hit's own URL
    report = Agent(small_scenario, task, "sub", {"report_without_visit": 1.0})
    alone = _sub_chat(hop, context, [hop.entity])  # no other hit listed: the entity itself is reported
    assert report.teacher_says(alone) == f"<think>{GUESS_THINK['report_without_visit']}</think><result>{hop.entity}</result>"


def test_main_guesses_the_last_report_and_combines_once_every_hop_is_reported(small_scenario, task):
    kind, p = "answer_early", 0.5
    oracle = Agent(small_scenario, task, "main", {})
    chat = _start(task)
    delegate_first = oracle.oracle_says(chat)
    after_one = [*chat, _said(delegate_first), {"role": "user", "content": "<tool_response>\nReport One\n</tool_response>"}]
    delegate_second = oracle.oracle_says(after_one)
    after_two = [*after_one, _said(delegate_second), {"role": "user", "content": "<tool_response>\nReport Two\n</tool_response>"}]
    assert "Report One" in delegate_second  # the second hop is about the first report
    # drawn after the first report: the guess is that report, not the entity the question names
    main = Agent(small_scenario, task, "main", {kind: p}, seed=_seed(task.id, "main_0", kind, p, {2: False, 4: True}))
    assert main.teacher_says(chat) == delegate_first
    assert main.teacher_says(after_one) == f"<think>{GUESS_THINK[kind]}</think><answer>Report One</answer>"
    # every hop reported: no decision of the kind is left, whatever the draw at that length says
    seed = _seed(task.id, "main_0", kind, p, {2: False, 4: False, 6: True})
    main = Agent(small_scenario, task, "main", {kind: p}, seed=seed)
    assert main.teacher_says(after_one) == delegate_second
    assert main.teacher_says(after_two) == oracle.oracle_says(after_two) == "<think>combine the reports</think><answer>Report Two</answer>"
