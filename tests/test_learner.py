"""RoleLearner and LearnerConfig: the update moves log-probs the right way, micro-batching and masked
slots change nothing, clipping applies, checkpoints resume exactly. Tiny Qwen2 models built locally."""

from __future__ import annotations

import random

import pytest
import torch
from learner_helpers import (
    adamw_steps_tolerance,
    assert_adamw_first_steps_close,
    first_step_grads,
    padded_logprobs,
    padded_loss_mask,
    record_steps,
)

from mgrpo_algo.core.config import LearnerConfig
from mgrpo_algo.core.losses import clipped_pg_loss
from mgrpo_algo.core.sequences import TokenSequence
from mgrpo_algo.learning.learner import RoleLearner

VOCAB = 128


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-qwen2")
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def make(model_dir, role="main", **overrides) -> RoleLearner:
    """A fresh learner on the saved tiny model: every call starts from the same weights."""
    return RoleLearner(role, model_dir, LearnerConfig(**{"lr": 1e-3, **overrides}))


def batch(seed: int = 0, n: int = 8, lo: int = 10, hi: int = 40) -> list[TokenSequence]:
    """n random sequences: a prompt, sampled tokens, sometimes a masked tool response and more sampled
    tokens (multi-turn), advantages alternating +1 / -1."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length, prompt = rng.randint(lo, hi), rng.randint(2, 6)
        mask = [0] * prompt + [1] * (length - prompt)
        if length - prompt > 8 and i % 3 == 0:  # a tool response in the middle
            mask[prompt + 3 : prompt + 6] = [0, 0, 0]
        ids = [rng.randrange(VOCAB) for _ in range(length)]
        out.append(TokenSequence(ids, mask, advantage=1.0 if i % 2 == 0 else -1.0, role="main"))
    return out


def params(learner: RoleLearner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.model.named_parameters()}




def test_update_moves_logprobs_along_advantages_and_lowers_the_loss(model_dir):
    learner, seqs = make(model_dir), batch()
    adv = torch.tensor([s.advantage for s in seqs])
    mask = padded_loss_mask(seqs)
    before = padded_logprobs(learner, seqs)
    metrics = learner.update(seqs)
    after = padded_logprobs(learner, seqs)

    assert metrics["main/skipped"] == 0 and metrics["main/optimizer_steps"] == 1
    assert metrics["main/approx_kl"] == 0 and metrics["main/clipfrac"] == 0  # on-policy: ratio exactly 1
    change = ((after - before) * mask).sum(-1)
    assert (change[adv > 0] > 0).all() and (change[adv < 0] < 0).all()
    # The surrogate the step optimised, recomputed against the pre-update policy, went down.
    loss_before, _ = clipped_pg_loss(before, before, adv, mask)
    loss_after, _ = clipped_pg_loss(after, before, adv, mask)
    assert loss_after < loss_before - 1e-3


def test_every_parameter_changes(model_dir):
    learner = make(model_dir)
    start = params(learner)
    learner.update(batch())
    # A key bias shifts every attention logit of a query equally: softmax ignores it (zero gradient).
    unchanged = [
        n
        for n, p in learner.model.named_parameters()
        if torch.equal(p, start[n]) and not n.endswith("k_proj.bias")
    ]
    assert unchanged == []
    assert learner.step == 1


def test_model_object_is_shared_and_updated_in_place(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    weight = model.get_input_embeddings().weight
    learner = RoleLearner("sub", model, LearnerConfig(lr=1e-3))
    before = weight.detach().clone()
    metrics = learner.update(batch())
    assert learner.model is model and model.get_input_embeddings().weight is weight
    assert not torch.equal(weight, before)
    assert all(k.startswith("sub/") for k in metrics)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_logprobs_are_the_next_token_logprobs_and_padding_does_not_change_them(model_dir, temperature):
    learner, seqs = make(model_dir, temperature=temperature), batch(n=4)
    rows = learner.logprobs(seqs)
    for s, row in zip(seqs, rows, strict=True):
        assert len(row) == s.num_tokens and row[0] == 0.0
        with torch.no_grad():
            logits = learner.model(torch.tensor([s.input_ids])).logits[0]
        ref = torch.log_softmax(logits.float() / temperature, -1)[  # the distribution sampled at T
            torch.arange(s.num_tokens - 1), torch.tensor(s.input_ids[1:])
        ]
        torch.testing.assert_close(torch.tensor(row[1:]), ref, atol=1e-5, rtol=0)


def test_grad_norm_is_clipped(model_dir):
    max_norm = 1e-3
    learner = make(model_dir, max_grad_norm=max_norm)
    metrics = learner.update(batch())
    assert metrics["main/grad_norm"] > 100 * max_norm  # reported before clipping
    # After one AdamW step exp_avg = (1 - beta1) * g: the gradient that was applied had norm max_norm.
    applied = torch.stack([learner.optimizer.state[p]["exp_avg"].norm() for p in learner.params]).norm()
    torch.testing.assert_close(applied / (1 - 0.9), torch.tensor(max_norm), rtol=1e-4, atol=0)

    unclipped = make(model_dir, max_grad_norm=None)
    m2 = unclipped.update(batch())
    applied = torch.stack([unclipped.optimizer.state[p]["exp_avg"].norm() for p in unclipped.params]).norm()
    torch.testing.assert_close(applied / (1 - 0.9), torch.tensor(m2["main/grad_norm"]), rtol=1e-4, atol=0)


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"])
def test_micro_batching_matches_one_big_batch(model_dir, aggregation):
    seqs = batch(n=10)
    whole = make(model_dir, aggregation=aggregation, micro_batch_tokens=10**6)
    split = make(model_dir, aggregation=aggregation, micro_batch_tokens=64)
    m_whole, m_split = whole.update(seqs), split.update(seqs)
    assert m_whole["main/micro_batches"] == 1 and m_split["main/micro_batches"] > 5
    for key in ("loss", "pg_loss", "entropy", "adv_mean"):
        assert m_split[f"main/{key}"] == pytest.approx(m_whole[f"main/{key}"], abs=1e-6), key
    assert m_split["main/grad_norm"] == pytest.approx(m_whole["main/grad_norm"], rel=1e-5)
    # The accumulated gradients agree (exp_avg = (1 - beta1) * g after one step) ...
    g_whole, g_split = first_step_grads(whole), first_step_grads(split)
    for gw, gs in zip(g_whole, g_split, strict=True):
        torch.testing.assert_close(gs, gw, atol=1e-6 * float(gw.abs().max()) + 1e-11, rtol=1e-4)
    # ... and so do the parameters, up to what Adam's g / (|g| + eps) makes of that rounding where g ~ 0.
    assert_adamw_first_steps_close(whole, split, g_whole, grad_atol=1e-11, grad_atol_of_max=1e-6, grad_rtol=1e-4)


def grouped_batch(groups: int = 3, k: int = 4, prompt: int = 24, system: int = 0, seed: int = 1) -> list[TokenSequence]:
    """GRPO groups: ``k`` rollouts of each of ``groups`` prompts (``prompt`` tokens, the first ``system``
    of them the same in every group), completions of different lengths, a masked tool response in some."""
    rng = random.Random(seed)
    head = [rng.randrange(VOCAB) for _ in range(system)]
    out = []
    for _ in range(groups):
        question = head + [rng.randrange(VOCAB) for _ in range(prompt - system)]
        for j in range(k):
            completion = [rng.randrange(VOCAB) for _ in range(rng.randint(6, 20))]
            mask = [0] * prompt + [1] * len(completion)
            if j % 2:
                mask[prompt + 2: prompt + 4] = [0, 0]
            out.append(TokenSequence(question + completion, mask, advantage=rng.choice([-1.0, 0.5, 1.0]), role="main"))
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("system", [0, 20], ids=["per-question prompts", "a shared system prompt"])
def test_a_shared_prefix_runs_once_and_gives_the_same_update(model_dir, system, monkeypatch):
    seqs = grouped_batch(system=system) if system == 0 else grouped_batch(groups=4, k=2, prompt=24, system=20)
    plain = make(model_dir, share_prefix=False, micro_batch_tokens=10**6)
    shared = make(model_dir, share_prefix=True, share_prefix_min_tokens=1, micro_batch_tokens=10**6)
    passes: list[tuple[int, int]] = []
    forward = type(shared.model).forward

    def counted(self, *args, **kwargs):
        passes.append(tuple(kwargs["input_ids"].shape))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(shared.model), "forward", counted)
    m_shared = shared.update(seqs)
    monkeypatch.undo()
    m_plain = plain.update(seqs)
    rows = len(seqs)
    longest = max(s.num_tokens for s in seqs)  # its last token predicts nothing: not run
    if system == 0:  # the 3 prompts run once each (24 tokens, the first sampled token's predictor not in it)
        assert passes == [(3, 23), (rows, longest - 1 - 23)]
    else:  # every prompt differs after the common 20 tokens: those run once
        assert passes == [(1, 20), (rows, longest - 1 - 20)]
    for key in ("loss", "pg_loss", "entropy", "adv_mean", "tokens"):
        assert m_shared[f"main/{key}"] == pytest.approx(m_plain[f"main/{key}"], abs=1e-6), key
    assert m_shared["main/grad_norm"] == pytest.approx(m_plain["main/grad_norm"], rel=1e-5)
    for pw, ps in zip(plain.params, shared.params, strict=True):
        gw, gs = plain.optimizer.state[pw]["exp_avg"], shared.optimizer.state[ps]["exp_avg"]
        torch.testing.assert_close(gs, gw, atol=1e-6 * float(gw.abs().max()) + 1e-12, rtol=1e-4)


def fixed_groups(groups: int = 4, k: int = 4, prompt: int = 24, completion: int = 16, seed: int = 2,
                 gap: bool = False) -> list[TokenSequence]:
    """``groups`` prompts x ``k`` rollouts, every sample ``prompt + completion`` tokens, shuffled;
    ``gap``: every sample has the same 3 masked tokens (a tool response) inside its completion."""
    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        question = [rng.randrange(VOCAB) for _ in range(prompt)]
        for _ in range(k):
            ids = question + [rng.randrange(VOCAB) for _ in range(completion)]
            mask = [0] * prompt + [1] * completion
            if gap:
                mask[prompt + 5: prompt + 8] = [0, 0, 0]
            out.append(TokenSequence(ids, mask, advantage=rng.choice([-1.0, 0.5, 1.0])))
    rng.shuffle(out)
    return out


def reference_update(model_dir, seqs: list[TokenSequence], steps: int, lr: float = 1e-3):
    """The plain update, written out: one full forward over the padded batch, log_softmax + gather,
    the clipped loss over every sample, clip to norm 1, a for-loop AdamW. What the learner's
    shortcuts (prompt-grouped micro-batches, shared prefixes, logits only at trained positions, the
    skipped last token, the fused log-prob backward) must reproduce up to float rounding.
    Returns the model, the first step's gradients and each step's clipped gradients (what AdamW saw)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, foreach=False)
    length = max(s.num_tokens for s in seqs)
    ids = torch.tensor([s.input_ids + [0] * (length - s.num_tokens) for s in seqs])
    mask = padded_loss_mask(seqs)[:, 1:]
    adv = torch.tensor([s.advantage for s in seqs])
    grads, stepped = [], []
    for _ in range(steps):
        logp = torch.log_softmax(model(input_ids=ids).logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
        loss, _ = clipped_pg_loss(logp, logp.detach(), adv, mask)
        opt.zero_grad()
        loss.backward()
        grads = grads or [p.grad.clone() for p in model.parameters()]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        stepped.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return model, grads, stepped


@pytest.mark.parametrize("gap", [False, True], ids=["trailing logits", "logits around a masked gap"])
def test_prefixes_run_once_per_minibatch_across_micro_batches_and_match_the_plain_update(model_dir, monkeypatch, gap):
    seqs = fixed_groups(gap=gap)  # 4 prompts x 4 rollouts of 40 tokens, shuffled; 240 tokens: 6 rows a micro-batch
    learner = make(model_dir, micro_batch_tokens=240, share_prefix_min_tokens=1)
    prefix_rows: list[int] = []
    forward = type(learner.model).forward

    def counted(self, *args, **kwargs):
        if kwargs["input_ids"].shape[1] == 23:  # the prefix pass: the prompt less its last token
            prefix_rows.append(kwargs["input_ids"].shape[0])
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(learner.model), "forward", counted)
    seen = record_steps(learner)
    metrics = learner.update(seqs)
    # exp_avg = (1 - beta1) * g after one step: the first step's (unclipped) gradient, times its clip factor.
    scale = min(1.0, 1.0 / (metrics["main/grad_norm"] + 1e-6)) * (1 - 0.9)
    first = [learner.optimizer.state[q]["exp_avg"].clone() / scale for q in learner.params]
    for _ in range(2):
        metrics = learner.update(seqs)
    monkeypatch.undo()
    # Each micro-batch holds rows of several prompts, a prompt spans several micro-batches: each prompt
    # still runs once per update, in one prefix pass.
    assert metrics["main/micro_batches"] == 3 and prefix_rows == [4] * 3
    model, grads, stepped = reference_update(model_dir, seqs, steps=3)
    for (name, _), g, h in zip(model.named_parameters(), grads, first, strict=True):
        torch.testing.assert_close(h, g, atol=1e-5 * float(g.abs().max()) + 1e-12, rtol=1e-5, msg=name)
    # The later steps' gradients agree too, a little less closely: they also carry the few weights the
    # earlier steps put ~lr apart (below) ...
    names = [name for name, _ in model.named_parameters()]
    for t, (ours, ref) in enumerate(zip(seen, stepped, strict=True)):
        for name, a, b in zip(names, ours, ref, strict=True):
            torch.testing.assert_close(a, b, atol=(1e-5 if t == 0 else 1e-4) * float(b.abs().max()) + 1e-12,
                                       rtol=1e-5, msg=lambda m, t=t, name=name: f"step {t}: {name}: {m}")
    # ... and the weights are as far apart as AdamW makes those gradients' differences, no further
    # (tests/learner_helpers.py: up to ~2 lr a step where a gradient is itself rounding, as k_proj.bias's
    # is: softmax is shift-invariant), the bulk to 1e-5 of the tensor's scale.
    lr, eps, betas = learner.config.lr, learner.config.adam_eps, learner.config.betas
    for i, ((name, p), q) in enumerate(zip(model.named_parameters(), learner.params, strict=True)):
        p, q = p.detach(), q.detach()
        tol = adamw_steps_tolerance([s[i] for s in stepped], [s[i] for s in seen], p, lr=lr, eps=eps, betas=betas)
        assert bool(((q - p).abs() <= tol).all()), f"{name}: {float(((q - p).abs() - tol).max()):.3g} beyond"
        if not name.endswith("k_proj.bias"):
            assert float((q - p).abs().flatten().quantile(0.99)) <= 1e-5 * float(p.abs().max()), name


