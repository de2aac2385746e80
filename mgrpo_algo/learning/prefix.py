"""Shared prefixes in the learner (``LearnerConfig.share_prefix``): tokens that samples hold in common
before their first trained position run once, not once per sample.

The K rollouts of a question share its prompt; every agent of a role shares its system prompt. Per
micro-batch, :func:`plan_prefix` picks the prefix rows and how each sample maps to them; per
minibatch, :func:`run_prefixes` runs every micro-batch's prefixes of one length in a single
forward (a prompt that straddles two micro-batches runs once; one call instead of one per
micro-batch). Its keys and values become leaf tensors that each micro-batch's rows read
(:meth:`PrefixPass.cache`); the micro-batches' backwards leave their gradients on those leaves, and
:meth:`PrefixPass.backward` carries the sum through the prefix forward once, after the last one.
The same gradient as one full forward per sample, up to float rounding (tests/test_learner.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

Plan = tuple[int, Tensor, Tensor]
"""``(length, distinct prefixes [U, length], row -> prefix index [B])``."""


def plan_prefix(ids: Tensor, columns: Tensor, min_tokens: int) -> Plan | None:
    """The rows of ``ids`` [B, L] share tokens before ``columns[0]`` (the first position that needs
    logits), enough (``min_tokens`` not run twice) to be worth a prefix pass: its plan, else None.

    Two ways to share: the rows' first ``columns[0]`` tokens taken whole (the K rollouts of one
    question share their prompt), or the leading tokens common to every row (a system prompt); the
    one that saves more tokens is used."""
    if len(columns) == 0 or ids.shape[0] < 2:
        return None
    rows, first = ids.shape[0], int(columns[0])  # positions before `first` need no logits
    if first < 1:
        return None
    whole, inverse = torch.unique(ids[:, :first], dim=0, return_inverse=True)
    agree = (ids[:, :first] == ids[:1, :first]).all(0)
    common = int(agree.int().cumprod(0).sum())  # the leading run of columns where every row agrees
    by_prompt, by_common = (rows - whole.shape[0]) * first, (rows - 1) * common
    if max(by_prompt, by_common) < min_tokens:
        return None
    if by_prompt >= by_common:
        return first, whole, inverse
    return common, ids[:1, :common], torch.zeros(rows, dtype=torch.long, device=ids.device)


@dataclass
class PrefixPass:
    """One prefix forward: its per-layer keys and values [U, heads, length, dim] (graph outputs)
    and the leaves the micro-batches read in their place."""

    length: int
    outputs: list[Tensor]  # keys of every layer, then values
    leaves: list[Tensor]  # the same, detached, requires_grad: the micro-batches' gradients gather here

    def cache(self, model: torch.nn.Module, rows: Tensor) -> Any:
        """A ``DynamicCache`` holding prefix ``rows[i]`` for row i (``index_select``: the backward sums
        every row's gradient into its prefix)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        layers = len(self.leaves) // 2
        for layer in range(layers):
            keys, values = self.leaves[layer], self.leaves[layers + layer]
            cache.update(keys.index_select(0, rows), values.index_select(0, rows), layer)
        return cache

    def backward(self) -> None:
        """The gradient the micro-batches left on the leaves, through the prefix forward (once)."""
        pairs = [(out, leaf.grad) for out, leaf in zip(self.outputs, self.leaves, strict=True) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])


def run_prefixes(model: torch.nn.Module, plans: list[Plan | None]) -> list[tuple[PrefixPass, Tensor] | None]:
    """For each micro-batch's plan, ``(its prefix pass, row -> prefix index in that pass)`` (None
    where the plan is None): one forward per distinct prefix length over the union of the plans'
    prefixes (deduplicated)."""
    from transformers import DynamicCache

    from ..policies.decode import _cache_kwarg

    out: list[tuple[PrefixPass, Tensor] | None] = [None] * len(plans)
    by_length: dict[int, list[int]] = {}
    for j, plan in enumerate(plans):
        if plan is not None:
            by_length.setdefault(plan[0], []).append(j)
    for length, members in by_length.items():
        joint, remap = torch.unique(torch.cat([plans[j][1] for j in members]), dim=0, return_inverse=True)  # type: ignore[index]
        cache = DynamicCache(config=model.config)
        model(input_ids=joint, use_cache=True, logits_to_keep=1, **{_cache_kwarg(): cache})  # only its keys and values are used
        outputs = [layer.keys for layer in cache.layers] + [layer.values for layer in cache.layers]
        prefix = PrefixPass(length, outputs, [t.detach().requires_grad_(t.requires_grad) for t in outputs])
        offset = 0
        for j in members:
            _, prefixes, inverse = plans[j]  # type: ignore[misc]
            out[j] = (prefix, remap[offset: offset + prefixes.shape[0]][inverse])
            offset += prefixes.shape[0]
    return out


def forward_with_prefix(model: torch.nn.Module, ids: Tensor, keep: Tensor | int, prefix: PrefixPass,
                        rows: Tensor) -> Tensor:
    """Logits at ``keep`` (positions of ``ids``; an int: the last ``keep`` positions) with the first
    ``prefix.length`` tokens read from the prefix pass: each row's remaining tokens run over them."""
    from ..policies.decode import _cache_kwarg

    length = prefix.length
    rest = ids[:, length:]
    positions = torch.arange(length, ids.shape[1], device=ids.device)[None].expand(ids.shape[0], -1)
    return model(input_ids=rest, position_ids=positions, use_cache=True, **{_cache_kwarg(): prefix.cache(model, rows)},
                 logits_to_keep=keep if isinstance(keep, int) else keep - length).logits
