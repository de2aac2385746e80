"""The imperfect teacher: the oracle at rate 0, each mistake kind as documented, its rates, seeds and the
single agent's replayed mistakes; at rates strictly between 0 and 1, for every role, each decision of the
demonstrations against the documented draw (a hash of seed, task, episode, agent, chat length and kind,
recomputed here independently; a hop the single agent skipped is never visited later) and the per-role and
per-question-kind overrides; and the mistake rates of episode records, computed by hand."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from mgrpo_env.core import Limits
from mgrpo_env.mistakes import counts_by_question, mistake_rates, record_counts
from mgrpo_env.rollout import collect
from mgrpo_env.scripted import OraclePolicy
from mgrpo_env.teacher import GUESS_THINK, MistakeRate, search_hits, teacher_policies

LIMITS = Limits(max_main_turns=5, max_sub_turns=3, max_delegations=3)
SINGLE = {"limits": LIMITS, "max_turns": 24}


def _run(scenario, world, tasks, policies, *, single=False, seed=0):
    return collect(scenario, tasks, 1, policies, world=world, seed=seed, env="single" if single else "hierarchy",
                   env_kwargs=SINGLE if single else {"limits": LIMITS})


def _actions(records):
    return [[m["content"] for m in r.main.messages] + [m["content"] for s in r.subs for m in s.messages] for r in records]


def test_every_rate_zero_is_the_oracle(tiny, tiny_world):
    tasks = list(tiny.tasks("stage2/train"))[:24]
    oracle = {r: OraclePolicy(tiny, r) for r in ("main", "sub")}
    teacher = teacher_policies(tiny, ("main", "sub"), {"answer_early": 0.0, "report_without_visit": 0.0}, seed=3)
    assert _actions(_run(tiny, tiny_world, tasks, teacher)) == _actions(_run(tiny, tiny_world, tasks, oracle))
    single_teacher = teacher_policies(tiny, ("single",), {"visit_wrong_hit": MistakeRate(0.0)}, seed=3)
    single_oracle = {"single": OraclePolicy(tiny, "single")}
    assert (_actions(_run(tiny, tiny_world, tasks[:12], single_teacher, single=True))
            == _actions(_run(tiny, tiny_world, tasks[:12], single_oracle, single=True)))


def test_answer_early_guesses_the_named_entity_and_spares_comparisons(tiny, tiny_world):
    tasks = list(tiny.tasks("stage2/train"))[:40]
    rates = {"answer_early": MistakeRate(1.0, question_kinds={"comparison": 0.0})}
    records = _run(tiny, tiny_world, tasks, teacher_policies(tiny, ("main", "sub"), rates, seed=0))
    for r in records:
        first = r.main.turns[0]
        if r.task["kind"] == "comparison":
            assert first.tool_call is not None and first.tool_call.tool == "delegate"
        else:  # no report yet: the guess is the entity the question names (its first hop's)
            assert first.kind == "answer" and r.main.final == r.task["hops"][0]["entity"] and not r.subs
    assert {r.task["kind"] for r in records} >= {"comparison", "chain"}


def test_report_without_visit_reports_another_hit(tiny, tiny_world):
    tasks = list(tiny.tasks("stage2/train"))[:16]
    records = _run(tiny, tiny_world, tasks, teacher_policies(tiny, ("main", "sub"), {"report_without_visit": 1.0}, seed=0))
    subs = [s for r in records for s in r.subs]
    assert subs and all(s.final is not None for s in subs)
    for s in subs:
        tools = [t.tool_call.tool for t in s.turns if t.tool_call]
        assert tools == ["search"]  # searched once, reported at once
        hits = [line.split("] ", 1)[1] for line in s.turns[0].observation.splitlines() if line.startswith("[")]
        entity = s.turns[0].tool_call.arguments["queries"][0]
        others = [h for h in hits if h != entity]
        assert s.final == (others[0] if others else entity)
    assert mistake_rates(records)["report_without_visit"] == 1.0


def test_visit_wrong_hit_visits_another_page(tiny, tiny_world):
    tasks = list(tiny.tasks("stage1/train"))[:16]
    records = _run(tiny, tiny_world, tasks, teacher_policies(tiny, ("main", "sub"), {"visit_wrong_hit": 1.0}, seed=0))
    visits = 0
    for s in (s for r in records for s in r.subs):
        calls = [t.tool_call for t in s.turns if t.tool_call]
        entity = calls[0].arguments["queries"][0]
        hits = [line.split("] ", 1)[1] for line in s.turns[0].observation.splitlines() if line.startswith("[")]
        if [h for h in hits if h != entity] and len(calls) > 1:
            assert calls[1].tool == "visit" and not calls[1].arguments["url"].endswith(f"/wiki/{entity}")
            visits += 1
    assert visits >= 8
    assert sum(r.correct for r in records) < sum(r.correct for r in _run(
        tiny, tiny_world, tasks, {k: OraclePolicy(tiny, k) for k in ("main", "sub")}))


def test_rates_are_met_and_draws_follow_the_seed(tiny, tiny_world):
    tasks = list(tiny.tasks("stage2/train"))[:150]
    rates = {"answer_early": 0.3, "report_without_visit": 0.3}
    records = _run(tiny, tiny_world, tasks, teacher_policies(tiny, ("main", "sub"), rates, seed=0))
    seen = mistake_rates(records, LIMITS.max_delegations)
    # ~300 decisions of each kind: the binomial standard error is ~0.027
    assert 0.22 <= seen["answer_early"] <= 0.38 and 0.22 <= seen["report_without_visit"] <= 0.38
    again = _run(tiny, tiny_world, tasks, teacher_policies(tiny, ("main", "sub"), rates, seed=0))
    other = _run(tiny, tiny_world, tasks, teacher_policies(tiny, ("main", "sub"), rates, seed=1))
    assert _actions(again) == _actions(records) and _actions(other) != _actions(records)


def test_single_agent_replays_its_own_mistakes(tiny, tiny_world):
    """The single agent's teacher recomputes its earlier skips from its chat: with every hop taken from
    a search hit, it never visits, and it moves on to the next hop (a search for the guessed name)."""
    tasks = [t for t in tiny.tasks("stage2/train") if t.kind == "chain"][:12]
    records = _run(tiny, tiny_world, tasks, teacher_policies(tiny, ("single",), {"report_without_visit": 1.0}, seed=0),
                   single=True)
    for r in records:
        tools = [t.tool_call.tool for t in r.main.turns if t.tool_call]
        assert "visit" not in tools and r.main.final is not None
        calls = [t for t in r.main.turns if t.tool_call]
        assert len(calls) == len(r.task["hops"])  # one search per hop, no visit
        for turn, after in zip(calls, [*calls[1:], None], strict=True):
            query = turn.tool_call.arguments["queries"][0]
            hits = [line.split("] ", 1)[1] for line in turn.observation.splitlines() if line.startswith("[")]
            guess = next((h for h in hits if h != query), query)  # the next hop is about the guessed name
            assert (after.tool_call.arguments["queries"][0] if after else r.main.final) == guess or after is None
    rates = mistake_rates(records)
    assert rates["report_without_visit"] == 1.0 and rates["answer_early"] is None
    early = teacher_policies(tiny, ("single",), {"answer_early": 1.0}, seed=0)
    first = _run(tiny, tiny_world, tasks[:4], early, single=True)
    assert all(r.main.turns[0].kind == "answer" and r.main.final == r.task["hops"][0]["entity"] for r in first)


def test_unknown_kind_and_bad_rate_are_refused(tiny):
    from mgrpo_env.teacher import ImperfectTeacher

    # the one line lists every kind there is
    with pytest.raises(ValueError, match="^unknown mistake kind 'guess'; known: answer_early, report_without_visit, visit_wrong_hit$"):
        ImperfectTeacher(tiny, "main", {"guess": 0.1})
    with pytest.raises(ValueError, match="must be in"):
        MistakeRate(1.5)
    assert MistakeRate(0.3, roles={"single": 0.1}, question_kinds={"comparison": 0.0}).for_("single", "chain") == 0.1
    assert MistakeRate(0.3, roles={"single": 0.1}, question_kinds={"comparison": 0.0}).for_("single", "comparison") == 0.0


# -- mistake rates of records, by hand ---------------------------------------------------------

def _turn(kind, tool=None, **arguments):
    return {"kind": kind, "tool_call": {"tool": tool, "arguments": arguments} if tool else None}


def _hierarchy(qid, hops, main_turns, subs):
    return {"task": {"id": qid, "hops": [{}] * hops}, "main": {"role": "main", "turns": main_turns},
            "subs": [{"final": final, "turns": [_turn("tool_call", t) for t in tools]} for final, tools in subs]}


def test_mistake_rates_by_hand():
    d, a = _turn("tool_call", "delegate"), _turn("answer")
    records = [
        # 3 hops: delegate, answer with 2 left -> decisions 2, early 1; one sub reported after a visit
        _hierarchy("q1", 3, [d, a], [("x", ["search", "visit"])]),
        # 2 hops: delegate twice, answer (no hops left): decisions 2, early 0; one report without a visit,
        # one sub without a result (not a report)
        _hierarchy("q2", 2, [d, d, a], [("y", ["search"]), (None, ["search"])]),
        # 4 hops capped at 3 delegations: answers at once -> decisions 1, early 1
        _hierarchy("q1", 4, [a], []),
        # 1 hop, delegated twice: the second delegation is no decision with hops left -> decisions 1
        _hierarchy("q3", 1, [d, d, a], []),
    ]
    rates = mistake_rates(records, max_delegations=3)
    assert rates["answer_early"] == pytest.approx(2 / 6)
    assert rates["answer_early_episodes"] == pytest.approx(2 / 4)
    assert rates["report_without_visit"] == pytest.approx(1 / 2)
    assert rates["delegations"] == pytest.approx(5 / 4)
    decisions = ("answer_early", "answer_early_episodes", "report_without_visit", "delegations")
    assert {q: {k: c[k] for k in decisions} for q, c in counts_by_question(records).items()} == {  # endings: test_endings.py
        "q1": {"answer_early": [2, 3], "answer_early_episodes": [2, 2], "report_without_visit": [0, 1], "delegations": [1, 2]},
        "q2": {"answer_early": [0, 2], "answer_early_episodes": [0, 1], "report_without_visit": [1, 1], "delegations": [2, 1]},
        "q3": {"answer_early": [0, 1], "answer_early_episodes": [0, 1], "report_without_visit": [0, 0], "delegations": [2, 1]},
    }
    single = {"task": {"id": "s", "hops": [{}, {}, {}]}, "main": {"role": "single", "turns": [
        _turn("tool_call", "search", queries=["A"]), _turn("tool_call", "search", queries=['"A"']),
        _turn("tool_call", "visit", url="u"), _turn("tool_call", "search", queries=["B"]), _turn("answer")]}}
    # hops A (visited) and B (left for the answer without a visit); 2 of 3 hops worked on: early
    assert {k: v for k, v in record_counts(single).items() if k in decisions} == {
        "answer_early_episodes": (1, 1), "report_without_visit": (1, 2)}
    assert json.dumps(mistake_rates([single]))  # JSON-ready


# -- rates strictly between 0 and 1: every decision as drawn ----------------------------------------

SEED = 7
_CALL = re.compile(r"<tool_call>(.*)</tool_call>", re.S)


def drawn(task_id: str, episode: int, agent: str, at: int, kind: str, p: float) -> bool:
    """The teacher's draw of ``kind`` for the decision taken when the chat had ``at`` messages."""
    key = f"{SEED}|{task_id}|{episode}|{agent}|{at}|{kind}"
    return p > 0 and int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64 < p


