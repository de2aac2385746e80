"""Step-level credit (GiGPO): anchor states, per-turn advantages by hand, per-token advantages in the
sequence and in the learner's loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scoring_reference import score_batch

from mgrpo_algo.core.advantages import step_advantages
from mgrpo_algo.core.scoring import turn_states
from mgrpo_algo.core.sequences import TokenSequence, slot_sequence, turn_spans
from mgrpo_env.episode import AgentTrajectory, EpisodeRecord, Turn

R2 = math.sqrt(2.0)


def test_step_advantages_by_hand() -> None:
    # anchor a: returns 1, 0, 1 -> mean 2/3, population std sqrt(2)/3 -> (1/3)/(sqrt2/3) = 1/sqrt2, -2/sqrt2
    out = step_advantages(["a", "a", "b", "a", "c", "c"], [1.0, 0.0, 1.0, 1.0, 0.5, 0.5])
    assert out == pytest.approx([1 / R2, -R2, 0.0, 1 / R2, 0.0, 0.0])  # b alone, c without spread: 0
    with pytest.raises(ValueError):
        step_advantages(["a"], [1.0, 2.0])


def _main(turn_texts: list[str], observations: list[str]) -> AgentTrajectory:
    """A main trajectory whose chat is system, question, then (assistant turn, observation) pairs."""
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Q"}]
    turns = []
    for i, (text, obs) in enumerate(zip(turn_texts, observations, strict=True)):
        messages.append({"role": "assistant", "content": text})
        turns.append(Turn(action=text, kind="tool_call", extra={"i": i}))
        if obs:
            messages.append({"role": "user", "content": obs})
    return AgentTrajectory(agent="main_0", role="main", messages=messages, turns=turns, format_ok=True)


def test_turn_states_share_a_key_only_for_the_same_history() -> None:
    a = _main(["d1", "ans"], ["report X", ""])
    b = _main(["d1", "ans"], ["report Y", ""])
    sa, sb = turn_states(a), turn_states(b)
    assert sa[0] == sb[0]  # both first turns read system + question
    assert sa[1] != sb[1]  # the second turns read different reports
    broken = AgentTrajectory(agent="main_0", role="main", messages=a.messages[:2], turns=a.turns)
    assert len(set(turn_states(broken)) & set(sa)) == 0  # misaligned: shares with nothing


def _record(main: AgentTrajectory, reward: float, correct: bool) -> EpisodeRecord:
    return EpisodeRecord(episode_id=f"e{reward}", task={"id": "q"}, main=main, subs=[], correct=correct,
                         rewards={"main_0": reward}, components={"main_0": {"format_ok": True}})


def test_score_batch_step_credit_main_by_hand() -> None:
    """K = 3: every rollout delegates d1 first; two read report X, one report Y; then each answers.

    R_M = 1, 0, 0 (rollout 0 correct). A_M = (R - 1/3) / (sqrt2/3) = sqrt2, -1/sqrt2, -1/sqrt2.
    Turn 0 (shared by all three): step advantage = A_M itself. Turn 1: rollouts 0 and 1 share "report
    X" with returns 1, 0 -> +1, -1; rollout 2's state is its own -> 0. With w = 0.5:
    rollout 0: (sqrt2 + .5 sqrt2, sqrt2 + .5); rollout 1: (-1/sqrt2 - .5/sqrt2, -1/sqrt2 - .5);
    rollout 2: (-1/sqrt2 - .5/sqrt2, -1/sqrt2)."""
    records = [
        _record(_main(["d1", "A"], ["report X", ""]), 1.0, True),
        _record(_main(["d1", "B"], ["report X", ""]), 0.0, False),
        _record(_main(["d1", "B"], ["report Y", ""]), 0.0, False),
    ]
    batch = score_batch(records, 3, 1, strategy="duplicate", rng=np.random.default_rng(0), step_weight=0.5)
    got = [m.turn_advantages for m in batch.main]
    want = [(R2 * 1.5, R2 + 0.5), (-1.5 / R2, -1 / R2 - 0.5), (-1.5 / R2, -1 / R2)]
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w)
    assert [m.advantage for m in batch.main] == pytest.approx([R2, -1 / R2, -1 / R2])  # unchanged
    plain = score_batch(records, 3, 1, strategy="duplicate", rng=np.random.default_rng(0), step_weight=0.0)
    assert all(m.turn_advantages is None for m in plain.main)
    # a process placement pickles the slots: they arrive whole
    import pickle

    assert pickle.loads(pickle.dumps(batch.main))[0].turn_advantages == batch.main[0].turn_advantages


def test_score_batch_step_credit_sub_by_hand() -> None:
    """Sub-agents of one query (K = 2): three with the same subtask, rewards 1, 0, 0.5 at turn 0; their
    second turns read different pages except the first two. Alignment d = 1 duplicates nothing here."""

    def sub(agent: str, page: str, reward: float) -> AgentTrajectory:
        msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "Subtask: T"},
                {"role": "assistant", "content": "search"}, {"role": "user", "content": page},
                {"role": "assistant", "content": "result"}]
        return AgentTrajectory(agent=agent, role="sub", messages=msgs, reward=reward, format_ok=True,
                               turns=[Turn("search", "tool_call"), Turn("result", "result")])

    r0 = _record(_main(["d"], [""]), 1.0, True)
    r0.subs = [sub("sub_0", "P", 1.0)]
    r1 = _record(_main(["d"], [""]), 0.0, False)
    r1.subs = [sub("sub_0", "P", 0.0)]
    r2 = _record(_main(["d"], [""]), 1.0, True)
    r2.subs = [sub("sub_0", "Q", 0.5)]
    r3 = _record(_main(["d"], [""]), 0.0, False)
    r3.subs = [sub("sub_0", "Q", 0.5)]
    batch = score_batch([r0, r1, r2, r3], 4, 1, strategy="duplicate", rng=np.random.default_rng(0), step_weight=1.0)
    # A_S pooled: rewards 1, 0, .5, .5 -> mean .5, std sqrt(.125) -> +-1.414, 0, 0
    s = math.sqrt(0.125)
    a_s = [0.5 / s, -0.5 / s, 0.0, 0.0]
    # turn 0: all four share the state: step = A_S. turn 1: P: (1, 0) -> +1, -1; Q: (.5, .5) -> 0
    want = [(a_s[0] * 2, a_s[0] + 1), (a_s[1] * 2, a_s[1] - 1), (0.0, 0.0), (0.0, 0.0)]
    for slot, w in zip(batch.sub, want, strict=True):
        assert slot.turn_advantages == pytest.approx(w)


def test_slot_sequence_puts_each_turns_advantage_on_its_tokens() -> None:
    turns = [
        {"prompt_ids": [1, 2], "completion_ids": [3, 4], "logprobs": [-0.1, -0.2]},
        {"prompt_ids": [1, 2, 3, 4, 5], "completion_ids": [6], "logprobs": [-0.3]},
    ]
    assert turn_spans(turns) == [(2, 4), (5, 6)]
    seq = slot_sequence(turns, 0.7, "main", turn_advantages=[2.0, -1.0])
    assert seq.input_ids == [1, 2, 3, 4, 5, 6] and seq.loss_mask == [0, 0, 1, 1, 0, 1]
    assert seq.token_advantages == [0.0, 0.0, 2.0, 2.0, 0.0, -1.0]
    assert seq.has_signal
    assert not slot_sequence(turns, 0.7, "main", turn_advantages=[0.0, 0.0]).has_signal
    assert slot_sequence(turns, 0.7, "main").token_advantages is None
    with pytest.raises(ValueError, match="2 turns"):
        slot_sequence(turns, 0.7, "main", turn_advantages=[1.0])
    with pytest.raises(ValueError):
        TokenSequence([1, 2], [0, 1], 0.0, token_advantages=[1.0])


def test_learner_uses_per_token_advantages() -> None:
    """A sequence whose two sampled tokens carry advantages +a and -a moves the two log-probs apart;
    the same sequence with the scalar advantage 0 would not move at all (and is skipped)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mgrpo_algo.core.config import LearnerConfig
    from mgrpo_algo.learning.learner import RoleLearner

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    learner = RoleLearner("main", model, LearnerConfig(lr=1e-2, max_grad_norm=None))
    ids, mask = [1, 5, 7, 2, 9, 3], [0, 1, 0, 0, 1, 0]
    seq = TokenSequence(ids, mask, 0.0, token_advantages=[0, 1.0, 0, 0, -1.0, 0])
    before = learner.logprobs([seq])[0]
    for _ in range(3):
        metrics = learner.update([seq])
    after = learner.logprobs([seq])[0]
    assert metrics["main/zero_adv_skipped"] == 0.0
    assert after[1] > before[1] and after[4] < before[4]
    zero = TokenSequence(ids, mask, 0.0, token_advantages=[0.0] * 6)
    assert learner.update([zero])["main/zero_adv_skipped"] == 1.0