def test_no_prefix_pass_where_it_saves_too_little(model_dir, monkeypatch):
    learner = make(model_dir, micro_batch_tokens=10**6)  # default threshold: 64 tokens saved
    calls = []
    forward = type(learner.model).forward
    monkeypatch.setattr(type(learner.model), "forward", lambda self, *a, **kw: calls.append(1) or forward(self, *a, **kw))
    learner.update(grouped_batch(groups=2, k=2, prompt=8))  # (4 - 2) rows x 7 tokens = 14 saved
    assert len(calls) == 1


def test_gradient_checkpointing_gives_the_same_update(model_dir):
    plain, ckpt = make(model_dir), make(model_dir, gradient_checkpointing=True)
    assert getattr(ckpt.model, "is_activation_checkpointing", True)
    m_plain, m_ckpt = plain.update(batch()), ckpt.update(batch())
    assert m_ckpt["main/grad_norm"] == pytest.approx(m_plain["main/grad_norm"], rel=1e-5)
    g_plain = first_step_grads(plain)
    for gp, gc in zip(g_plain, first_step_grads(ckpt), strict=True):  # the recomputed forward: the same gradients
        torch.testing.assert_close(gc, gp, atol=1e-7, rtol=1e-5)
    assert_adamw_first_steps_close(plain, ckpt, g_plain, grad_atol=1e-7, grad_rtol=1e-5)


