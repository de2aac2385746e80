"""The shared-model baseline's start (``mgrpo warm-start --from DIR --shared``): one model fine-tuned from
the main agent's stage-1 model on the main and the sub roles' teacher demonstrations together."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from mgrpo_algo.cli import main as cli_main
from mgrpo_algo.core.config import WarmStartConfig
from mgrpo_algo.core.teacher_config import MistakeConfig, TeacherConfig
from mgrpo_algo.learning import teacher_stage
from mgrpo_algo.learning.teacher_stage import RoleMix, shared_teacher_warm_start, teacher_demonstrations
from mgrpo_algo.learning.warmstart import sft_sequences
from mgrpo_algo.policies.chat_tokens import ChatPrompter, load_tokenizer
from mgrpo_algo.policies.models import build_role_models

SIZES = {r: {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1} for r in ("main", "sub")}
# main 3 epochs, sub 1.5 (a whole pass and half of another: the fraction path of RoleMix)
TEACHER = TeacherConfig(answer_early=MistakeConfig(0.5), report_without_visit=MistakeConfig(0.5), draws=1,
                        role_epochs={"main": 3, "sub": 1.5}, lr=3e-3, warmup_steps=2)
CFG = WarmStartConfig(splits=["stage1/train"], max_tasks=6, validation_tasks=3, batch_tokens=1024, relabel=False,
                      max_seq_tokens=4096, teacher=TEACHER)


@pytest.fixture(scope="module")
def stage1(small_scenario, tmp_path_factory) -> Path:
    """Untrained tiny main and sub models with one tokenizer (``<root>/main``, ``<root>/sub``)."""
    root = tmp_path_factory.mktemp("shared-start") / "models"
    build_role_models(small_scenario, root, SIZES, vocab_size=512, roles=["main", "sub"])
    return root


def _key(seq):
    return tuple(seq[0]), tuple(seq[1])


def test_shared_fit_sees_both_roles_sequences_and_learns_both(small_scenario, stage1, tmp_path, monkeypatch):
    seen: list = []
    real_train = teacher_stage.sft_train

    def spy(model, sequences, cfg, **kwargs):
        seen.append(([sequences[i] for i in range(len(sequences))], kwargs["epochs"]))
        return real_train(model, sequences, cfg, **kwargs)

    monkeypatch.setattr(teacher_stage, "sft_train", spy)
    out = shared_teacher_warm_start(small_scenario, stage1, tmp_path / "shared", CFG, progress=False)

    # exactly the sequences stage 2 builds for each role's own model: main 3 times, sub 1.5 times, one pass
    tokenizer = load_tokenizer(str(stage1 / "main"))
    with small_scenario.open() as world:
        chats, _ = teacher_demonstrations(small_scenario, world, CFG, single=False)
    expected = {role: sft_sequences(tokenizer, chats[role], role=role, noise=0.0, rng=random.Random(f"teacher-0-{role}"),
                                    max_seq_tokens=CFG.max_seq_tokens)[0] for role in ("main", "sub")}
    assert len(expected["main"]) == 6 and len(expected["sub"]) >= 2  # every teacher episode, right or wrong
    (shown, epochs), = seen
    assert epochs == 1.0
    whole = Counter(_key(s) for s in expected["main"] * 3 + expected["sub"])
    rest = Counter(_key(s) for s in shown) - whole
    assert sum(whole.values()) + sum(rest.values()) == len(shown)  # every whole copy was shown
    assert sum(rest.values()) == round(0.5 * len(expected["sub"])) and rest <= Counter(_key(s) for s in expected["sub"])
    # each chat under its own role's system prompt
    prompter = ChatPrompter(tokenizer)
    systems = {role: chats[role][0][0]["content"] for role in ("main", "sub")}
    assert systems["main"] != systems["sub"]
    for role in ("main", "sub"):
        prefix = prompter.first_prompt(chats[role][0][:2])
        assert any(list(ids[: len(prefix)]) == prefix for ids, _ in shown), role

    # a complete from_pretrained folder with the start's tokenizer, moved from the start
    assert {"config.json", "model.safetensors", "tokenizer.json", "warm_start.json"} <= {p.name for p in out.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(out)
    assert load_tokenizer(str(out)).get_vocab() == tokenizer.get_vocab()
    start = AutoModelForCausalLM.from_pretrained(stage1 / "main").state_dict()
    assert any(not torch.equal(model.state_dict()[n], start[n]) for n in start)

    # both roles learned: held-out token accuracy (oracle turns of the 3 held-out tasks) rose in each
    record = json.loads((out / "warm_start.json").read_text())
    metrics = record["metrics"]
    for role in ("main", "sub"):
        assert metrics["validation"][role]["turns"] > 0
        assert metrics["validation"][role]["token_accuracy"] > metrics["validation_before"][role]["token_accuracy"] + 0.05, role
    assert record["budget"]["shown"] == {"main": 3 * len(expected["main"]),
                                         "sub": len(expected["sub"]) + round(0.5 * len(expected["sub"]))}
    assert record["from"] == str(stage1 / "main") and record["roles"] == ["main", "sub"]

    # a rerun with the same key is reused, not retrained
    stamp = (out / "warm_start.json").stat().st_mtime_ns
    assert shared_teacher_warm_start(small_scenario, stage1, tmp_path / "shared", CFG, progress=False) == out
    assert (out / "warm_start.json").stat().st_mtime_ns == stamp and len(seen) == 1


def test_role_mix_shows_each_role_its_epochs():
    parts = {"main": [([1], [1]), ([2], [1])], "sub": [([3], [1]), ([4], [1]), ([5], [1]), ([6], [1])]}
    mix = RoleMix(parts, {"main": 2, "sub": 0.5}, seed=0)
    items = [mix[i] for i in range(len(mix))]
    assert Counter(ids[0] for ids, _ in items)[1] == 2 and Counter(ids[0] for ids, _ in items)[2] == 2
    assert mix.shown() == {"main": 4, "sub": 2} and len(mix) == 6
    assert RoleMix(parts, {"main": 0, "sub": 1}).shown() == {"main": 0, "sub": 4}


def test_bad_inputs_are_refused(small_scenario, stage1, tmp_path):
    # the sub start built with another tokenizer: one model cannot read both roles' turns
    other = build_role_models(small_scenario, tmp_path / "other", SIZES, vocab_size=600, roles=["sub"])
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "main").symlink_to(stage1 / "main")
    (mixed / "sub").symlink_to(other["sub"])
    with pytest.raises(ValueError, match="sub start model's tokenizer .* differs from the main"):
        shared_teacher_warm_start(small_scenario, mixed, tmp_path / "out", CFG, progress=False)
    with pytest.raises(ValueError, match="two or more distinct roles"):
        shared_teacher_warm_start(small_scenario, stage1, tmp_path / "out", CFG, roles=("main", "single"))
    with pytest.raises(ValueError, match="no mistake with a rate above 0"):
        shared_teacher_warm_start(small_scenario, stage1, tmp_path / "out", WarmStartConfig())
    with pytest.raises(ValueError, match="no start model folder"):
        shared_teacher_warm_start(small_scenario, tmp_path / "nowhere", tmp_path / "out", CFG)
    assert not (tmp_path / "out").exists()


def _config_file(small_scenario, tmp_path, warm_start):
    """A config file for ``mgrpo warm-start`` on the small world with the ``warm_start`` section given."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "scenario": "wiki-hops", "scenario_kwargs": {"num_entities": 300, "seed": 0, "data_dir": str(small_scenario.data_dir)},
        "models_dir": str(tmp_path / "models"), "warm_start": warm_start}))
    return config


