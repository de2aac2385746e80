"""A lean decode loop over the model's forward: the samples of HF ``generate``, without its overhead.

The tiny models of this project cost a few MFLOP per token, so ``generate`` is bound by what it does
around the forward at every step (input preparation, stopping criteria, logits-processor lists,
output bookkeeping). :func:`decode` is the same algorithm written out for the one case
:class:`~mgrpo_algo.policies.hf_policy.TransformersPolicy` needs (a decoder-only model, a
``DynamicCache``, temperature / top-p sampling, one-token stop ids) and feeds the model exactly what
``generate`` feeds it:

- the prefill gets the ids after the cache (``input_ids[:, past:]``), the 2-D attention mask over
  cached + new columns, position ids ``cumsum(mask) - 1`` (0 at padding) and ``logits_to_keep=1``;
- each later step gets the last sampled token, the mask grown by a column of ones and the previous
  position + 1;
- the scores go through the same temperature / top-p processing, the token is drawn with
  ``torch.multinomial(softmax(scores), 1)`` on the whole batch (or ``argmax``), a finished row gets
  the pad id, and the loop stops when every row has sampled a stop id or ``max_new_tokens`` is reached.

With ``step="fast"`` the one-token steps run through
:class:`~mgrpo_algo.policies.fast_step.FastStep` (the model's function up to float rounding, with
fewer and cheaper ops) and the padding mask is kept as one additive float mask for the whole call;
the recorded log-probs are then the model's within ~1e-5 (tests/test_fast_step.py), and the ids are
``generate``'s except where rounding flips a draw.

Otherwise, same inputs in the same order means the same logits and the same random draws, so under one seed
the sampled ids and log-probs equal ``generate``'s (tests/test_decode.py checks them against it on
ragged batches with KV reuse). Stop *strings* (tags of several tokens) are not handled here: the
policy uses ``generate`` for tokenizers that need them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["process_scores", "decode", "reserve", "inverse_cdf", "SAMPLERS", "STEPS"]

SAMPLERS = ("multinomial", "inverse_cdf")
STEPS = ("fast", "lean", "forward")


def _growing_layer_class() -> type:
    """A ``DynamicLayer`` that appends into a preallocated buffer instead of concatenating.

    ``DynamicLayer.update`` copies the whole cache at every step (``torch.cat``): O(length) per token,
    the largest cost of a decode step at 1-3 k cached tokens. This layer writes the new keys and values
    into spare room and hands out views of the filled part: the same values, in the same layout per
    (row, head), with no copy. Room runs out only if more is fed than was reserved; then it doubles.
    """
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        def __init__(self, capacity: int) -> None:
            super().__init__()
            self.capacity = int(capacity)
            self.length = 0
            self._k: torch.Tensor | None = None
            self._v: torch.Tensor | None = None

        def _grow(self, like: torch.Tensor, needed: int) -> None:
            size = max(needed, self.capacity, 2 * (self._k.shape[2] if self._k is not None else 0))
            k = like.new_empty((like.shape[0], like.shape[1], size, like.shape[3]))
            v = torch.empty_like(k)
            if self._k is not None and self.length:
                k[:, :, : self.length] = self._k[:, :, : self.length]
                v[:, :, : self.length] = self._v[:, :, : self.length]
            self._k, self._v = k, v

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if self._k is None or end > self._k.shape[2]:
                self._grow(key_states, end)
            assert self._k is not None and self._v is not None
            self._k[:, :, self.length: end] = key_states
            self._v[:, :, self.length: end] = value_states
            self.length = end
            self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
            return self.keys, self.values

        def keep_rows(self, rows: torch.Tensor) -> None:
            """Keep only the batch rows ``rows`` (a copy of their filled part, room included; the layer
            has been fed: decode compacts after its first step)."""
            self._k, self._v = self._k.index_select(0, rows), self._v.index_select(0, rows)  # type: ignore[union-attr]
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    return GrowingLayer


def reserve(cache: Any, extra: int) -> None:
    """Give every layer of a ``DynamicCache`` room for ``extra`` more positions (in place)."""
    grower = _growing_layer_class()
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, grower):
            continue
        new = grower(layer.get_seq_length() + extra if layer.is_initialized else extra)
        if layer.is_initialized and layer.get_seq_length() > 0:
            new.update(layer.keys, layer.values)
        cache.layers[i] = new


def process_scores(logits: torch.Tensor, temperature: float, top_p: float, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores to sample from, log-probs to record)`` for one step's float32 logits ``[B, V]``.

    Temperature then top-p (nothing else); the log-probs are those of the distribution sampled from
    (``mode="processed"``) or ``log_softmax(logits)`` (``"raw"``). Temperature 0 leaves the logits
    as they are (greedy).
    """

    scores = logits
    raw = torch.log_softmax(scores, dim=-1) if mode == "raw" else None
    if temperature > 0:
        if temperature != 1.0:
            scores = scores / temperature
        if top_p < 1.0:
            scores = _top_p(scores, top_p)
    return scores, raw if raw is not None else torch.log_softmax(scores, dim=-1)


