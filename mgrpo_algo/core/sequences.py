"""Token sequences for training, built token-in/token-out from what the policy sampled.

An LLM policy attaches to each turn it writes an ``extra`` dict with

* ``prompt_ids``: the exact token ids it conditioned on for this turn,
* ``completion_ids``: the token ids it sampled,
* ``logprobs``: the log-probability of each sampled id under the sampling distribution.

The next turn's prompt is the previous prompt + its completion + the tokenised tool response, so the
prompts of one agent nest. :func:`trajectory_sequence` turns an agent's turns into one training
sequence - the last prompt plus the last completion - with a loss mask that is 1 exactly on the
sampled positions. Nothing is re-tokenised: the trainer's ids are the sampled ids.

Stored turns may be compact (:func:`mgrpo_env.episode.compact_token_extras`): instead of
``prompt_ids`` a turn holds ``prompt_shared`` (n, the length of the previous turn's prompt +
completion) and ``prompt_new_ids`` (the rest of its prompt). :func:`trajectory_sequence` takes either
form, mixed too, so compact buffers build sequences without being expanded first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TokenSequence", "trajectory_sequence", "turn_spans", "slot_sequence"]


@dataclass
class TokenSequence:
    """One training sample of one role.

    Attributes:
        input_ids: the whole sequence, length T.
        loss_mask: length T, 1 on tokens the policy sampled (the only ones the loss sees), else 0.
        advantage: the sample's advantage (the same for every token, as in GRPO).
        token_advantages: optional, length T: a per-token advantage that replaces ``advantage``
            (step-level credit: each turn's sampled tokens carry that turn's advantage; 0 on
            positions that are not sampled). None: every token has ``advantage``.
        sampled_logprobs: length T, the sampling log-probabilities on sampled positions (0 elsewhere),
            or None. The learner recomputes old log-probabilities itself; these are for diagnostics.
        role: "main", "sub" or "single".
        meta: free-form (episode id, agent name, reward) for logs.
    """

    input_ids: list[int]
    loss_mask: list[int]
    advantage: float
    sampled_logprobs: list[float] | None = None
    role: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    token_advantages: list[float] | None = None

    def __post_init__(self) -> None:
        if len(self.loss_mask) != len(self.input_ids):
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for {len(self.input_ids)} tokens")
        if self.sampled_logprobs is not None and len(self.sampled_logprobs) != len(self.input_ids):
            raise ValueError("sampled_logprobs must have one entry per token")
        if self.token_advantages is not None and len(self.token_advantages) != len(self.input_ids):
            raise ValueError(f"token_advantages has {len(self.token_advantages)} entries for {len(self.input_ids)} tokens")

    @property
    def has_signal(self) -> bool:
        """Whether any sampled token has a non-zero advantage (else its policy gradient is exactly 0)."""
        if self.token_advantages is None:
            return self.advantage != 0
        return any(a != 0 for a, m in zip(self.token_advantages, self.loss_mask, strict=True) if m)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)


def trajectory_sequence(turns: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[int], list[float]]:
    """One agent's turn extras -> (input_ids, loss_mask, sampled_logprobs), all of the same length.

    :func:`turn_spans` gives where each turn's sampled tokens are in it.

    Each turn gives its whole prompt (``prompt_ids``) or the compact form (``prompt_shared`` +
    ``prompt_new_ids``, see the module docstring); both give the same sequence. Turns without
    ``completion_ids`` (e.g. from a scripted policy) are not allowed: a sequence is either fully
    token-tracked or not trainable.

    Raises:
        ValueError: no turns, a turn without ids, or prompts that do not nest (a later prompt does
            not start with the earlier prompt + completion: something re-tokenised).
    """
    ids, mask, logps, _ = _build(turns)
    return ids, mask, logps


def turn_spans(turns: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """``(start, end)`` of each turn's sampled tokens in :func:`trajectory_sequence`'s ids: turn i's
    completion is ``ids[start:end]``, and ``ids[:start]`` is exactly what it was conditioned on."""
    return _build(turns)[3]


def _build(turns: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[int], list[float], list[tuple[int, int]]]:
    if not turns:
        raise ValueError("an agent with no turns has no training sequence")
    ids: list[int] = []
    mask: list[int] = []
    logps: list[float] = []
    spans: list[tuple[int, int]] = []
    for i, turn in enumerate(turns):
        completion = turn.get("completion_ids")
        if "prompt_shared" in turn:
            # Compact: the first ``prompt_shared`` ids are the previous prompt + completion, i.e. all of
            # ``ids`` so far; only the count needs checking (a first turn is never compact).
            if i == 0 or turn["prompt_shared"] != len(ids):
                raise ValueError(f"turn {i} shares {turn['prompt_shared']} prompt ids but {len(ids)} precede it")
            new_context = list(turn.get("prompt_new_ids") or [])
        else:
            prompt = turn.get("prompt_ids")
            if prompt is None or completion is None:
                raise ValueError(f"turn {i} has no prompt_ids/completion_ids: not produced by a token-tracking policy")
            if list(prompt[: len(ids)]) != ids:
                raise ValueError(f"turn {i}'s prompt does not extend the previous turns' tokens (re-tokenised?)")
            new_context = list(prompt[len(ids):])
        if completion is None:
            raise ValueError(f"turn {i} has no completion_ids: not produced by a token-tracking policy")
        ids.extend(new_context)
        mask.extend([0] * len(new_context))
        logps.extend([0.0] * len(new_context))
        sampled = turn.get("logprobs") or [0.0] * len(completion)
        if len(sampled) != len(completion):
            raise ValueError(f"turn {i} has {len(sampled)} logprobs for {len(completion)} sampled tokens")
        spans.append((len(ids), len(ids) + len(completion)))
        ids.extend(completion)
        mask.extend([1] * len(completion))
        logps.extend(float(x) for x in sampled)
    return ids, mask, logps, spans


def slot_sequence(
    turn_extras: Sequence[Mapping[str, Any]], advantage: float, role: str, *,
    turn_advantages: Sequence[float] | None = None, **meta: Any,
) -> TokenSequence:
    """A trajectory's training sample: its sampled ids (nothing re-tokenised) with its advantage.

    ``turn_advantages`` (one per turn, step-level credit): turn i's sampled tokens carry
    ``turn_advantages[i]`` instead of ``advantage``."""
    ids, mask, logps, spans = _build(turn_extras)
    per_token = None
    if turn_advantages is not None:
        if len(turn_advantages) != len(spans):
            raise ValueError(f"{len(turn_advantages)} turn advantages for {len(spans)} turns")
        per_token = [0.0] * len(ids)
        for (start, end), value in zip(spans, turn_advantages, strict=True):
            per_token[start:end] = [float(value)] * (end - start)
    return TokenSequence(ids, mask, advantage, sampled_logprobs=logps, role=role, meta=meta, token_advantages=per_token)
