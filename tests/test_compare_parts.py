"""Parts of ``mgrpo compare`` by values, each at its boundary (fast; in the mutation run's selection):
a mode's start name, the policies a trained run is evaluated with when a role shares its owner's
model, the env options an evaluation runs under, and the delegation limit its mistake counts use.
The whole orchestration is tests/test_compare_wiring.py; a real run is tests/test_compare.py."""

from __future__ import annotations

import types

import pytest
from test_reward_variants import _same_type_misdelegation

from mgrpo_algo.core.config import load_config
from mgrpo_algo.core.modes import MODES, ModeSpec
from mgrpo_algo.core.seeding import eval_seed
from mgrpo_algo.experiments import compare, units
from mgrpo_env.episode import AgentTrajectory, EpisodeRecord, ToolCall, Turn

SHARED = "shared-parts-test"


@pytest.fixture()
def shared_mode():
    """A shared-model mode with its own start, registered for one test."""
    MODES.register(SHARED, ModeSpec(("main", "sub"), ("main", "sub"), shares=(("sub", "main"),),
                                    start=(("main", "/starts/shared/main"),)))
    try:
        yield SHARED
    finally:
        MODES.unregister(SHARED)


def test_a_modes_start_name_says_its_env_shares_and_own_start(shared_mode):
    assert compare._start_name("mgrpo") == compare._start_name("frozen-sub") == "hierarchy"
    assert compare._start_name("single-agent") == "single"
    assert compare._start_name(shared_mode) == "hierarchy+sub=main@main=/starts/shared/main"
    MODES.register("shares-only-test", ModeSpec(("main", "sub"), ("main", "sub"), shares=(("sub", "main"),)))
    MODES.register("two-starts-test", ModeSpec(("main", "sub"), ("main",), start=(("main", "/a"), ("sub", "/b"))))
    try:
        assert compare._start_name("shares-only-test") == "hierarchy+sub=main"
        assert compare._start_name("two-starts-test") == "hierarchy@main=/a@sub=/b"
    finally:
        MODES.unregister("shares-only-test")
        MODES.unregister("two-starts-test")


class _Handle:
    """A role worker's handle: records the calls compare makes through it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def call(self, name, *args):
        self.calls.append((name, *args))


def test_a_shared_role_is_evaluated_through_its_owners_policy(shared_mode):
    cfg = load_config(None, [f"mode={shared_mode}", "eval.temperature=0.7", "eval.max_new_tokens=33"])
    owner = _Handle()
    trainer = types.SimpleNamespace(handles={"main": owner})  # one worker: the sub role has none of its own
    policies = compare._trained_policies(cfg, trainer, seed=5)
    assert set(policies) == {"main", "sub"} and policies["sub"] is policies["main"]
    assert policies["main"].worker.handle is owner and policies["main"].iteration is None  # an evaluation policy
    assert owner.calls == [("begin_eval", eval_seed(5, "main"), 0.7, 33)]


def test_an_evaluation_runs_under_the_configs_rewards_for_its_scenario(small_scenario, monkeypatch):
    """The rewards' expert score is built for the evaluated scenario: with ``expert_reference: subtask`` a
    report that answers a mis-delegated subtask right scores 1 (the scenario answers the subtask)."""
    import mgrpo_algo.experiments.evaluate as evaluate

    seen = {}

    def fake_evaluate_agents(scenario, split, policies, **kwargs):
        seen.update(kwargs, scenario=scenario, split=split, policies=policies)
        return "report", ["records"]

    monkeypatch.setattr(evaluate, "evaluate_agents", fake_evaluate_agents)
    cfg = load_config(None, ["expert_reference=subtask", "limits.max_delegations=2", "eval.samples=3",
                             "tools={main: [delegate]}", "max_workers=6"])
    policies = {"main": object(), "sub": object()}
    out = compare.evaluate_policies(cfg, small_scenario, policies, limit=7, seed=9, progress=False, name="x")
    assert out == ("report", ["records"])
    assert seen["scenario"] is small_scenario and seen["split"] == cfg.eval.split and seen["env"] == "hierarchy"
    assert (seen["k"], seen["limit"], seen["seed"], seen["max_workers"], seen["agent_name"]) == (3, 7, 9, 6, "x")
    options = seen["env_kwargs"]
    assert options["limits"] is cfg.limits and options["tools"] == {"main": ["delegate"]}
    task, subtask, right = _same_type_misdelegation(small_scenario)
    assert options["rewards"].expert(task, subtask, right) == 1.0


def _record(hops: int, delegations: int) -> EpisodeRecord:
    """A hierarchy episode: ``delegations`` delegations, then the answer."""
    turns = [Turn("", "tool_call", tool_call=ToolCall("delegate", {"task": f"t{i}"}, ok=True)) for i in range(delegations)]
    main = AgentTrajectory("main_0", "main", turns=[*turns, Turn("", "answer")])
    return EpisodeRecord(episode_id="e", task={"id": "q0", "hops": [{}] * hops}, seed=0, correct=True, main=main)


def test_mistakes_are_counted_under_the_configs_delegation_limit(monkeypatch):
    """Two delegations on a four-hop question: early under 3 delegations allowed, not under 2."""
    report = types.SimpleNamespace(exact_match=1.0, f1=1.0, num_tasks=1)
    monkeypatch.setattr(units, "evaluate_policies", lambda *a, **k: (report, [_record(hops=4, delegations=2)]))
    counts = {}
    for limit in (2, 3):
        cfg = load_config(None, [f"limits.max_delegations={limit}", "eval.temperature=0"])
        figures, _, _ = compare._full_evaluation(cfg, None, lambda c: {}, seed=0, progress=False, name="x")
        counts[limit] = figures["mistake_counts"]["q0"]["answer_early"]
        assert figures["greedy_em"] == figures["em"] == 1.0  # a greedy evaluation is its own greedy pass
    assert counts == {2: [0, 2], 3: [1, 3]}