def test_micro_batches_respect_the_token_budget(model_dir):
    learner = make(model_dir, micro_batch_tokens=100)
    lengths = [30, 120, 10, 50, 50, 20, 99]
    seqs = [TokenSequence([1] * n, [1] * n, advantage=0.0) for n in lengths]
    groups = learner._micro_batches(seqs)
    assert sorted(i for g in groups for i in g) == list(range(len(seqs)))
    for g in groups:
        longest = max(lengths[i] for i in g)
        assert longest * len(g) <= 100 or len(g) == 1  # the 120-token sample runs alone
    assert [1] in groups


def test_samples_with_nothing_sampled_change_nothing(model_dir):
    seqs = batch()
    junk = [
        TokenSequence(s.input_ids[::-1], [1] + [0] * (s.num_tokens - 1), advantage=50.0)
        for s in batch(seed=9)
    ]
    plain, padded = make(model_dir), make(model_dir)
    m_plain = plain.update(seqs)
    m_padded = padded.update(junk[:3] + seqs + junk[3:])
    for name, p in params(plain).items():
        assert torch.equal(p, padded.model.get_parameter(name)), name
    assert m_padded["main/samples"] == 8 and m_padded["main/masked_samples"] == 8
    assert m_padded["main/loss"] == m_plain["main/loss"]