def test_cli_shared_needs_from_and_names_a_bad_start(small_scenario, tmp_path, capsys):
    config = _config_file(small_scenario, tmp_path, {"teacher": {"answer_early": {"rate": 0.3}}})
    assert cli_main(["warm-start", "--config", str(config), "--shared", "--out", str(tmp_path / "out")]) == 2
    assert "--shared fine-tunes a prebuilt oracle stage: give --from" in capsys.readouterr().err
    assert cli_main(["warm-start", "--config", str(config), "--shared", "--from", str(tmp_path / "none"),
                     "--out", str(tmp_path / "out")]) == 2
    assert "no start model folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_shared_exports_one_checksummed_model(small_scenario, stage1, tmp_path):
    from mgrpo_algo.policies.prebuilt import verify_folder

    config = _config_file(small_scenario, tmp_path, {
        "splits": ["stage1/train"], "max_tasks": 2, "validation_tasks": 0, "batch_tokens": 1024,
        "teacher": {"answer_early": {"rate": 0.3}, "draws": 1, "role_epochs": {"main": 1, "sub": 1}}})
    out = tmp_path / "out"
    (out / "stale").mkdir(parents=True)
    (out / "README.md").write_text("how it was built\n")
    assert cli_main(["warm-start", "--config", str(config), "--from", str(stage1), "--shared", "--out", str(out)]) == 0
    # replaced, its README kept; the owner's folder only: the shared mode loads it for both roles
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "SHA256SUMS", "main"]
    assert (out / "README.md").read_text() == "how it was built\n"
    assert verify_folder(out / "main")
    record = json.loads((out / "main" / "warm_start.json").read_text())
    assert record["roles"] == ["main", "sub"] and record["budget"]["shown"]["sub"] == record["counts"]["sub"]["sequences"] > 0
