"""The reward options a config sets reach TRAINING, by value: one real iteration of M-GRPO on the oracle
clone with weights and options that are not the paper's, then the env's pay (episodes.jsonl), the main
learner's R_M (its metrics) and the sub learner's own R_S (the slots it scored, ``advantages/<t>.json``)
are recomputed from the config alone. A wiring slip (the paper's weights, the gate or the subtask
reference dropped on the way to the envs or to the sub worker) shows as a wrong number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgrpo_algo.core.config import load_config
from mgrpo_env.core import expert_scorer
from mgrpo_env.rewards import main_reward, paid_sub_reward

START = Path(__file__).resolve().parents[1] / "configs" / "oracle-warm-start"
MAIN_WEIGHTS = (0.3, 0.7)  # not the paper's (0.1, 0.9)
SUB_WEIGHTS = (0.2, 0.3, 0.5)  # not the paper's (0.1, 0.4, 0.5)


@pytest.fixture(scope="module")
def trained(small_scenario, tmp_path_factory):
    """One iteration (B = 3, K = 2) with every reward option set; what collect was given, the run folder."""
    from mgrpo_algo.training import trainer as trainer_module

    out = tmp_path_factory.mktemp("reward-wiring") / "run"
    cfg = load_config(None, [
        f"out_dir={out}", f"main.model={START / 'main'}", f"sub.model={START / 'sub'}",
        f"scenario_kwargs={{num_entities: 300, seed: 0, profile: tiny, data_dir: {small_scenario.data_dir}}}",
        "questions_per_iteration=2", "group_size=2", "stages=[{split: stage2/train, iterations: 1}]",
        "limits={max_main_turns: 4, max_sub_turns: 4, max_delegations: 2}", "checkpoint=false",
        f"main_weights={list(MAIN_WEIGHTS)}", f"sub_weights={list(SUB_WEIGHTS)}",
        "sub_format_gate=true", "expert_reference=subtask", "sub.generation.temperature=1.4",
    ])
    given: list[dict] = []
    real = trainer_module.collect

    def spy(*args, **kwargs):
        given.append(kwargs["env_kwargs"])
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer_module, "collect", spy)
        with trainer_module.Trainer(cfg) as trainer:
            history = trainer.run()
            scoring = trainer.roles._sub_scoring(2, "sub")
            rewards = trainer.reward_config
    return {"cfg": cfg, "out": out, "given": given, "history": history, "scoring": scoring, "rewards": rewards}


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


def test_the_training_envs_get_the_configs_rewards(trained):
    rewards = trained["rewards"]
    assert (rewards.main_weights, rewards.sub_weights, rewards.sub_format_gate) == (MAIN_WEIGHTS, SUB_WEIGHTS, True)
    assert rewards.expert.source == "subtask"
    assert len(trained["given"]) == 1 and trained["given"][0]["rewards"] is rewards
    assert trained["given"][0]["limits"] == trained["cfg"].limits
    scoring = trained["scoring"]  # what the sub worker is told to pay
    assert (scoring.sub_weights, scoring.sub_format_gate, scoring.estimator) == (SUB_WEIGHTS, True, "grpo_pooled_masked")


def test_the_env_pays_r_m_and_r_s_with_the_configs_weights_gate_and_reference(trained, small_scenario):
    from mgrpo_scenarios.wiki_hops import WikiHops

    scenario = WikiHops(seed=0, num_entities=300, profile="tiny", data_dir=small_scenario.data_dir)
    tasks = {t.id: t for split in ("stage2/train",) for t in scenario.tasks(split)}
    by_subtask = expert_scorer(reference="subtask", scenario=scenario)
    records = _records(trained["out"])
    subs = [(r, s) for r in records for s in r["subs"]]
    assert len(records) == 4 and subs  # the oracle clone delegates
    for r in records:
        assert r["rewards"]["main_0"] == pytest.approx(main_reward(r["main"]["format_ok"], r["correct"], MAIN_WEIGHTS))
    for r, s in subs:
        if s["final"] is not None:
            assert s["expert"] == by_subtask(tasks[r["task"]["id"]], s["task"], s["final"])
        assert s["reward"] == pytest.approx(paid_sub_reward(s["format_ok"], r["correct"], s["expert"], SUB_WEIGHTS,
                                                            format_gate=True))
    # the main learner's R_M is the env's: its reward mean over the batch
    assert trained["history"][0]["main/reward_mean"] == pytest.approx(
        sum(r["rewards"]["main_0"] for r in records) / len(records))


def test_the_sub_learner_scores_its_own_r_s_with_the_configs_weights_and_gate(trained):
    records = _records(trained["out"])
    paid = {(i, s["agent"]): paid_sub_reward(s["format_ok"], r["correct"], s["expert"], SUB_WEIGHTS, format_gate=True)
            for i, r in enumerate(records) for s in r["subs"]}
    slots = json.loads((trained["out"] / "workers" / "sub" / "advantages" / "0.json").read_text())
    assert slots and {(s["index"], s["agent"]) for s in slots} == set(paid)
    for s in slots:
        assert s["reward"] == pytest.approx(paid[(s["index"], s["agent"])])
    # somewhere the options change the pay: a well-formed report the gate pays less than the paper would
    assert any(s["format_ok"] and s["expert"] is not None and s["expert"] < 1 for r in records for s in r["subs"])


def test_reward_config_env_options_and_sub_scoring_by_value(small_scenario):
    """The three functions that carry the options, without a run: what each returns for a config that
    sets every option, and for the paper's defaults (a mutant that reads another field shows here fast)."""
    from types import SimpleNamespace

    from mgrpo_algo.core.scoring import TurnCredit, turn_credit
    from mgrpo_algo.training.trainer import env_options, reward_config
    from mgrpo_algo.training.workers import RoleWorkers

    cfg = load_config(None, [f"main_weights={list(MAIN_WEIGHTS)}", f"sub_weights={list(SUB_WEIGHTS)}", "sub_format_gate=true",
                             "expert_reference=subtask", "group_size=3", "align_strategy=mask", "step_advantage_weight=0.5",
                             "sub_estimator=grpo", "tools={sub: [search, visit]}", "limits.max_delegations=2",
                             "turn_format_penalty=0.25", "success_likelihood=0.75"])
    judge = SimpleNamespace(score_subtask=lambda subtask, gold, report: 0.25)
    rewards = reward_config(cfg, small_scenario, judge)
    assert (rewards.main_weights, rewards.sub_weights, rewards.sub_format_gate) == (MAIN_WEIGHTS, SUB_WEIGHTS, True)
    assert rewards.expert.source == "subtask+judge"
    task = next(iter(small_scenario.tasks("stage2/train")))
    assert rewards.expert(task, task.hops[0].question, task.hops[0].answer) == 1.0  # the gold answer, not the judge
    assert env_options(cfg, rewards) == {"limits": cfg.limits, "rewards": rewards, "tools": {"sub": ["search", "visit"]}}
    scoring = RoleWorkers._sub_scoring(SimpleNamespace(config=cfg), 4, "sub")
    assert (scoring.k, scoring.d, scoring.strategy, scoring.step_weight, scoring.sub_weights, scoring.estimator,
            scoring.sub_format_gate) == (3, 4, "mask", 0.5, SUB_WEIGHTS, "grpo", True)
    assert scoring.credit == turn_credit(cfg) == TurnCredit(0.25, 0.75) and scoring.role == "sub"
    assert RoleWorkers._sub_scoring(SimpleNamespace(config=cfg), 4, "reader").role == "reader"  # the called role's own
    from mgrpo_env.rewards import REWARD_TERMS

    REWARD_TERMS.register("per_turn", lambda inputs: inputs["turns"])
    try:  # a role's extra terms reach its side's scoring and the env's pay, each under its own role
        termed = load_config(None, ["reward_terms={sub: {per_turn: 0.5}, main: {per_turn: 0.25}}"])
        assert RoleWorkers._sub_scoring(SimpleNamespace(config=termed), 1, "sub").terms == (("per_turn", 0.5),)
        assert RoleWorkers._sub_scoring(SimpleNamespace(config=cfg), 1, "sub").terms == ()
        assert reward_config(termed, small_scenario).terms == {"sub": (("per_turn", 0.5),), "main": (("per_turn", 0.25),)}
    finally:
        REWARD_TERMS.unregister("per_turn")
    paper = load_config(None, [])
    rewards = reward_config(paper, small_scenario)
    assert (rewards.main_weights, rewards.sub_weights, rewards.sub_format_gate, rewards.expert.source) == (
        (0.1, 0.9), (0.1, 0.4, 0.5), False, "hops")
    assert env_options(paper, rewards) == {"limits": paper.limits, "rewards": rewards}  # no tools: the scenario's
    assert RoleWorkers._sub_scoring(SimpleNamespace(config=paper), 1, "sub").sub_format_gate is False


