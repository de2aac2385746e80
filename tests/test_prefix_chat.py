"""The learner's shared prefix on rows built as a chat template builds them (issue 34, point 1).

ChatML rows differ at the question and agree again on the template's own tokens (``<|im_end|>\\n
<|im_start|>assistant\\n``) before the first sampled token. A prefix planned over such rows must cover,
for every row, that row's own tokens: a plan that counts agreeing columns instead of the leading run
of them makes rows read another row's question. These tests pin the plan by hand on such rows, and
compare the shared-prefix update with the plain one (log-probs, gradients, parameters after three
steps) on chats from the project's ChatML template, several prompts per micro-batch, prompts spanning
micro-batches.
"""

from __future__ import annotations

import random

import pytest
import torch
from learner_helpers import adamw_steps_tolerance, padded_logprobs, padded_loss_mask, record_steps

from mgrpo_algo.core.config import LearnerConfig
from mgrpo_algo.core.sequences import TokenSequence
from mgrpo_algo.learning import learner as learner_module
from mgrpo_algo.learning.learner import RoleLearner
from mgrpo_algo.learning.prefix import plan_prefix

# ------------------------------------------------------------------------- the plan, by hand

# Template token ids, as ChatML lays them out: <|im_start|>system\n S S S S <|im_end|>\n
# <|im_start|>user\n Q Q Q <|im_end|>\n <|im_start|>assistant\n, then the sampled completion.
START, END, NL, SYSTEM, USER, ASSISTANT = 1, 2, 3, 4, 5, 6


def hand_row(question: list[int], completion: list[int]) -> list[int]:
    return [START, SYSTEM, NL, 10, 11, 12, 13, END, NL, START, USER, NL, *question, END, NL, START, ASSISTANT, NL,
            *completion]