def _call(content: str) -> tuple[str | None, dict]:
    found = _CALL.search(content)
    if not found:
        return None, {}
    call = json.loads(found.group(1))
    return call["name"], call["arguments"]


def _assistant(messages: list[dict]) -> list[tuple[int, str]]:
    return [(i, m["content"]) for i, m in enumerate(messages) if m["role"] == "assistant"]


def _collect(scenario, world, tasks, roles, rates, env="hierarchy"):
    policies = teacher_policies(scenario, roles, rates, seed=SEED)
    kwargs = {"limits": LIMITS, **({"max_turns": 24} if env == "single" else {})}
    return collect(scenario, tasks, 1, policies, world=world, seed=0, env=env, env_kwargs=kwargs)


def _body(messages: list[dict], i: int) -> str:
    """The tool response that followed assistant message ``i``, unwrapped."""
    text = messages[i + 1]["content"] if i + 1 < len(messages) else ""
    return re.sub(r"^\s*<tool_response>\n?|\n?</tool_response>\s*$", "", text)


def _check_main(record, episode: int, p_of) -> tuple[int, int]:
    """Each main decision with hops left: an early guess exactly where the draw said. (early, decisions)"""
    task = record.task
    hops = len(task["hops"])
    p = p_of("main", task["kind"])
    reports = early = decisions = 0
    for i, content in _assistant(record.main.messages):
        name, _ = _call(content)
        if reports < hops:
            decisions += 1
            guess = content.startswith(f"<think>{GUESS_THINK['answer_early']}</think><answer>")
            assert guess == drawn(task["id"], episode, record.main.agent, i, "answer_early", p), (task["id"], i, content)
            early += guess
        reports += name == "delegate"
    return early, decisions