def test_informative_only_drops_samples_without_signal_from_the_normaliser() -> None:
    """Two samples, one with advantage 0: with ``informative_only`` the step is the one on the
    informative sample alone (the normaliser counts 1, not 2), so the change is larger."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mgrpo_algo.core.config import LearnerConfig
    from mgrpo_algo.learning.learner import RoleLearner

    def run(informative_only: bool) -> tuple[float, dict[str, float]]:
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
        # plain SGD-like sizes: one step, no clipping, so the step scales with the normaliser
        learner = RoleLearner("sub", model, LearnerConfig(lr=1e-3, max_grad_norm=None, informative_only=informative_only))
        seqs = [TokenSequence([1, 5, 7, 2], [0, 1, 1, 0], 1.0), TokenSequence([1, 6, 8, 3], [0, 1, 1, 0], 0.0)]
        before = sum(learner.logprobs(seqs[:1])[0])
        metrics = learner.update(seqs)
        return sum(learner.logprobs(seqs[:1])[0]) - before, metrics

    plain, m_plain = run(False)
    dropped, m_drop = run(True)
    assert m_drop["sub/uninformative_dropped"] == 1.0 and m_drop["sub/samples"] == 1.0
    assert "sub/uninformative_dropped" not in m_plain and m_plain["sub/samples"] == 2.0
    assert plain > 0 and dropped > 0
    # AdamW's first step is sign-like, so compare the loss instead: half the normaliser, twice the loss
    assert m_drop["sub/pg_loss"] == pytest.approx(2 * m_plain["sub/pg_loss"], rel=1e-4)