@pytest.mark.parametrize("count", [0, 2])
def test_empty_or_all_masked_batch_skips_the_step(model_dir, count):
    learner = make(model_dir)
    start = params(learner)
    seqs = [TokenSequence(s.input_ids, [0] * s.num_tokens, s.advantage) for s in batch()[:count]]
    metrics = learner.update(seqs)
    assert metrics["main/skipped"] == 1 and metrics["main/optimizer_steps"] == 0
    assert metrics["main/masked_samples"] == count
    assert learner.step == 0 and not learner.optimizer.state
    assert all(torch.equal(p, start[n]) for n, p in learner.model.named_parameters())


def test_masked_tokens_get_no_gradient(model_dir):
    """Tokens with loss_mask 0 after the last sampled one (a tool response) cannot move anything:
    replacing them leaves the update unchanged. Their predictions are not trained."""
    seqs = batch(n=4)
    tail = 5
    with_tail = [TokenSequence(s.input_ids + [7] * tail, s.loss_mask + [0] * tail, s.advantage) for s in seqs]
    other_tail = [
        TokenSequence(s.input_ids + [99, 3, 64, 1, 0], s.loss_mask + [0] * tail, s.advantage) for s in seqs
    ]
    a, b = make(model_dir), make(model_dir)
    a.update(with_tail)
    b.update(other_tail)
    for name, p in params(a).items():
        torch.testing.assert_close(b.model.get_parameter(name), p, atol=1e-7, rtol=0)

    # And directly: the loss's gradient w.r.t. logp is zero wherever the (shifted) mask is zero.
    learner = make(model_dir)
    mb = learner._collate(with_tail)
    logp, _ = learner._forward(mb)
    logp.retain_grad()
    loss, _ = clipped_pg_loss(logp, logp.detach(), mb.advantages, mb.loss_mask)
    loss.backward()
    assert (logp.grad[mb.loss_mask == 0] == 0).all() and (logp.grad[mb.loss_mask == 1] != 0).any()