def test_a_called_roles_worker_hands_score_sub_side_its_whole_scoring(monkeypatch):
    """``RoleWorker._score_sub`` passes every field of its :class:`CalledScoring` on: the turn credit, the
    outcome grouping and the called role (its metrics' prefix). Dropping one changes nothing else a
    run shows at the defaults, so the test scores a registered role with non-default ones."""
    from dataclasses import replace
    from types import SimpleNamespace

    from mgrpo_algo.core import scoring as scoring_module
    from mgrpo_algo.core.scoring import CalledFact, CalledScoring, TurnCredit
    from mgrpo_algo.training.roles import RoleWorker
    from mgrpo_env.roles import ROLE_TABLE, register_role, unregister_role

    handed: dict = {}
    real = scoring_module.score_sub_side

    def spy(*args, **kwargs):
        handed.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(scoring_module, "score_sub_side", spy)
    written: dict = {}
    worker = RoleWorker.__new__(RoleWorker)  # a real instance (mutmut's trampolines read attributes off it)
    worker.seed, worker.files = 0, SimpleNamespace(write_json=written.__setitem__)
    credit = TurnCredit(format_penalty=2.0, success_likelihood=0.3)
    scoring = CalledScoring(2, 1, "duplicate", 0.0, (0.0, 1.0, 0.0), credit=credit, outcome_groups="subtask",
                         role="checker")
    facts = [[CalledFact(f"checker_{i}", i != 1, 1.0 if i % 2 == 0 else 0.0, turns=2,
                      penalised_turns=(1,) if i == 1 else ())] for i in range(4)]
    register_role("checker", replace(ROLE_TABLE["sub"]))
    try:
        slots, metrics = RoleWorker._score_sub(worker, 0, facts, scoring, [1.0, 1.0, 0.0, 1.0])
    finally:
        unregister_role("checker")
    assert handed["credit"] == credit and handed["outcome_groups"] == "subtask" and handed["role"] == "checker"
    assert metrics and all(key.startswith("checker/") for key in metrics), metrics
    assert len(written["advantages/0.json"]) == len(slots) == 4
    # the role's extra terms: each well-formed agent's R_S (b2 x main_correct here) plus 0.25 x its 2 turns,
    # read from the inputs its fact carries
    from mgrpo_env.rewards import REWARD_TERMS

    REWARD_TERMS.register("per_turn", lambda inputs: inputs["turns"])
    register_role("checker", replace(ROLE_TABLE["sub"]))
    try:
        termed = [[replace(row[0], inputs={"turns": 2})] for row in facts]
        RoleWorker._score_sub(worker, 1, termed, replace(scoring, terms=(("per_turn", 0.25),)), [1.0, 1.0, 0.0, 1.0])
    finally:
        unregister_role("checker")
        REWARD_TERMS.unregister("per_turn")
    assert sorted(row["reward"] for row in written["advantages/1.json"]) == [0.0, 0.5, 1.5, 1.5]


