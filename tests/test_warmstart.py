"""Warm start: demonstrations from the oracle, sequences built like rollouts, noise, loss going down."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from mgrpo_algo.core.config import WarmStartConfig
from mgrpo_algo.learning.warmstart import demonstrations, sft_sequences, turn_exact_match, warm_start
from mgrpo_algo.policies.chat_tokens import ChatPrompter, load_tokenizer
from mgrpo_algo.policies.models import build_role_models


@pytest.fixture(scope="module")
def tiny_models(small_scenario, tmp_path_factory):
    out = tmp_path_factory.mktemp("models")
    sizes = {r: {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1} for r in ("main", "sub")}
    return {r: str(p) for r, p in build_role_models(small_scenario, out, sizes, vocab_size=512, roles=["main", "sub"]).items()}


def test_demonstrations_are_correct_oracle_chats(small_scenario, small_world):
    chats = demonstrations(small_scenario, small_world, ["stage2/train"], 4, single=False)
    assert len(chats["main"]) == 4 and len(chats["sub"]) >= 8
    assert all(c[0]["role"] == "system" and c[2]["role"] == "assistant" for c in chats["main"] + chats["sub"])
    single = demonstrations(small_scenario, small_world, ["stage1/train"], 3, single=True)
    assert len(single["single"]) == 3 and "<answer>" in single["single"][0][-1]["content"]


def test_sft_sequences_match_rollout_prompts_and_noise_counts(small_scenario, small_world, tiny_models):
    tokenizer = load_tokenizer(tiny_models["sub"])
    chats = demonstrations(small_scenario, small_world, ["stage1/train"], 3, single=False)["sub"]
    clean, counts = sft_sequences(tokenizer, chats, role="sub", noise=0.0, rng=random.Random(0), max_seq_tokens=100_000)
    assert counts == {"sequences": len(chats), "skipped_too_long": 0, "noisy_actions": 0}
    prompter = ChatPrompter(tokenizer)
    ids, mask = clean[0]
    first = prompter.first_prompt(chats[0][:2])
    assert ids[: len(first)] == first and not any(mask[: len(first)])  # the prompt a rollout would build
    sampled = [t for t, m in zip(ids, mask, strict=True) if m]
    expected = [t for i in range(2, len(chats[0]), 2) for t in prompter.encode(chats[0][i]["content"])]
    assert sampled == expected  # the loss sees exactly the demonstrated actions
    _, noisy = sft_sequences(tokenizer, chats, role="sub", noise=1.0, rng=random.Random(0), max_seq_tokens=100_000)
    assert noisy["noisy_actions"] == sum((len(c) - 1) // 2 for c in chats)
    _, short = sft_sequences(tokenizer, chats, role="sub", noise=0.0, rng=random.Random(0), max_seq_tokens=10)
    assert short["skipped_too_long"] == len(chats)


def test_warm_start_lowers_the_loss_and_is_reused(small_scenario, tiny_models, tmp_path):
    cfg = WarmStartConfig(splits=["stage1/train"], max_tasks=4, epochs=4, lr=3e-3, noise=0.0, validation_tasks=2)
    out = warm_start(small_scenario, tiny_models, tmp_path / "warm", cfg, progress=False)
    for role in ("main", "sub"):
        info = json.loads((out[role] / "warm_start.json").read_text())
        assert info["metrics"]["loss_last"] < info["metrics"]["loss_first"]
        validation = info["metrics"]["validation"]  # 2 held-out tasks (correct oracle episodes only)
        assert validation["turns"] >= 2 and 0.0 <= validation["turn_exact_match"] <= validation["token_accuracy"] <= 1.0
        assert (out[role] / "config.json").exists()
    stamp = (out["main"] / "warm_start.json").stat().st_mtime_ns
    again = warm_start(small_scenario, tiny_models, tmp_path / "warm", cfg)
    assert again == out and (out["main"] / "warm_start.json").stat().st_mtime_ns == stamp


def test_bad_noise_is_refused():
    with pytest.raises(ValueError, match="warm_start.noise"):
        WarmStartConfig(noise=1.5)


class _FirstTasks:
    """The scenario with each split cut to its first ``n`` tasks (a cheap split for demonstrations)."""

    def __init__(self, scenario, n: int) -> None:
        self._scenario, self._n = scenario, n

    def tasks(self, split):
        return list(self._scenario.tasks(split))[: self._n]

    def __getattr__(self, name):
        return getattr(self._scenario, name)


def test_held_out_tasks_are_never_demonstrated_for_training(small_scenario, small_world):
    # a 12-task split: the oracle demonstrates 9 for training and the last 3 for validation
    scenario = _FirstTasks(small_scenario, 12)
    train = demonstrations(scenario, small_world, ["stage1/train"], 10_000, single=False, held_out=3)
    held = demonstrations(scenario, small_world, ["stage1/train"], 10_000, single=False, held_out=3, validation=True)
    questions = {c[1]["content"] for c in train["main"]}
    assert len(held["main"]) == 3 and not questions & {c[1]["content"] for c in held["main"]}
    every = [t.question for t in scenario.tasks("stage1/train")]
    assert [c[1]["content"] for c in held["main"]] == every[-3:]
    assert len(train["main"]) >= 8  # the 9 others are demonstrated (the oracle may miss one)


class _NextTokenTable(torch.nn.Module):
    """Predicts table[token] after each token: argmax decisions set by hand."""

    def __init__(self, table: dict[int, int], vocab: int = 10) -> None:
        super().__init__()
        self.table = torch.tensor([table.get(t, 0) for t in range(vocab)])
        self.vocab = vocab

    def forward(self, input_ids, attention_mask=None):
        from types import SimpleNamespace

        return SimpleNamespace(logits=torch.nn.functional.one_hot(self.table[input_ids], self.vocab).float())


def test_turn_exact_match_by_hand():
    # turns: tokens 3,4 (predicted after 2 and 3) and token 6 (predicted after 5)
    seq, mask = [1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1]
    model = _NextTokenTable({1: 2, 2: 3, 3: 9, 4: 5, 5: 6})  # 3 -> 9 misses token 4: the first turn fails
    result = turn_exact_match(model, [(seq, mask)], pad_id=0)
    assert result == {"turn_exact_match": 0.5, "token_accuracy": 2 / 3, "turns": 2}
    perfect = turn_exact_match(_NextTokenTable({1: 2, 2: 3, 3: 4, 4: 5, 5: 6}), [(seq, mask), (seq[:4], mask[:4])], pad_id=0)
    assert perfect == {"turn_exact_match": 1.0, "token_accuracy": 1.0, "turns": 3}


def test_right_padded_batches_need_no_attention_mask(tiny_models):
    # sft_train and turn_exact_match skip the mask: under causal attention real tokens never see right pads
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_models["main"]).eval()
    short, long = [5, 9, 14, 3], [7, 8, 9, 10, 11, 12, 13]
    batch = torch.tensor([short + [0] * 3, long])
    with torch.no_grad():
        padded = model(input_ids=batch).logits
        alone = model(input_ids=torch.tensor([short])).logits
    assert torch.allclose(padded[0, :4], alone[0], atol=1e-5)


def test_two_warm_starts_from_scratch_give_identical_weights(small_scenario, tmp_path):
    """Tokenizer, models and warm start built twice, each warm start on a freshly opened world (a new
    loopback port): the demonstrations show the stable origin, so every weight is bit-identical."""
    sizes = {r: {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1} for r in ("main", "sub")}
    cfg = WarmStartConfig(splits=["stage2/train"], max_tasks=2, epochs=1, noise=0.2, validation_tasks=0)
    weights = []
    for run in ("a", "b"):
        models = build_role_models(small_scenario, tmp_path / run / "models", sizes, vocab_size=512, roles=["main", "sub"])
        out = warm_start(small_scenario, {r: str(p) for r, p in models.items()}, tmp_path / run / "warm", cfg,
                         progress=False)
        weights.append({role: AutoModelForCausalLM.from_pretrained(out[role]).state_dict() for role in ("main", "sub")})
        info = json.loads((out["sub"] / "warm_start.json").read_text())
        assert info["counts"]["sequences"] > 0
    for role in ("main", "sub"):
        first, second = weights[0][role], weights[1][role]
        assert first.keys() == second.keys()
        assert all(torch.equal(first[name], second[name]) for name in first), role


def test_teacher_stage_matches_the_single_agents_budget_and_is_reused(small_scenario, tmp_path):
    """Stage 2 fine-tunes stage 1's models on the teacher's demonstrations (every episode kept); the
    single agent's steps over both stages equal the main and sub roles' together; a rerun is reused."""
    from mgrpo_algo.core.teacher_config import MistakeConfig, TeacherConfig
    from mgrpo_algo.learning.teacher_stage import teacher_warm_start

    sizes = {r: {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1} for r in ("main", "sub", "single")}
    models = build_role_models(small_scenario, tmp_path / "models", sizes, vocab_size=512, roles=list(sizes))
    cfg = WarmStartConfig(splits=["stage1/train"], max_tasks=3, epochs=1, noise=0.0, validation_tasks=0, batch_tokens=1024,
                          teacher=TeacherConfig(answer_early=MistakeConfig(0.5), report_without_visit=MistakeConfig(0.5),
                                                draws=2, role_epochs={"main": 2, "sub": 1}))
    first = warm_start(small_scenario, {r: str(p) for r, p in models.items()}, tmp_path / "warm", cfg, progress=False)
    out = teacher_warm_start(small_scenario, tmp_path / "warm", tmp_path / "teacher", cfg, progress=False)
    info = {r: json.loads((out[r] / "warm_start.json").read_text()) for r in out}
    oracle = {r: json.loads((first[r] / "warm_start.json").read_text())["metrics"]["steps"] for r in first}
    for role in ("main", "sub", "single"):
        assert info[role]["budget"]["oracle_stage_steps"] == oracle[role]
        assert info[role]["budget"]["total_steps"] == oracle[role] + info[role]["metrics"]["steps"]
    assert info["single"]["budget"]["total_steps"] == info["main"]["budget"]["total_steps"] + info["sub"]["budget"]["total_steps"]
    assert info["single"]["budget"]["matched_to_hierarchy"] and not info["main"]["budget"]["matched_to_hierarchy"]
    # every teacher episode is shown, right or wrong: 2 draws of 3 tasks for the main agent
    assert info["main"]["counts"]["sequences"] == 6 and info["main"]["teacher"]["draw0"]["episodes"] == 3.0
    stamp = (out["main"] / "warm_start.json").stat().st_mtime_ns
    assert teacher_warm_start(small_scenario, tmp_path / "warm", tmp_path / "teacher", cfg) == out
    assert (out["main"] / "warm_start.json").stat().st_mtime_ns == stamp
    weights = AutoModelForCausalLM.from_pretrained(out["sub"]).state_dict()
    before = AutoModelForCausalLM.from_pretrained(first["sub"]).state_dict()
    assert any(not torch.equal(weights[n], before[n]) for n in weights)  # the fine-tune moved the sub model
    # a second build into another folder (fresh world port, fresh demonstrations) is bit-identical
    cfg_main = replace(cfg, teacher=replace(cfg.teacher, role_epochs={"main": 2, "sub": 1}, single_matches_hierarchy=False))
    again = teacher_warm_start(small_scenario, tmp_path / "warm", tmp_path / "teacher-again", cfg_main,
                               roles=("main", "sub"), progress=False)
    for role in ("main", "sub"):
        a = AutoModelForCausalLM.from_pretrained(out[role]).state_dict()
        b = AutoModelForCausalLM.from_pretrained(again[role]).state_dict()
        assert all(torch.equal(a[n], b[n]) for n in a), role


def test_torch_threads_sets_the_count_inside_the_block_and_restores_it():
    from mgrpo_algo.core.seeding import torch_threads

    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(0):  # at least one thread, restored after an error too
        assert torch.get_num_threads() == 1
        raise RuntimeError
    assert torch.get_num_threads() == before