def test_more_epochs_and_minibatches_go_off_policy(model_dir):
    learner = make(model_dir, ppo_epochs=3, minibatches=2, lr=3e-3)
    metrics = learner.update(batch())
    assert metrics["main/optimizer_steps"] == 6
    assert metrics["main/approx_kl"] > 0 and metrics["main/clipfrac"] > 0


def test_resume_matches_an_uninterrupted_run(model_dir, tmp_path):
    overrides = {"ppo_epochs": 2, "minibatches": 2, "micro_batch_tokens": 80, "seed": 3}
    first, second = batch(seed=1), batch(seed=2)

    straight = make(model_dir, **overrides)
    straight.update(first)
    straight.save(tmp_path / "ckpt")
    rng_after_save = torch.rand(3)
    straight.update(second)

    resumed = RoleLearner.load(tmp_path / "ckpt")
    assert resumed.step == 1 and resumed.config == straight.config and resumed.role == "main"
    assert torch.equal(torch.rand(3), rng_after_save)  # global RNG states restored
    resumed.update(second)
    for name, p in params(straight).items():
        assert torch.equal(resumed.model.get_parameter(name), p), name

    # resume() copies into the existing model object (a rollout policy may hold it).
    in_place = make(model_dir, **overrides)
    model = in_place.model
    in_place.resume(tmp_path / "ckpt")
    in_place.update(second)
    assert in_place.model is model
    for name, p in params(straight).items():
        assert torch.equal(model.get_parameter(name), p), name