def _check_sub(scenario, record, episode: int, sub, p_report: float, p_wrong: float) -> str | None:
    """The decision after a sub-agent's first search: report a hit unvisited, visit a wrong hit, or the
    oracle's visit, exactly as drawn. Returns which (None where the sub-agent did not search first)."""
    actions = _assistant(sub.messages)
    name, arguments = _call(actions[0][1])
    if name != "search" or len(actions) < 2:
        return None
    entity = arguments["queries"][0]
    others = [t for t in search_hits(_body(sub.messages, actions[0][0])) if t != entity]
    at, content = actions[1]
    assert at == 4
    if drawn(record.task["id"], episode, sub.agent, at, "report_without_visit", p_report):
        assert content == f"<think>{GUESS_THINK['report_without_visit']}</think><result>{others[0] if others else entity}</result>"
        return "report"
    name, arguments = _call(content)
    assert name == "visit", content
    if others and drawn(record.task["id"], episode, sub.agent, at, "visit_wrong_hit", p_wrong):
        assert arguments["url"] == scenario.page_url(others[0])
        return "wrong"
    assert arguments["url"] == scenario.page_url(entity)
    return "oracle"


def test_hierarchy_at_half_rates_replays_every_draw(tiny, tiny_world):
    tasks = list(tiny.tasks("stage2/train"))[:20]
    rates = {"answer_early": 0.5, "report_without_visit": 0.4, "visit_wrong_hit": 0.5}
    records = _collect(tiny, tiny_world, tasks, ("main", "sub"), rates)
    early = decisions = 0
    seen = {"report": 0, "wrong": 0, "oracle": 0}
    for episode, record in enumerate(records):
        e, d = _check_main(record, episode, lambda role, kind: 0.5)
        early, decisions = early + e, decisions + d
        for sub in record.subs:
            what = _check_sub(tiny, record, episode, sub, 0.4, 0.5)
            if what:
                seen[what] += 1
    # every branch taken, and neither rate collapsed to 0 or 1
    assert 0 < early < decisions and all(seen.values()), (early, decisions, seen)


