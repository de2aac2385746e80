"""LoRA per role (peft) and autocast in RoleLearner: only the adapter trains, two roles share one base
model object, LoRA checkpoints resume exactly, merged weights equal the adapted model, autocast
settings are validated. Tiny Qwen2 models built locally (CPU, seconds)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from learner_helpers import padded_logprobs, padded_loss_mask

from mgrpo_algo.core.config import LearnerConfig
from mgrpo_algo.core.losses import clipped_pg_loss
from mgrpo_algo.core.sequences import TokenSequence
from mgrpo_algo.learning.learner import RoleLearner

peft = pytest.importorskip("peft")

from mgrpo_algo.learning import lora  # noqa: E402

VOCAB = 128
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-qwen2-lora")
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def cfg(**overrides) -> LearnerConfig:
    return LearnerConfig(**{"lr": 1e-2, "lora_rank": 4, "lora_alpha": 8.0, **overrides})


def batch(seed: int = 0, n: int = 8) -> list[TokenSequence]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length, prompt = rng.randint(10, 30), rng.randint(2, 5)
        ids = [rng.randrange(VOCAB) for _ in range(length)]
        out.append(TokenSequence(ids, [0] * prompt + [1] * (length - prompt), advantage=1.0 if i % 2 == 0 else -1.0))
    return out


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def changed(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> set[str]:
    return {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}




def test_lora_update_trains_only_the_adapter_and_lowers_the_loss(model_dir):
    learner, seqs = RoleLearner("main", model_dir, cfg()), batch()
    assert lora.is_peft_model(learner.model) and learner.adapter == "main"
    trainable = {id(p) for p in learner.params}
    assert all("lora_" in n for n, p in learner.model.named_parameters() if id(p) in trainable)
    assert len(learner.params) == 2 * len(TARGETS) * 2  # A and B per targeted projection, 2 layers
    adv, mask = torch.tensor([s.advantage for s in seqs]), padded_loss_mask(seqs)
    start, first = snapshot(learner.model), padded_logprobs(learner, seqs)
    for _ in range(3):
        metrics = learner.update(seqs)
    assert metrics["main/skipped"] == 0 and metrics["main/nonfinite_steps"] == 0
    moved = changed(learner.model, start)
    assert moved and all("lora_" in n for n in moved)  # the base is frozen
    assert any("lora_A" in n for n in moved) and any("lora_B" in n for n in moved)
    last = padded_logprobs(learner, seqs)
    loss_before, _ = clipped_pg_loss(first, first, adv, mask)
    loss_after, _ = clipped_pg_loss(last, first, adv, mask)
    assert loss_after < loss_before - 1e-3
    change = ((last - first) * mask).sum(-1)
    assert (change[adv > 0] > 0).all() and (change[adv < 0] < 0).all()


def test_two_roles_share_one_base_model_object(model_dir):
    main = RoleLearner("main", model_dir, cfg())
    base_weight = main.model.get_base_model().model.embed_tokens.weight
    sub = RoleLearner("sub", main.model, cfg(lr=5e-3))
    assert sub.model is main.model and set(main.model.peft_config) == {"main", "sub"}
    assert sub.model.get_base_model().model.embed_tokens.weight is base_weight  # stored once
    assert not {id(p) for p in main.params} & {id(p) for p in sub.params}
    seqs = batch(1)
    start = snapshot(main.model)
    main.update(seqs)
    after_main = changed(main.model, start)
    assert after_main and all(".main." in n for n in after_main)
    start = snapshot(main.model)
    sub.update(batch(2))
    after_sub = changed(main.model, start)
    assert after_sub and all(".sub." in n for n in after_sub)
    # Each learner scores with its own adapter, whatever adapter was active before.
    main.model.set_adapter("sub")
    lp_main, lp_sub = padded_logprobs(main, seqs), padded_logprobs(sub, seqs)
    assert not torch.allclose(lp_main, lp_sub)
    with lora.use_adapter(main.model, "main"):  # for a rollout policy on the shared object
        assert main.model.active_adapter == "main"
    assert main.model.active_adapter == "sub"  # restored


def test_lora_checkpoint_resumes_exactly(model_dir, tmp_path):
    learner = RoleLearner("sub", model_dir, cfg())
    learner.update(batch(0))
    ckpt = learner.save(tmp_path / "ckpt")
    assert (ckpt / "adapter" / "adapter_config.json").exists()
    assert (ckpt / "adapter" / "adapter_model.safetensors").exists()
    assert not (ckpt / "ref_model").exists()
    meta = json.loads((ckpt / "learner.json").read_text())
    assert meta["config"]["lora_rank"] == 4
    learner.update(batch(1))
    expected = snapshot(learner.model)

    loaded = RoleLearner.load(ckpt)
    assert loaded.adapter == "sub" and loaded.step == 1 and loaded.config.lora_targets == TARGETS
    loaded.update(batch(1))
    for n, p in loaded.model.named_parameters():
        torch.testing.assert_close(p, expected[n], rtol=0, atol=1e-6, msg=n)

    fresh = RoleLearner("sub", model_dir, cfg())  # resume in place: the same parameter objects
    params = list(fresh.params)
    fresh.resume(ckpt)
    assert fresh.step == 1 and all(a is b for a, b in zip(params, fresh.params, strict=True))
    fresh.update(batch(1))
    for n, p in fresh.model.named_parameters():
        torch.testing.assert_close(p, expected[n], rtol=0, atol=1e-6, msg=n)


def test_lora_checkpoint_base_is_a_plain_unmerged_model(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    learner = RoleLearner("main", model_dir, cfg())
    learner.update(batch())
    ckpt = learner.save(tmp_path / "ckpt")
    original = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    saved = AutoModelForCausalLM.from_pretrained(ckpt / "model").state_dict()
    assert set(saved) == set(original)
    for k in original:
        torch.testing.assert_close(saved[k], original[k], rtol=0, atol=0)
    with pytest.raises(ValueError, match="LoRA checkpoint"):
        RoleLearner.load(ckpt, LearnerConfig(lora_rank=0))
    plain = RoleLearner("main", model_dir, LearnerConfig())
    with pytest.raises(ValueError, match="LoRA checkpoint"):
        plain.resume(ckpt)


def test_merged_weights_equal_the_adapted_model(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    learner = RoleLearner("main", model_dir, cfg())
    for seed in range(2):
        learner.update(batch(seed))
    merged = AutoModelForCausalLM.from_pretrained(model_dir)
    merged.load_state_dict(lora.merged_state_dict(learner.model, "main"))
    ids = torch.tensor([batch(5)[0].input_ids])
    with torch.no_grad():
        expected = learner.model(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    out = learner.save_adapter(tmp_path / "adapter")  # the directory vLLM loads
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and sorted(config["target_modules"]) == sorted(TARGETS)


def test_kl_reference_is_the_base_with_adapters_disabled(model_dir):
    learner = RoleLearner("main", model_dir, cfg(kl_coef=0.1))
    assert learner.ref_model is None  # no copy of the base
    first = learner.update(batch())
    assert first["main/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # identity adapter at start
    second = learner.update(batch())
    assert second["main/kl_ref"] > 0


def test_bfloat16_autocast_on_cpu_trains(model_dir):
    learner = RoleLearner("main", model_dir, cfg(autocast_dtype="bfloat16"))
    plain = RoleLearner("main", model_dir, cfg())
    seqs = batch()
    lp_auto, lp_plain = padded_logprobs(learner, seqs), padded_logprobs(plain, seqs)
    assert not torch.equal(lp_auto, lp_plain)  # the forward really ran in bf16 ...
    torch.testing.assert_close(lp_auto, lp_plain, atol=0.1, rtol=0)  # ... and agrees to bf16 precision
    metrics = learner.update(seqs)
    assert metrics["main/nonfinite_steps"] == 0
    assert all(p.dtype == torch.float32 for p in learner.params)  # parameters keep their dtype


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"autocast_dtype": "fp16"}, "autocast_dtype"),
        ({"autocast_dtype": "float16"}, "CUDA"),
        ({"autocast_dtype": "float16", "device": "cpu"}, "CUDA"),
        ({"lora_rank": -1}, "lora_rank"),
        ({"lora_rank": 2.5}, "lora_rank"),
        ({"lora_alpha": 0}, "lora_alpha"),
        ({"lora_rank": 4, "lora_targets": []}, "lora_targets"),
    ],
)
def test_config_validates_autocast_and_lora(overrides, match):
    with pytest.raises(ValueError, match=match):
        LearnerConfig(**overrides)


def test_config_accepts_autocast_and_lora_from_yaml():
    from mgrpo_algo.core.config import load_config

    config = load_config(None, ["main.learner.autocast_dtype=bfloat16", "main.learner.lora_rank=8",
                                "main.learner.lora_targets=[q_proj, v_proj]", "main.learner.device=cuda"])
    learner = config.main.learner
    assert (learner.autocast_dtype, learner.lora_rank, learner.lora_targets) == ("bfloat16", 8, ("q_proj", "v_proj"))
    assert LearnerConfig(device="cuda:1", autocast_dtype="float16").autocast_dtype == "float16"