@torch.no_grad()
def decode(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache: Any, *,
           max_new_tokens: int, stop_ids: Sequence[int], pad_id: int, temperature: float, top_p: float,
           logprobs_mode: str = "processed", step: str = "lean",
           sampler: str = "multinomial", fast_prefill: bool = True,
           compact: bool = True, stats: dict[str, int] | None = None) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Sample up to ``max_new_tokens`` after left-padded ``input_ids`` ``[B, W]``.

    ``cache`` is a ``DynamicCache`` holding the first ``cache.get_seq_length()`` columns (or None: a
    fresh one is made). Returns ``(new_tokens [B, n], logprobs [B, n], cache)`` on the CPU, ``n`` the
    steps run; the cache holds the prompt and every sampled token but the last (never fed), as with
    ``generate``. Seed the RNG around the call; the model should be in eval mode.

    ``step``: how the one-token steps after the prefill run: ``"lean"`` (default) through
    :class:`~mgrpo_algo.policies.lean_forward.LeanStep` when it supports the model (bitwise the
    model's logits, without the forward's overhead), else the model's forward; ``"fast"`` through
    :class:`~mgrpo_algo.policies.fast_step.FastStep` when it supports the model (the model's logits
    up to float rounding, with half the ops), else as ``"lean"``; ``"forward"`` always through the
    model's forward. The prefill goes through the model's forward, except with ``step="fast"`` and
    ``fast_prefill`` (the default), where :meth:`FastStep.prefill` runs it (the model's logits and
    cache up to float rounding, without the forward's overhead: ~10 ms of a ~4-layer forward's
    modules against ~1 ms).

    ``sampler``: ``"multinomial"`` draws as ``generate`` does (``torch.multinomial``: one exponential
    variate per vocabulary entry and row, the same ids as ``generate`` under a seed);
    ``"inverse_cdf"`` draws the same distribution from one uniform per row (:func:`inverse_cdf`),
    so other ids under the same seed but far fewer random numbers. Greedy ignores it.

    ``compact``: with ``step="fast"`` and greedy or ``inverse_cdf`` draws, rows that have stopped leave
    the batch once they are a quarter of it (at least two), instead of riding along as padding until
    the longest row stops: later steps cost the rows still sampling. The draws stay those of the whole
    batch (one uniform per original row and step, the stopped rows' unused), so the ids are those of
    an uncompacted call up to the float rounding of a smaller batch; the returned cache is the whole
    batch again (a row's columns up to the step it left, zeros after: more than any kept completion
    reads, since a row leaves only once its stop token was fed).

    ``stats``: when given, ``"steps"`` and ``"row_steps"`` (rows the model ran at each step, summed)
    are added to it.
    """
    from transformers import DynamicCache

    from .fast_step import FastStep, additive_mask
    from .lean_forward import LeanStep

    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    if step not in STEPS:
        raise ValueError(f"step must be one of {STEPS}, got {step!r}")
    fast = FastStep.for_model(model) if step == "fast" and FastStep.supports(model) else None
    lean = LeanStep.for_model(model) if fast is None and step in ("lean", "fast") and LeanStep.supports(model) else None
    if lean is not None:
        lean.refresh()  # weights do not move while this call decodes
    kwarg = _cache_kwarg()  # the forward's name for the cache (``cache`` in transformers 5.x)
    device = input_ids.device
    if cache is None:
        cache = DynamicCache(config=model.config)
    past = cache.get_seq_length()
    reserve(cache, input_ids.shape[1] - past + max_new_tokens)
    mask = attention_mask
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    stops = torch.tensor(list(stop_ids), dtype=torch.long, device=device)
    batch = input_ids.shape[0]
    unfinished = torch.ones(batch, dtype=torch.bool, device=device)
    ones = torch.ones((batch, 1), dtype=mask.dtype, device=device)
    tokens, logps = [], []
    feed, feed_pos = input_ids[:, past:], positions[:, past:]
    last_pos = positions[:, -1:]
    all_ones = bool(mask.all())  # stays so: the mask only grows by columns of ones
    bias = None
    if fast is not None:  # weights do not move while this call decodes; positions stay below this
        fast.refresh(int(last_pos.max()) + max_new_tokens + 1)
        if not all_ones:  # the additive mask of every column this call can reach, made once
            bias = additive_mask(mask, max_new_tokens)
    width = mask.shape[1]  # columns after this step's token is fed
    pad = torch.full((batch,), pad_id, dtype=torch.long, device=device)
    compacting = compact and fast is not None and (temperature == 0 or sampler == "inverse_cdf")
    rows = torch.arange(batch, device=device)  # the original row of each row still in the batch
    left: list[tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]] = []  # rows that left, their caches
    for index in range(max_new_tokens):
        if fast is not None and index > 0:
            logits = fast(feed, None, feed_pos, cache, prepared=True,  # no mask and no bias: nothing is padding
                          attention_bias=None if bias is None else bias[..., :width])
        elif fast is not None and fast_prefill:
            logits = fast.prefill(feed, feed_pos, cache, None if bias is None else bias[..., :width], prepared=True)
        elif lean is not None and index > 0:
            logits = lean(feed, mask, feed_pos, cache, mask_all_ones=all_ones, fused_current=True).to(
                dtype=torch.float32, copy=True)
        else:
            out = model(input_ids=feed, attention_mask=mask, position_ids=feed_pos, **{kwarg: cache}, use_cache=True,
                        logits_to_keep=1, return_dict=True)
            logits = out.logits[:, -1].to(dtype=torch.float32, copy=True)
            del out
        if stats is not None:
            stats["steps"] = stats.get("steps", 0) + 1
            stats["row_steps"] = stats.get("row_steps", 0) + logits.shape[0]
        scores, logp = process_scores(logits, temperature, top_p, logprobs_mode)
        if temperature > 0 and sampler == "inverse_cdf":  # unnormalised weights will do: exp of the log-probs
            uniforms = None
            if left:  # the whole batch's draws, so that a row's ids do not depend on who left
                uniforms = torch.rand((batch, 1), dtype=logp.dtype, device=device)[rows]
            nxt = inverse_cdf(logp.exp() if logprobs_mode == "processed" else torch.softmax(scores, dim=-1), uniforms)
        elif temperature > 0:
            nxt = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        else:
            nxt = torch.argmax(scores, dim=-1)
        nxt = torch.where(unfinished, nxt, pad)
        tokens.append(nxt)
        logps.append(logp.gather(1, nxt[:, None]).squeeze(1))
        if left:
            tokens[-1], logps[-1] = (rows, tokens[-1]), (rows, logps[-1])  # type: ignore[assignment]
        stopped_before = ~unfinished  # their stop token was fed at this step: their cache is complete
        unfinished &= ~torch.isin(nxt, stops)
        if index + 1 == max_new_tokens or not bool(unfinished.any()):
            break
        if compacting:
            done = int(stopped_before.sum())
            if done >= 2 and 4 * done >= len(rows):
                keep, gone = (~stopped_before).nonzero().squeeze(1), stopped_before.nonzero().squeeze(1)
                left.append((rows[gone], [(layer.keys[gone], layer.values[gone]) for layer in cache.layers]))
                for layer in cache.layers:
                    layer.keep_rows(keep)
                if not tokens or not isinstance(tokens[0], tuple):  # the steps before the first compaction
                    tokens = [(rows, t) for t in tokens]  # type: ignore[misc]
                    logps = [(rows, lp) for lp in logps]  # type: ignore[misc]
                rows, nxt, unfinished, last_pos, pad = rows[keep], nxt[keep], unfinished[keep], last_pos[keep], pad[keep]
                if bias is not None:
                    bias = bias[keep]
        feed = nxt[:, None]
        last_pos = last_pos + 1
        feed_pos = last_pos
        width += 1
        if fast is None:  # FastStep reads the additive mask made above
            mask = torch.cat([mask, ones], dim=-1)
    if not left:
        return torch.stack(tokens, 1).cpu(), torch.stack(logps, 1).cpu(), cache
    return (*_scatter_steps(tokens, logps, batch, pad_id), _whole_batch(cache, rows, left, batch))


def _scatter_steps(tokens: list[Any], logps: list[Any], batch: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, n]`` ids (pad where a row had left) and log-probs (0 there) of ``(rows, values)`` steps."""
    ids = torch.full((batch, len(tokens)), pad_id)  # an int fill: int64 ids; zeros: float32 log-probs
    lps = torch.zeros((batch, len(tokens)))
    for step, (rows, t) in enumerate(tokens):
        ids[rows.cpu(), step] = t.cpu()
        lps[rows.cpu(), step] = logps[step][1].float().cpu()
    return ids, lps


def _whole_batch(cache: Any, rows: torch.Tensor, left: list[Any], batch: int) -> Any:
    """A ``DynamicCache`` of every original row: the rows still in ``cache`` and those that ``left``
    (their columns up to when they left, zeros after)."""
    from transformers import DynamicCache

    layers = []
    for index, layer in enumerate(cache.layers):
        keys = layer.keys.new_zeros((batch, *layer.keys.shape[1:]))
        values = torch.zeros_like(keys)
        keys[rows], values[rows] = layer.keys, layer.values
        for gone, kept in left:
            k, v = kept[index]
            keys[gone, :, : k.shape[2]], values[gone, :, : v.shape[2]] = k, v
        layers.append((keys, values))
    return DynamicCache(layers)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of ``probs`` ``[B, V]`` drawn by inverting its cumulative sum at one uniform.

    ``P(token i) = probs[i] / sum(probs)``: the first index whose cumulative sum exceeds ``u * total``
    (``u`` uniform in [0, 1)). A token of probability 0 (outside the top-p nucleus) has the cumulative
    sum of the token before it and is never the first to exceed; ``u * total`` is kept below the
    total, so rounding cannot run past the last token of nonzero probability. Costs B random numbers
    instead of the B x V exponentials of ``torch.multinomial``; ``uniforms`` ``[B, 1]``: those draws,
    made by the caller.
    """
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    if uniforms is None:
        uniforms = torch.rand((probs.shape[0], 1), dtype=cdf.dtype, device=probs.device)
    u = uniforms * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # below the total, even rounded
    return torch.searchsorted(cdf, u, right=True).squeeze(1)


# Shared with hf_policy's generate path (defined here so the two modules import in one direction).
def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches ``top_p`` (as HF/vLLM)."""
    sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p)
    remove[..., -1] = False  # always keep the most likely token
    mask = remove.scatter(1, order, remove)
    return scores.masked_fill(mask, float("-inf"))


@functools.cache  # a property of the installed transformers: looked up once, not per decode or micro-batch
def _cache_kwarg() -> str:
    """``generate``'s cache argument and output field: ``cache`` in recent transformers 5.x, before
    that ``past_key_values``."""
    from dataclasses import fields

    from transformers.generation.utils import GenerateDecoderOnlyOutput

    return "cache" if "cache" in {f.name for f in fields(GenerateDecoderOnlyOutput)} else "past_key_values"