def _single_decisions(scenario, record, episode: int, p: dict[str, float]) -> dict[str, int]:
    """The single agent's chat against the draws: the decision after a hop's first search (skip the hop,
    visit a wrong hit, or the oracle's page), every early answer drawn, and no skipped hop's page visited
    later. Returns how often each branch was taken."""
    task_id, agent, messages = record.task["id"], record.main.agent, record.main.messages
    actions = _assistant(messages)
    counts = {"skip": 0, "wrong": 0, "oracle": 0, "early": 0, "search": 0}
    skipped: set[str] = set()
    current = None  # the name of the hop being worked on
    for n, (i, content) in enumerate(actions):
        name, arguments = _call(content)
        if content.startswith(f"<think>{GUESS_THINK['answer_early']}</think><answer>"):
            assert drawn(task_id, episode, agent, i, "answer_early", p["answer_early"]), (task_id, i)
            counts["early"] += 1
            continue
        if name == "visit":
            assert not any(arguments["url"] == scenario.page_url(s) for s in skipped), (task_id, i, skipped)
            continue
        if name != "search":
            continue
        query = arguments["queries"][0]
        if query.strip('"') == current:
            continue  # the quoted retry of the same hop
        # a search for a new name: a decision between hops where no early answer was drawn
        assert not drawn(task_id, episode, agent, i, "answer_early", p["answer_early"]), (task_id, i)
        counts["search"] += 1
        current = query
        if n + 1 >= len(actions):
            continue
        after, following = actions[n + 1]
        others = [t for t in search_hits(_body(messages, i)) if t != query]
        next_name, next_arguments = _call(following)
        if drawn(task_id, episode, agent, after, "report_without_visit", p["report_without_visit"]):
            # the hop is taken from a search hit: the next step is the next hop (or the answer), never its page
            assert next_name != "visit" and not (next_name == "search" and next_arguments["queries"][0].strip('"') == query)
            skipped.add(query)
            counts["skip"] += 1
        elif next_name == "visit":
            wrong = bool(others) and drawn(task_id, episode, agent, after, "visit_wrong_hit", p["visit_wrong_hit"])
            assert next_arguments["url"] == scenario.page_url(others[0] if wrong else query), (task_id, after)
            counts["wrong" if wrong else "oracle"] += 1
        else:  # the entity is not among the hits: the oracle's quoted retry
            assert next_name == "search" and next_arguments["queries"][0] == f'"{query}"', following
    return counts


