"""Helpers shared by the learner tests: per-sample lists padded into [B, T] tensors."""

from __future__ import annotations

import torch

from mgrpo_algo.core.sequences import TokenSequence
from mgrpo_algo.learning.learner import RoleLearner


def padded_logprobs(learner: RoleLearner, seqs: list[TokenSequence]) -> torch.Tensor:
    """[B, T] log-probs under the learner's current weights, right-padded with 0."""
    rows = learner.logprobs(seqs)
    length = max(len(r) for r in rows)
    return torch.tensor([r + [0.0] * (length - len(r)) for r in rows])


def padded_loss_mask(seqs: list[TokenSequence]) -> torch.Tensor:
    """[B, T] loss mask of the samples, right-padded with 0."""
    length = max(s.num_tokens for s in seqs)
    return torch.tensor([s.loss_mask + [0] * (length - s.num_tokens) for s in seqs], dtype=torch.float32)
