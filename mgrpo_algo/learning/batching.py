"""The learner's batching helpers: how samples are packed into micro-batches, and the padded tensors.

Kept apart from :mod:`mgrpo_algo.learning.learner` (the update itself); nothing here touches a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.sequences import TokenSequence


@dataclass
class MicroBatch:
    """Right-padded tensors for B samples of padded length L (targets are shifted: [B, L-1])."""

    input_ids: Tensor  # [B, L]
    attention_mask: Tensor  # [B, L]
    targets: Tensor  # [B, L-1], token t+1 for position t
    loss_mask: Tensor  # [B, L-1] float, loss_mask of the target token
    advantages: Tensor  # [B], or [B, L-1] when a sample carries per-token advantages (step-level credit)
    weights: Tensor  # [B]
    old_logp: Tensor | None  # [B, L-1]
    ref_logp: Tensor | None  # [B, L-1]


def prompt_key(sample: TokenSequence) -> tuple[int, ...]:
    """The tokens before the position that predicts the sample's first trained token: what the K
    rollouts of one question share, and what ``LearnerConfig.share_prefix`` runs once."""
    mask = sample.loss_mask
    first = next((t for t in range(1, len(mask)) if mask[t]), len(mask))  # the first trained token
    return tuple(sample.input_ids[: first - 1])


def pack_micro_batches(samples: Sequence[TokenSequence], budget: int, *, by_prompt: bool = False) -> list[list[int]]:
    """Indices grouped so that (longest length x count) <= ``budget``; a longer sample runs alone.

    Samples go longest first (low padding). With ``by_prompt`` the samples of one prompt
    (:func:`prompt_key`) stay next to each other, prompts ordered by their longest sample: a
    micro-batch then holds few distinct prompts, so the shared-prefix pass runs each prompt about
    once instead of once per micro-batch it is scattered over (the minibatch order is shuffled)."""
    if by_prompt:
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(samples):
            groups.setdefault(prompt_key(s), []).append(i)
        members = [sorted(g, key=lambda i: -samples[i].num_tokens) for g in groups.values()]
        members.sort(key=lambda g: -samples[g[0]].num_tokens)
        order = [i for g in members for i in g]
    else:
        order = sorted(range(len(samples)), key=lambda i: -samples[i].num_tokens)
    out: list[list[int]] = []
    longest = 0
    for i in order:
        n = samples[i].num_tokens
        if out and max(longest, n) * (len(out[-1]) + 1) <= budget:  # by_prompt: a later sample may be longer
            out[-1].append(i)
            longest = max(longest, n)
        else:
            out.append([i])
            longest = n
    return out


def advantages(samples: Sequence[TokenSequence], length: int, device: torch.device) -> Tensor:
    """[B] advantages, or [B, length - 1] (shifted like the targets) when a sample carries per-token ones."""
    if all(s.token_advantages is None for s in samples):
        return torch.tensor([float(s.advantage) for s in samples], dtype=torch.float32, device=device)
    out = torch.zeros((len(samples), length), dtype=torch.float32)
    for row, s in enumerate(samples):
        values = s.token_advantages if s.token_advantages is not None else [float(s.advantage)] * s.num_tokens
        out[row, : s.num_tokens] = torch.as_tensor(values, dtype=torch.float32)
    return out[:, 1:].to(device)  # position t predicts token t + 1


def scatter_columns(values: Tensor, columns: Tensor, length: int) -> Tensor:
    """[B, len(columns)] values placed at ``columns`` of a [B, length] zero tensor (differentiable)."""
    out = values.new_zeros(values.shape[0], length)
    return out.index_copy(1, columns, values)