def test_single_agent_at_half_rates_replays_every_draw_coherently(tiny, tiny_world):
    tasks = [t for t in tiny.tasks("stage2/train") if t.kind == "chain"][:10]
    p = {"answer_early": 0.3, "report_without_visit": 0.5, "visit_wrong_hit": 0.5}
    records = _collect(tiny, tiny_world, tasks, ("single",), p, env="single")
    total = {"skip": 0, "wrong": 0, "oracle": 0, "early": 0, "search": 0}
    for episode, record in enumerate(records):
        for key, n in _single_decisions(tiny, record, episode, p).items():
            total[key] += n
        assert record.main.final is not None  # every chat ends in an answer: the walk never lost its hop
    assert all(total.values()), total


def test_role_overrides_apply_to_their_role_only(tiny, tiny_world):
    tasks = list(tiny.tasks("stage2/train"))[:16]
    # the sub-agents skip visits at 0.5 by their override; the single agent keeps the default 0
    rates = {"report_without_visit": MistakeRate(0.0, roles={"sub": 0.5})}
    records = _collect(tiny, tiny_world, tasks, ("main", "sub"), rates)
    whats = [_check_sub(tiny, r, e, s, 0.5, 0.0) for e, r in enumerate(records) for s in r.subs]
    assert "report" in whats and "oracle" in whats
    single = _collect(tiny, tiny_world, tasks[:4], ("single",), rates, env="single")
    for episode, record in enumerate(single):
        assert _single_decisions(tiny, record, episode, {"answer_early": 0.0, "report_without_visit": 0.0,
                                                          "visit_wrong_hit": 0.0})["skip"] == 0
    # the reverse: 0.5 by default, 0 for the single agent by its override
    rates = {"report_without_visit": MistakeRate(0.5, roles={"single": 0.0})}
    single = _collect(tiny, tiny_world, tasks[:4], ("single",), rates, env="single")
    for episode, record in enumerate(single):
        assert _single_decisions(tiny, record, episode, {"answer_early": 0.0, "report_without_visit": 0.0,
                                                          "visit_wrong_hit": 0.0})["skip"] == 0


def test_question_kind_overrides_win_over_the_roles(tiny, tiny_world):
    tasks = list(tiny.tasks("stage2/train"))[:20]
    rates = {"answer_early": MistakeRate(0.9, roles={"main": 0.5}, question_kinds={"comparison": 0.0})}
    records = _collect(tiny, tiny_world, tasks, ("main", "sub"), rates)
    kinds = {r.task["kind"] for r in records}
    assert {"comparison", "chain"} <= kinds
    per_kind = {}
    for episode, record in enumerate(records):
        early, decisions = _check_main(record, episode, lambda role, kind: 0.0 if kind == "comparison" else 0.5)
        got = per_kind.setdefault(record.task["kind"], [0, 0])
        got[0], got[1] = got[0] + early, got[1] + decisions
    assert per_kind["comparison"][0] == 0 and 0 < per_kind["chain"][0] < per_kind["chain"][1]
    rate = MistakeRate(0.9, roles={"main": 0.5}, question_kinds={"comparison": 0.0})
    assert (rate.for_("main", "chain"), rate.for_("sub", "chain"), rate.for_("main", "comparison")) == (0.5, 0.9, 0.0)


@pytest.mark.parametrize("bad", [-0.1, 1.01, float("nan")])
def test_rates_outside_0_1_are_refused_wherever_they_are_set(bad):
    # the one line names the rate that is wrong: the default, a role's or a question kind's
    for kwargs, name in (({"rate": bad}, "rate"), ({"roles": {"sub": bad}}, "sub"), ({"question_kinds": {"chain": bad}}, "chain")):
        with pytest.raises(ValueError, match=f"^mistake rate '{name}' must be in \\[0, 1\\], got {bad}$"):
            MistakeRate(**kwargs)
    assert MistakeRate(1.0, roles={"sub": 0.0}).for_("sub", "chain") == 0.0
