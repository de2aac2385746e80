"""Warm start: demonstrations from the oracle, sequences built like rollouts, noise, loss going down."""

from __future__ import annotations

import json
import random

import pytest

from mgrpo_algo.config import WarmStartConfig
from mgrpo_algo.hf_policy import ChatPrompter, load_tokenizer
from mgrpo_algo.models import build_role_models
from mgrpo_algo.warmstart import demonstrations, sft_sequences, warm_start


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
    cfg = WarmStartConfig(splits=["stage1/train"], max_tasks=4, epochs=4, lr=3e-3, noise=0.0)
    out = warm_start(small_scenario, tiny_models, tmp_path / "warm", cfg)
    for role in ("main", "sub"):
        info = json.loads((out[role] / "warm_start.json").read_text())
        assert info["metrics"]["loss_last"] < info["metrics"]["loss_first"]
        assert (out[role] / "config.json").exists()
    stamp = (out["main"] / "warm_start.json").stat().st_mtime_ns
    again = warm_start(small_scenario, tiny_models, tmp_path / "warm", cfg)
    assert again == out and (out["main"] / "warm_start.json").stat().st_mtime_ns == stamp


def test_bad_noise_is_refused():
    with pytest.raises(ValueError, match="warm_start.noise"):
        WarmStartConfig(noise=1.5)