def hand_batch(questions: list[list[int]], completions: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [B, L], columns)`` as the learner plans them: the columns whose logits a loss needs
    (position t predicts token t + 1, so the first completion token at position p is column p - 1)."""
    rows = [hand_row(q, c) for q, c in zip(questions, completions, strict=True)]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    first = min(len(hand_row(q, [])) for q in questions)  # position of the first sampled token
    return ids, torch.arange(first - 1, width - 1)


def assert_rows_read_their_own_tokens(ids: torch.Tensor, plan: tuple[int, torch.Tensor, torch.Tensor]) -> None:
    length, prefixes, rows = plan
    assert torch.equal(prefixes[rows], ids[:, :length])


def test_the_plan_stops_where_rows_first_differ_even_when_they_agree_again() -> None:
    # Four questions of three tokens that differ in their first token only ("district 4" / "district 7"):
    # rows agree on columns 0-11, differ at 12, agree again on 13-18 (the question's tail and the
    # assistant header); the first sampled token is at position 20, so column 19 is the first that
    # needs logits and columns 0-18 (19 tokens) can be shared.
    questions = [[40 + g, 30, 31] for g in range(4)]
    ids, columns = hand_batch(questions, [[50, 51, 52]] * 4)
    assert int(columns[0]) == 19
    # One rollout per question: no whole prompt repeats (saves (4 - 4) x 19 = 0); the leading run
    # common to all rows is 12 tokens (saves (4 - 1) x 12 = 36). Counting every agreeing column
    # would give 18 and make rows 1-3 read row 0's question token.
    plan = plan_prefix(ids, columns, min_tokens=1)
    assert plan is not None
    length, prefixes, rows = plan
    assert length == 12 and prefixes.shape == (1, 12) and rows.tolist() == [0, 0, 0, 0]
    assert_rows_read_their_own_tokens(ids, plan)
    # 36 tokens saved: a threshold of 37 turns the pass off, 36 keeps it.
    assert plan_prefix(ids, columns, min_tokens=37) is None
    assert plan_prefix(ids, columns, min_tokens=36) is not None


def test_the_plan_takes_whole_prompts_when_they_repeat_and_maps_each_row_to_its_own() -> None:
    # Two questions x two rollouts, rows interleaved: the whole 19-token prompts save (4 - 2) x 19 = 38,
    # the common run (4 - 1) x 12 = 36: whole prompts win, each row mapped to its own question's.
    questions = [[41, 30, 31], [42, 30, 31], [41, 30, 31], [42, 30, 31]]
    ids, columns = hand_batch(questions, [[50, 51], [52, 53, 54], [55], [56, 57]])
    plan = plan_prefix(ids, columns, min_tokens=1)
    assert plan is not None
    length, prefixes, rows = plan
    assert length == 19 and prefixes.shape == (2, 19)
    assert rows[0] == rows[2] != rows[1] == rows[3]
    assert_rows_read_their_own_tokens(ids, plan)
    # A third question of one more token moves the header of its row one column right: its first
    # sampled token is at 21, the others' at 20, so column 19 still leads. Its 19 leading tokens
    # differ from every other row's (the question at 12, then the header one column later), so the
    # whole prompts save (5 - 3) x 19 = 38 and the common run (5 - 1) x 12 = 48: the common run wins.
    questions.append([43, 30, 31, 32])
    ids, columns = hand_batch(questions, [[50, 51], [52, 53, 54], [55], [56, 57], [58]])
    assert int(columns[0]) == 19
    plan = plan_prefix(ids, columns, min_tokens=1)
    assert plan is not None and plan[0] == 12 and plan[2].tolist() == [0] * 5
    assert_rows_read_their_own_tokens(ids, plan)


def test_the_plan_needs_two_rows_a_column_that_needs_logits_and_a_token_before_it() -> None:
    ids = torch.tensor([[7, 8, 9, 1], [7, 8, 9, 2]])
    # two rows of one prompt, the first trained column 3: (2 - 1) x 3 = 3 tokens saved, whole prompts win
    plan = plan_prefix(ids, torch.tensor([3]), min_tokens=1)
    assert plan is not None and plan[0] == 3 and plan[1].tolist() == [[7, 8, 9]] and plan[2].tolist() == [0, 0]
    assert plan_prefix(ids, torch.tensor([], dtype=torch.long), min_tokens=0) is None  # no logits needed
    assert plan_prefix(ids[:1], torch.tensor([3]), min_tokens=0) is None  # one row shares with nothing
    assert plan_prefix(ids, torch.tensor([0, 1]), min_tokens=0) is None  # no token before the first column
    # a single token before the first column is a prefix of length 1 when enough rows share it
    five = torch.tensor([[7, r, r + 1] for r in range(5)])
    plan = plan_prefix(five, torch.tensor([1, 2]), min_tokens=4)
    assert plan is not None and plan[0] == 1 and plan[1].tolist() == [[7]] and plan[2].tolist() == [0] * 5


def test_prefix_passes_map_each_row_to_its_own_prefix_across_micro_batches(chat_model_dir) -> None:
    """run_prefixes runs one forward per prefix length over the union of the plans' prefixes: each row of
    each micro-batch reads the keys and values of its own prefix (a plan with more distinct prefixes
    than tokens in them included), equal to a forward of that prefix alone."""
    from transformers import AutoModelForCausalLM, DynamicCache

    from mgrpo_algo.learning.prefix import run_prefixes

    model = AutoModelForCausalLM.from_pretrained(chat_model_dir).eval()
    a, b, c, d = [20, 21], [20, 22], [23, 21], [24, 25]
    plans = [  # two micro-batches with prefixes of length 2 (three and two distinct, sharing [20, 22]), one of 3
        (2, torch.tensor([a, b, c]), torch.tensor([2, 0, 1, 0])),
        (2, torch.tensor([d, b]), torch.tensor([1, 0, 0])),
        None,
        (3, torch.tensor([[20, 21, 26]]), torch.tensor([0, 0])),
    ]
    heads: list[tuple[int, ...]] = []  # the LM head runs on one position per prefix: no logits it would drop
    hook = model.lm_head.register_forward_hook(lambda module, args, output: heads.append(tuple(output.shape)))
    out = run_prefixes(model, plans)
    hook.remove()
    assert heads == [(4, 1, model.config.vocab_size), (1, 1, model.config.vocab_size)]
    assert out[2] is None
    want = {0: [c, a, b, a], 1: [b, d, d], 3: [[20, 21, 26]] * 2}
    for j, rows in want.items():
        prefix, index = out[j]
        assert prefix.length == len(rows[0]) and index.shape == (len(rows),)
        for row, at in zip(rows, index.tolist(), strict=True):
            alone = DynamicCache(config=model.config)
            with torch.no_grad():
                model(input_ids=torch.tensor([row]), use_cache=True, cache=alone)
            torch.testing.assert_close(prefix.leaves[0][at], alone.layers[0].keys[0], atol=1e-6, rtol=0)
            torch.testing.assert_close(prefix.leaves[-1][at], alone.layers[-1].values[0], atol=1e-6, rtol=0)
    assert out[0][0] is out[1][0] and out[0][0].leaves[0].shape[0] == 4  # one pass, [20, 22] once


# ------------------------------------------------------------------------- the update, on ChatML chats

MAIN_PROMPT = ("You are the main agent. Answer the question; search the archive, visit pages and "
               "delegate a hop to a sub-agent when it helps. Write the answer inside answer tags.")
SUB_PROMPT = "You are a sub-agent: search and visit pages."
QUESTIONS = (  # the first four differ in digits only (one token each): their headers line up, and
    # their rows agree again after each differing digit
    "Which river crosses district 4 of Ostrava Nova in 1877?",
    "Which river crosses district 7 of Ostrava Nova in 1912?",
    "Which river crosses district 2 of Ostrava Nova in 1877?",
    "Which river crosses district 9 of Ostrava Nova in 1650?",
    "Who founded the archive of Velmora, and in which year?",
)
WORDS = ("river", "Lenta", "archive", "Velmora", "search", "visit", "page", "founded", "year", "district",
         "crosses", "north", "south", "harbour", "opened")
CORPUS = [MAIN_PROMPT, SUB_PROMPT, *QUESTIONS, " ".join(WORDS),
          '<think>search first</think><tool_call>{"name": "search", "arguments": {"queries": ["x"]}}</tool_call>',
          "<tool_response>The river Lenta crosses Ostrava Nova from north to south.</tool_response>",
          "<answer>Lenta</answer> 0 1 2 3 4 5 6 7 8 9"]


@pytest.fixture(scope="module")
def chat_tokenizer():
    from mgrpo_algo.policies.models import train_tokenizer

    return train_tokenizer(CORPUS * 3, None, vocab_size=300, min_frequency=1)


@pytest.fixture(scope="module")
def chat_model_dir(chat_tokenizer, tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(chat_tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-chat-qwen2")
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def chat_rows(tokenizer, k: int = 3, seed: int = 8, system: str = MAIN_PROMPT,
              questions: tuple[str, ...] = QUESTIONS) -> list[TokenSequence]:
    """``k`` rollouts of each question as the env builds them: the chat template's prompt (system,
    user, generation prompt; not trained), an assistant turn (trained), for some rollouts a tool
    response in the template's user turn (not trained) and a second assistant turn; shuffled.
    ``meta["prompt"]`` is the question's index in :data:`QUESTIONS`."""
    rng = random.Random(seed)
    out = []
    for question in questions:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        prompt = _encode(tokenizer, tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
        for _ in range(k):
            ids, mask = list(prompt), [0] * len(prompt)
            for turn in range(1 + (rng.random() < 0.5)):
                if turn:  # the tool's reply in the template's user turn, then the next generation prompt
                    reply = _encode(tokenizer, "\n<|im_start|>user\n<tool_response>"
                                    f"{' '.join(rng.choices(WORDS, k=rng.randint(3, 8)))}</tool_response>"
                                    "<|im_end|>\n<|im_start|>assistant\n")
                    ids, mask = ids + reply, mask + [0] * len(reply)
                sampled = _encode(tokenizer, f"<think>{' '.join(rng.choices(WORDS, k=rng.randint(2, 9)))}</think>"
                                  f"<answer>{rng.choice(WORDS)}</answer><|im_end|>")
                ids, mask = ids + sampled, mask + [1] * len(sampled)
            out.append(TokenSequence(ids, mask, advantage=rng.choice([-1.0, 0.5, 1.0]), role="main",
                                     meta={"prompt": QUESTIONS.index(question)}))
    rng.shuffle(out)
    return out


def make(model_dir, **overrides) -> RoleLearner:
    """A fresh learner on the saved tiny model, 1,200 padded tokens a micro-batch."""
    return RoleLearner("main", model_dir, LearnerConfig(**{"lr": 1e-3, "micro_batch_tokens": 1200,
                                                           "share_prefix_min_tokens": 1, **overrides}))


# Two batches, as two roles build them. Main agents: 5 questions x 3 rollouts under a long system
# prompt, 4 micro-batches of 3 to 5 rows from 2 to 4 questions: every plan is the common run (the
# system prompt outweighs the questions). Sub-agents: 3 questions x 8 rollouts under a short one, 4
# micro-batches: one common run, then whole prompts in three micro-batches that share questions (one
# prefix pass serves them all, deduplicated across micro-batches).
CASES = {
    "main agents, common run": dict(k=3, seed=8, system=MAIN_PROMPT, questions=QUESTIONS),
    "sub-agents, whole prompts": dict(k=8, seed=2, system=SUB_PROMPT, questions=(QUESTIONS[0], QUESTIONS[1], QUESTIONS[4])),
}
PLANS = {  # (length, distinct prefixes) of each micro-batch's plan
    "main agents, common run": [(152, 1), (152, 1), (152, 1), (140, 1)],
    "sub-agents, whole prompts": [(47, 1), (87, 2), (87, 3), (87, 2)],
}
case = pytest.mark.parametrize("name", list(CASES))


@case
def test_the_chats_are_what_these_tests_need(chat_tokenizer, chat_model_dir, name) -> None:
    """Rows differ at the question and agree again before the first sampled token; micro-batches hold
    several prompts; prompts span micro-batches; the plans are the ones each case is for."""
    seqs, learner = chat_rows(chat_tokenizer, **CASES[name]), make(chat_model_dir)
    groups = learner._micro_batches(seqs)
    prompts = [{seqs[i].meta["prompt"] for i in g} for g in groups]
    assert len(groups) == 4 and all(len(p) >= 2 for p in prompts)
    assert any(sum(q in p for p in prompts) >= 2 for q in range(len(QUESTIONS)))
    reagree, plans = 0, []
    for g in groups:
        batch = learner._collate([seqs[i] for i in g])
        columns, ids, _ = learner._columns(batch)
        first = int(columns[0])
        agree = (ids[:, :first] == ids[:1, :first]).all(0)
        split = int(agree.int().cumprod(0).sum())  # the first column where rows differ
        reagree += bool(split < first and agree[split:].any())
        plan = plan_prefix(ids, columns, 1)
        assert plan is not None
        assert_rows_read_their_own_tokens(ids, plan)
        plans.append((plan[0], plan[1].shape[0]))
    assert reagree >= 1 and plans == PLANS[name]


def assert_shared_log_probs_are_plain(learner: RoleLearner, seqs: list[TokenSequence]) -> None:
    """Every micro-batch reads a prefix, and its trained positions get the plain forward's numbers."""
    batches = [learner._collate([seqs[i] for i in g]) for g in learner._micro_batches(seqs)]
    with torch.no_grad():
        prefixes = learner._prefix_passes(batches)
        assert all(p is not None for p in prefixes)
        for batch, prefix in zip(batches, prefixes, strict=True):
            shared, _ = learner._forward(batch, loss_positions_only=True, prefix=prefix)
            plain, _ = learner._forward(batch)
            mask = batch.loss_mask.bool()
            # Only trained positions are computed on the shared path; there they are the plain numbers.
            torch.testing.assert_close(shared[mask], plain[mask], atol=2e-5, rtol=0)


@case
def test_shared_prefix_log_probs_are_the_plain_ones_on_chat_rows(chat_tokenizer, chat_model_dir, name) -> None:
    assert_shared_log_probs_are_plain(make(chat_model_dir), chat_rows(chat_tokenizer, **CASES[name]))


@pytest.mark.parametrize("window", [4, 16])
def test_shared_prefix_log_probs_are_the_plain_ones_under_a_sliding_window(chat_tokenizer, tmp_path, window) -> None:
    """A model with a sliding-window layer (Qwen2's ``use_sliding_window``; Mistral-like): the prefix's
    cache is built from the model's config (a sliding layer beside a full one), the remaining tokens'
    mask cuts at the window, and the trained positions get the plain numbers. Windows far shorter
    than the 47-152-token prefixes, so every trained position attends across the cut."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(chat_tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True,
                         use_sliding_window=True, sliding_window=window, max_window_layers=1)
    assert config.layer_types == ["full_attention", "sliding_attention"]
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    for name in CASES:
        assert_shared_log_probs_are_plain(make(tmp_path), chat_rows(chat_tokenizer, **CASES[name]))


@case
def test_shared_prefix_update_is_the_plain_update_on_chat_rows(chat_tokenizer, chat_model_dir, monkeypatch,
                                                               name) -> None:
    seqs = chat_rows(chat_tokenizer, **CASES[name])
    plain, shared = make(chat_model_dir, share_prefix=False), make(chat_model_dir)
    passes: list[int] = []
    run = learner_module.run_prefixes

    def counted(model, plans):
        passes.append(sum(p is not None for p in plans))
        return run(model, plans)

    monkeypatch.setattr(learner_module, "run_prefixes", counted)
    seen_plain, seen_shared = record_steps(plain), record_steps(shared)
    steps = []
    for step in range(3):
        m_plain, m_shared = plain.update(seqs), shared.update(seqs)
        steps.append((m_plain, m_shared))
        if step == 0:  # exp_avg = (1 - beta1) x the first step's clipped gradient
            for pw, ps in zip(plain.params, shared.params, strict=True):
                gw, gs = plain.optimizer.state[pw]["exp_avg"], shared.optimizer.state[ps]["exp_avg"]
                torch.testing.assert_close(gs, gw, atol=1e-5 * float(gw.abs().max()) + 1e-12, rtol=1e-4)
    assert passes == [4, 4, 4]  # every micro-batch of every step read a prefix
    for m_plain, m_shared in steps:
        assert m_shared["main/micro_batches"] == m_plain["main/micro_batches"] == 4
        for key in ("loss", "pg_loss", "entropy", "grad_norm"):
            assert m_shared[f"main/{key}"] == pytest.approx(m_plain[f"main/{key}"], rel=1e-4, abs=1e-6), key
    # After three steps the models give the same log-probs and hold the same parameters.
    mask = padded_loss_mask(seqs).bool()
    lp_plain, lp_shared = padded_logprobs(plain, seqs), padded_logprobs(shared, seqs)
    torch.testing.assert_close(lp_shared[mask], lp_plain[mask], atol=1e-4, rtol=0)
    # The later steps' gradients agree a little less closely: they also carry the few weights the earlier
    # steps put ~lr apart (below).
    names = [name for name, _ in plain.model.named_parameters()]
    for t, (a_step, b_step) in enumerate(zip(seen_plain, seen_shared, strict=True)):
        for name, a, b in zip(names, a_step, b_step, strict=True):
            torch.testing.assert_close(b, a, atol=1e-4 * float(a.abs().max()) + 1e-12, rtol=1e-4,
                                       msg=lambda m, t=t, name=name: f"step {t}: {name}: {m}")
    # The weights: as far apart as AdamW makes the two runs' gradient differences, no further
    # (learner_helpers.adamw_steps_tolerance: up to ~2 lr a step where a gradient is itself rounding, as
    # k_proj.bias's is: softmax is shift-invariant); the bulk to a sliver of lr.
    lr, eps, betas = plain.config.lr, plain.config.adam_eps, plain.config.betas
    for i, ((name, p), q) in enumerate(zip(plain.model.named_parameters(), shared.params, strict=True)):
        p, q = p.detach(), q.detach()
        tol = adamw_steps_tolerance([s[i] for s in seen_plain], [s[i] for s in seen_shared], p, lr=lr, eps=eps,
                                    betas=betas)
        assert bool(((q - p).abs() <= tol).all()), f"{name}: {float(((q - p).abs() - tol).max()):.3g} beyond"
        if not name.endswith("k_proj.bias"):
            assert float((q - p).abs().flatten().quantile(0.99)) <= 1e-3 * lr, name
