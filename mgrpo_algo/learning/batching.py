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


def pack_micro_batches(samples: Sequence[TokenSequence], budget: int) -> list[list[int]]:
    """Indices grouped so that (longest length x count) <= ``budget``; longest first.

    Sorting by length keeps padding low; a sample over the budget gets a micro-batch of its own.
    (Samples that share a prompt need not be together: the minibatch's shared prefixes run in one
    pass across micro-batches, see :mod:`mgrpo_algo.learning.prefix`.)
    """
    order = sorted(range(len(samples)), key=lambda i: -samples[i].num_tokens)
    groups: list[list[int]] = []
    for i in order:
        if groups and samples[groups[-1][0]].num_tokens * (len(groups[-1]) + 1) <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


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
