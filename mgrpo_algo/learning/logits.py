"""Log-probabilities of the sampled tokens (and the entropy) from the learner's logits.

The [N, V] vocabulary-wide tensors are the largest of a small model's update. :func:`target_logprobs`
makes one log-softmax, one exp and, in the backward, one in-place pass over them: autograd's
log_softmax + gather would add a zero-filled [N, V] gradient for the gather and a second exp in
log_softmax's backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class _TargetLogProbs(torch.autograd.Function):
    """``log softmax(logits)[target]`` with d/dlogits = (onehot(target) - softmax) * grad, the
    softmax kept from the forward and turned into the gradient in place."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, want_entropy: bool) -> tuple[Tensor, Tensor | None]:
        log_probs = torch.log_softmax(logits, -1)
        logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        probs = log_probs.exp()
        ent = None
        if want_entropy:  # a metric here (no gradient): -sum p log p as a dot product, no [N, V] temporary
            ent = -torch.linalg.vecdot(probs, log_probs)
            ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(probs, targets)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, grad: Tensor, _grad_ent: Tensor | None) -> tuple[Tensor, None, None]:
        # Modifying the saved softmax in place: a second backward through it fails autograd's
        # version check (it cannot silently reuse a gradient).
        probs, targets = ctx.saved_tensors
        g = grad.unsqueeze(-1)
        out = probs.mul_(-g).scatter_add_(-1, targets.unsqueeze(-1), g)
        return out, None, None


def target_logprobs(logits: Tensor, targets: Tensor, *, entropy: bool = False,
                    entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """``(log p(targets), entropy or None)`` over the last axis of ``logits`` [..., V] (targets [...]).

    With a gradient to take and no gradient through the entropy, the fused function above; else
    plain ops (no-grad scoring needs no softmax kept; ``entropy_grad`` backpropagates the entropy)."""
    if logits.requires_grad and torch.is_grad_enabled() and not entropy_grad:
        return _TargetLogProbs.apply(logits, targets, entropy)
    log_probs = torch.log_softmax(logits, -1)
    logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent = None
    if entropy:
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
            held = log_probs if entropy_grad else log_probs.detach()
            ent = -(held.exp() * held).sum(-1)
    return logp, ent
