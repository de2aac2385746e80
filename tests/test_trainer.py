"""The trainer: scoring by hand on fixed records, and 2-iteration runs of each mode on tiny models."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scoring_reference import score_batch

from mgrpo_algo.core.config import load_config
from mgrpo_algo.core.scoring import annotate_main, annotate_sub
from mgrpo_algo.core.sequences import slot_sequence
from mgrpo_algo.training.trainer import Trainer
from mgrpo_env.episode import AgentTrajectory, EpisodeRecord, Turn


def _traj(agent: str, role: str, reward: float, ids: list[int]) -> AgentTrajectory:
    turn = Turn(action="x", kind="answer", extra={"prompt_ids": [1, 2], "completion_ids": ids, "logprobs": [-1.0] * len(ids)})
    return AgentTrajectory(agent=agent, role=role, turns=[turn], reward=reward, format_ok=True)


def _record(main_reward: float, sub_rewards: list[float], correct: bool) -> EpisodeRecord:
    subs = [_traj(f"sub_{i}", "sub", r, [10 + i]) for i, r in enumerate(sub_rewards)]
    rewards = {"main_0": main_reward, **{s.agent: s.reward for s in subs}}
    return EpisodeRecord("e", {"id": "t"}, main=_traj("main_0", "main", main_reward, [7]), subs=subs, correct=correct, rewards=rewards)


def _sequences(records, batch):
    """The training sequences of a scored batch, built as a role worker builds them (slot_sequence)."""
    main = [slot_sequence([t.extra for t in records[m.key.index].main.turns], m.advantage, "main") for m in batch.main]
    sub = [slot_sequence([t.extra for t in records[s.key.index].subs[s.sub].turns], s.advantage, "sub") for s in batch.sub]
    return main, sub


def test_score_batch_by_hand():
    # one query, K = 2 rollouts: rollout 0 has one sub (reward 1.0), rollout 1 has none
    records = [_record(1.0, [1.0], True), _record(0.0, [], False)]
    batch = score_batch(records, k=2, d=2, strategy="duplicate", rng=np.random.default_rng(0))
    annotate_main(records, batch.main)  # the loop's A_M; the sub side's A_S as the viewer joins them
    annotate_sub(records, [(s.key.index, s.agent, s.advantage) for s in batch.sub])
    # A_M: rewards [1, 0], mean 0.5, population std 0.5 -> [+1, -1]
    assert [s.advantage for s in batch.main] == [pytest.approx(1.0), pytest.approx(-1.0)]
    assert [(s.key.query, s.key.rollout, s.key.index) for s in batch.main] == [(0, 0, 0), (0, 1, 1)]
    # alignment: rollout 0's single sub is duplicated into 2 slots, rollout 1 has 2 masked slots;
    # pooled sub rewards [1, 1] have zero std -> advantage 0 for both copies
    assert [(s.key.index, s.slot, s.sub, s.agent) for s in batch.sub] == [(0, 0, 0, "sub_0"), (0, 1, 0, "sub_0")]
    assert all(s.advantage == 0.0 for s in batch.sub)
    main, sub = _sequences(records, batch)
    assert [m.advantage for m in main] == [pytest.approx(1.0), pytest.approx(-1.0)]
    assert sub[0].input_ids == sub[1].input_ids == [1, 2, 10]
    metrics = batch.metrics
    assert metrics["align/num_masked_slots"] == 2 and metrics["align/num_duplicated_slots"] == 1
    assert metrics["main/accuracy"] == 0.5 and metrics["main/reward_mean"] == 0.5
    # the advantages travel with the episodes (episodes.jsonl, mgrpo view)
    assert [r.components["main_0"]["advantage"] for r in records] == [pytest.approx(1.0), pytest.approx(-1.0)]
    assert records[0].components["sub_0"] == {"advantage": 0.0, "aligned_slots": 2}


def test_score_batch_sub_advantages_pool_over_the_query():
    records = [_record(1.0, [1.0, 0.5], True), _record(0.1, [0.1, 0.1], False)]
    batch = score_batch(records, k=2, d=2, strategy="duplicate", rng=np.random.default_rng(0))
    rewards = np.array([1.0, 0.5, 0.1, 0.1])
    expected = (rewards - rewards.mean()) / rewards.std()
    assert [s.advantage for s in batch.sub] == pytest.approx(expected.tolist(), abs=1e-6)
    assert [s.reward for s in batch.sub] == [1.0, 0.5, 0.1, 0.1]  # read from the env's R_S, not recomputed


def test_score_batch_groups_per_query_not_per_batch():
    # two queries, K = 2. Per query: A_M = [+1, -1] in both, whatever the other query's scale; pooled
    # over the batch the second query's rollouts would all be negative.
    records = [_record(1.0, [1.0, 0.0], True), _record(0.8, [0.6], True),
               _record(0.2, [0.3, 0.1], False), _record(0.1, [0.2], False)]
    batch = score_batch(records, k=2, d=2, strategy="duplicate", rng=np.random.default_rng(0))
    assert [s.advantage for s in batch.main] == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-6)
    # A_S pooled per query over its d*K = 4 slots (rollout 1's single sub fills both of its slots)
    for q, pool in ((0, [1.0, 0.0, 0.6, 0.6]), (1, [0.3, 0.1, 0.2, 0.2])):
        values = np.array(pool)
        expected = (values - values.mean()) / values.std()
        got = [s.advantage for s in batch.sub if s.key.query == q]
        assert got == pytest.approx(expected.tolist(), abs=1e-6)


@pytest.mark.parametrize("mode", ["mgrpo", "frozen-sub", "single-agent"])
def test_two_iterations_in_each_mode(mode, small_scenario, tmp_path):
    cfg = load_config(
        None,
        [
            f"mode={mode}",
            f"out_dir={tmp_path / 'run'}",
            f"models_dir={tmp_path / 'models'}",
            f"scenario_kwargs={{num_entities: 300, data_dir: {small_scenario.data_dir}}}",
            "questions_per_iteration=2",
            "group_size=2",
            "stages=[{split: stage1/train, iterations: 1}, {split: stage2/train, iterations: 1}]",
            "model_sizes={main: {hidden_size: 64, num_layers: 2}, sub: {hidden_size: 64, num_layers: 2}, single: {hidden_size: 64, num_layers: 2}}",
            "main.generation.max_new_tokens=24",
            "sub.generation.max_new_tokens=24",
            "single.generation.max_new_tokens=24",
            "limits={max_main_turns: 3, max_sub_turns: 2, max_delegations: 2}",
            "warm_start.epochs=0",
        ],
    )
    trainer = Trainer(cfg)
    role = "single" if mode == "single-agent" else "main"
    history = trainer.run()
    assert len(history) == 2 and [h["split"] for h in history] == ["stage1/train", "stage2/train"]
    assert all(h["rollouts"] == 4 for h in history)
    learners = {r for r, w in trainer.workers.items() if w.learner is not None}
    assert learners == ({"single"} if mode == "single-agent" else ({"main"} if mode == "frozen-sub" else {"main", "sub"}))
    assert all(h[f"{role}/samples"] == 4 for h in history)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["iteration"] == 1
    assert len((tmp_path / "run" / "episodes.jsonl").read_text().splitlines()) == 8
    assert (tmp_path / "run" / "checkpoints" / "stage2" / role / "learner.json").exists()
    # the learner's model object is the policy's: rollouts always see the current weights
    assert trainer.workers[role].policy.model is trainer.workers[role].learner.model
    # every saved model folder is a complete Hugging Face folder (issue 21): a checkpoint's and the final ones
    from transformers import AutoModelForCausalLM, AutoTokenizer

    roles = ["single"] if mode == "single-agent" else ["main", "sub"]
    folders = [tmp_path / "run" / "checkpoints" / "stage2" / role / "model",
               *[tmp_path / "run" / "final" / r for r in roles]]
    for folder in folders:
        assert AutoTokenizer.from_pretrained(folder).chat_template, folder
        assert AutoModelForCausalLM.from_pretrained(folder).config.model_type == "qwen2"
    if mode == "mgrpo":
        from mgrpo_algo.cli import main

        code = main(["eval", "--agent", str(tmp_path / "run" / "final"), "--set", "num_entities=300",
                     "--set", f"data_dir={small_scenario.data_dir}", "--limit", "1", "--max-new-tokens", "8", "--quiet"])
        assert code == 0


def test_served_main_role_gets_its_lora_adapter_after_every_update(small_scenario, tmp_path):
    pytest.importorskip("peft")
    from test_weight_sync import FakeServer

    server = FakeServer(base_model="base")
    try:
        cfg = load_config(None, [
            f"out_dir={tmp_path / 'run'}", f"models_dir={tmp_path / 'models'}", "warm_start.epochs=0",
            f"scenario_kwargs={{num_entities: 300, data_dir: {small_scenario.data_dir}}}",
            "questions_per_iteration=2", "group_size=2", "stages=[{split: stage1/train, iterations: 2}]",
            "model_sizes={main: {hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1}, "
            "sub: {hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1}}",
            "sub.generation.max_new_tokens=8", "limits={max_main_turns: 2, max_sub_turns: 1, max_delegations: 1}",
            f"main.served={{base_url: {server.url}, model: base}}", "main.learner.lora_rank=4",
        ])
        trainer = Trainer(cfg)
        history = trainer.run()
    finally:
        server.close()
    loads = [body for method, path, _, body in server.calls if path == "/v1/load_lora_adapter"]
    assert [b["lora_name"] for b in loads] == ["main-step1", "main-step2"]
    assert all((tmp_path / "run" / "adapters" / b["lora_name"] / "adapter_config.json").exists() for b in loads)
    models = [body["model"] for method, path, _, body in server.calls if path == "/v1/completions"]
    assert models[0] == "base" and "main-step1" in models  # the second iteration samples from the synced adapter
    assert all("main/weight_sync_s" in h for h in history)


def test_credit_options_reach_both_sides_and_a_heldout_point_joins_its_iterations_line(small_scenario, tmp_path,
                                                                                        monkeypatch):
    """turn_format_penalty / success_likelihood / sub_outcome_groups reach the loop's main scoring and the sub
    worker's (by value, through the CalledScoring it is sent), and what ``heldout`` returns lands in that
    iteration's metrics.jsonl line only."""
    from mgrpo_algo.core import scoring
    from mgrpo_algo.training import trainer as trainer_module

    seen: dict[str, list] = {"main": [], "sub": []}
    real_main, real_sub = trainer_module.score_main_side, scoring.score_sub_side

    def main_side(*args, **kwargs):
        seen["main"].append(kwargs["credit"])
        return real_main(*args, **kwargs)

    def sub_side(*args, **kwargs):
        seen["sub"].append((kwargs["credit"], kwargs["outcome_groups"]))
        return real_sub(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "score_main_side", main_side)
    monkeypatch.setattr(scoring, "score_sub_side", sub_side)  # the sub worker imports it when it scores
    cfg = load_config(None, [
        f"out_dir={tmp_path / 'run'}", f"models_dir={tmp_path / 'models'}",
        f"scenario_kwargs={{num_entities: 300, data_dir: {small_scenario.data_dir}}}",
        "questions_per_iteration=2", "group_size=2", "stages=[{split: stage2/train, iterations: 2}]",
        "model_sizes={main: {hidden_size: 64, num_layers: 2}, sub: {hidden_size: 64, num_layers: 2}}",
        "main.generation.max_new_tokens=24", "sub.generation.max_new_tokens=24",
        "limits={max_main_turns: 3, max_sub_turns: 2, max_delegations: 2}", "warm_start.epochs=0",
        "turn_format_penalty=0.25", "success_likelihood=0.125", "sub_outcome_groups=subtask",
    ])
    calls = []

    def heldout(done):
        calls.append(done)
        return {"em": 0.5, "sub_no_result": 0.25} if done == 1 else {}

    history = Trainer(cfg, heldout=heldout).run()
    assert calls == [1, 2]
    credit = scoring.TurnCredit(format_penalty=0.25, success_likelihood=0.125)
    assert seen["main"] == [credit, credit]
    assert seen["sub"] == [(credit, "subtask")] * 2
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert (lines[0]["heldout/em"], lines[0]["heldout/sub_no_result"]) == (0.5, 0.25) and lines[0]["time/heldout"] >= 0
    assert not any(k.startswith("heldout/") for k in lines[1]) and "heldout/em" in history[0]
    # the endings of the training rollouts are in every line too (a rate with nothing to count is left out)
    assert all(0 <= line["mistakes/malformed_main_episodes"] <= 1 and 0 <= line["mistakes/turn_limit_episodes"] <= 1
               for line in lines)