def _misdelegation_the_hop_pays_nothing_for(scenario, split: str):
    """A chain task, its second hop asked about another entity of the same type, and that entity's
    right answer, which shares no token with any hop's answer (the hop score pays it exactly 0)."""
    from mgrpo_env.core import hop_expert_score

    graph = scenario.graph()
    by_name = {e.name: e for e in graph.entities}
    for task in scenario.tasks(split):
        if task.kind != "chain":
            continue
        hop = task.hops[1]
        for other in graph.entities:
            if other.type != by_name[hop.entity].type or other.name == hop.entity or other.name in hop.question:
                continue
            answer, subtask = graph.answer(other, hop.relation), hop.question.replace(hop.entity, other.name)
            if answer and hop_expert_score(task, subtask, answer) == 0.0 and scenario.subtask_answer(task, subtask) == answer:
                return task, subtask, answer
    raise AssertionError("no chain task with a same-type entity whose answer shares no token with the hops'")


@pytest.mark.parametrize("reference, paid, fell_back", [
    ("subtask", [(1.0, "subtask"), (1.0, "subtask>hops")], 0.5),
    ("hop", [(0.0, "hops"), (1.0, "hops")], None),
])
def test_the_trainer_as_built_pays_a_right_report_on_a_misdelegated_subtask(small_scenario, tmp_path, reference, paid,
                                                                           fell_back):
    """Through ``Trainer`` as it builds its rewards (its scenario, ``reward_config``, ``env_options``), not
    the scorer alone. Episode 1: the main agent delegates the second hop about the wrong entity, the
    sub-agent answers that subtask right; ``subtask`` pays it r_expert = 1, ``hop`` (the paper) 0.
    Episode 2: a subtask the scenario cannot answer, reported with the first hop's answer: the hop's
    score under both, and under ``subtask`` counted as a fallback (``sub/expert_fell_back``)."""
    import numpy as np

    import mgrpo_env
    from mgrpo_algo.core.scoring import score_sub_side, sub_facts
    from mgrpo_algo.training import trainer as trainer_module

    cfg = load_config(None, [
        f"out_dir={tmp_path / 'run'}", f"main.model={START / 'main'}", f"sub.model={START / 'sub'}",
        f"scenario_kwargs={{num_entities: 300, seed: 0, profile: tiny, data_dir: {small_scenario.data_dir}}}",
        "stages=[{split: stage2/train, iterations: 1}]", "checkpoint=false", f"expert_reference={reference}",
    ])
    records = []
    with trainer_module.Trainer(cfg) as trainer, trainer.scenario.open() as world:
        task, subtask, right = _misdelegation_the_hop_pays_nothing_for(trainer.scenario, "stage2/train")
        assert trainer.scenario.subtask_answer(task, "Who painted the sky?") is None
        env = mgrpo_env.raw_env(scenario=trainer.scenario, split="stage2/train", world=world,
                                **trainer_module.env_options(cfg, trainer.reward_config))
        for asked, report in ((subtask, right), ("Who painted the sky?", task.hops[0].answer)):
            env.reset(options={"task_id": task.id})
            call = json.dumps({"name": "delegate", "arguments": {"task": asked}})
            for text in (f"<think>d</think><tool_call>{call}</tool_call>", f"<think>r</think><result>{report}</result>",
                         f"<think>a</think><answer>{task.answer}</answer>"):
                env.step(text)
            record = env.record
            assert record.correct and [(s.task, s.final) for s in record.subs] == [(asked, report)]
            records.append(record)
        env.close()
    got = [(r.components["sub_0"]["expert"], r.components["sub_0"]["expert_source"]) for r in records]
    assert got == paid
    assert [r.components["sub_0"]["reward"] for r in records] == pytest.approx([0.1 + 0.4 + 0.5 * e for e, _ in paid])
    _, metrics = score_sub_side(sub_facts(records), [[r.rewards["sub_0"]] for r in records], 2, 1,
                                strategy="duplicate", rng=np.random.default_rng(0))
    assert metrics.get("sub/expert_fell_back") == fell_back and metrics["sub/expert_disabled"] == 0.0