def test_save_replaces_a_checkpoint_atomically(model_dir, tmp_path):
    learner = make(model_dir)
    learner.save(tmp_path / "ckpt")
    learner.update(batch())
    learner.save(tmp_path / "ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary left behind
    assert RoleLearner.load(tmp_path / "ckpt").step == 1


def test_kl_to_reference_is_logged_and_checkpointed(model_dir, tmp_path):
    learner = make(model_dir, kl_coef=0.1, ppo_epochs=2)
    metrics = learner.update(batch())
    assert metrics["main/kl_ref"] > 0
    learner.save(tmp_path / "ckpt")
    loaded = RoleLearner.load(tmp_path / "ckpt")
    for (_, p), (_, q) in zip(
        loaded.ref_model.named_parameters(), make(model_dir).model.named_parameters(), strict=True
    ):
        assert torch.equal(p, q)  # the reference is the initial model, not the trained one


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lr", 0.0),
        ("weight_decay", -0.1),
        ("betas", (0.9, 1.0)),
        ("adam_eps", 0.0),
        ("max_grad_norm", 0.0),
        ("eps_low", 1.0),
        ("eps_high", -0.1),
        ("aggregation", "mean"),
        ("kl_coef", -1.0),
        ("entropy_coef", -1.0),
        ("micro_batch_tokens", 0),
        ("ppo_epochs", 0),
        ("minibatches", 1.5),
        ("seed", -1),
        ("dtype", "float64"),
        ("device", "gpu"),
        ("temperature", 0.0),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        LearnerConfig(**{field: value})


def test_config_cross_field_checks():
    with pytest.raises(ValueError, match="compute_entropy"):
        LearnerConfig(entropy_coef=0.01, compute_entropy=False)
    assert LearnerConfig(betas=[0.9, 0.99]).betas == (0.9, 0.99)  # YAML lists become tuples


def test_a_role_learner_scores_at_its_rollout_temperature():
    from mgrpo_algo.core.config import GenerationConfig, RoleConfig

    assert RoleConfig(generation=GenerationConfig(temperature=1.5)).learner.temperature == 1.5
    assert RoleConfig(generation=GenerationConfig(temperature=0.0)).learner.temperature == 1.0  # greedy: no ratio
