"""Per-trajectory KV caches kept across turns for :class:`mgrpo_algo.policies.hf_policy.TransformersPolicy`.

An agent's turn ``t + 1`` prompt is its turn-``t`` prompt, the sampled completion and the
template's continuation (the tool response). Re-reading the whole chat every turn makes a sixth turn
cost six prefills; instead, after each ``generate`` the keys and values of every row are kept (one
entry per ``(episode, agent)``, together with the exact ids they encode) and the next turn feeds
only the ids after them.

How a batch with ragged cached lengths goes through transformers' ``generate``: ``generate``
accepts a :class:`transformers.DynamicCache` with the *full* ``input_ids`` and ``attention_mask``
(cached + new) and feeds only the ids after the cache's length; position ids come from the
attention mask's cumulative sum. A :class:`DynamicCache` holds one length for the whole batch, so
each row's cache is left-padded to the longest (``Lc``) and its new ids are left-padded to the
longest new part (``N``)::

    row layout (width Lc + N):  [pad ... | cached c_i ids] [pad ... | new n_i ids]
    attention mask:             [0 ...   | 1 ...         ] [0 ...   | 1 ...       ]

Padding in the middle is masked like left padding, and the cumulative-sum positions of the new ids
are ``c_i, c_i + 1, ...``: exactly the positions a full prefill would give them, so logits (and the
sampled ids and log-probs) match a full re-prefill up to float rounding. A row without a cache
(first turn, evicted, stale) has ``c_i = 0`` and is prefilled as before.

Safety: an entry is used only when its ids are a prefix of the new prompt (token-in/token-out:
anything else is a different trajectory) and only while the model's weights are unchanged (every
parameter's in-place version counter: an optimiser step or a weight sync drops all entries).
Memory: entries beyond ``budget_bytes`` are evicted least recently used first; an evicted agent is
simply re-prefilled on its next turn. :meth:`KVCacheManager.release` frees an ended agent's entry.
Only models whose layers are all plain full-attention :class:`DynamicLayer` are served (sliding
window or linear-attention layers keep other state); others always re-prefill.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["KVCacheManager", "CacheStats", "BatchLayout", "supports_reuse"]


def supports_reuse(model: Any) -> bool:
    """True when every layer of the model's default cache is a plain full-attention ``DynamicLayer``."""
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        cache = DynamicCache(config=model.config)
    except Exception:  # an old transformers or a config it cannot map: no reuse, same results
        return False
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _weights_version(model: torch.nn.Module) -> tuple[int, ...]:
    # In-place updates (optimizer.step, load_state_dict, copy_) bump a tensor's version counter.
    return tuple(p._version for p in model.parameters())


@dataclass
class _Entry:
    ids: list[int]
    keys: list[torch.Tensor]  # per layer [1, H, L, D]
    values: list[torch.Tensor]
    nbytes: int


@dataclass
class CacheStats:
    """Counters since the policy was built: rows served from a cache or prefilled from scratch."""

    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    prefilled_tokens: int = 0
    evictions: int = 0
    invalidations: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class BatchLayout:
    """What :meth:`KVCacheManager.prepare` built: the inputs of one ``generate`` and how to read it back."""

    input_ids: torch.Tensor  # [B, Lc + N]
    attention_mask: torch.Tensor  # [B, Lc + N]
    cache: Any  # a DynamicCache over the first Lc columns, or None (no row had a cache)
    cached: list[int]  # c_i
    width: int  # Lc + N: where the generated tokens start
    past: int  # Lc
    keys: list[Hashable | None] = field(default_factory=list)


class KVCacheManager:
    """Keeps one KV-cache entry per live trajectory, under a memory budget.

    Args:
        budget_bytes: total bytes of kept keys and values; least recently used entries are evicted
            past it (an entry larger than the budget is not kept).
    """

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self.entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self.stats = CacheStats()
        self._version: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def release(self, key: Hashable) -> None:
        """Free the entry of a trajectory that ended (no-op when there is none)."""
        self.entries.pop(key, None)

    def clear(self) -> None:
        self.entries.clear()

    def prepare(self, model: torch.nn.Module, keys: Sequence[Hashable | None], prompts: Sequence[Sequence[int]],
                pad_id: int) -> BatchLayout:
        """The padded inputs (and cache) for one ``generate`` over ``prompts``; row ``i`` uses the entry of
        ``keys[i]`` when its ids are a prefix of ``prompts[i]``. Used entries leave the manager (the
        batch holds them now; :meth:`store` puts the extended ones back)."""
        version = _weights_version(model)
        if version != self._version:
            if self.entries:
                self.stats.invalidations += 1
            self.entries.clear()  # the weights moved: every kept key/value is stale
            self._version = version
        used: list[_Entry | None] = []
        for key, prompt in zip(keys, prompts, strict=True):
            entry = self.entries.pop(key, None) if key is not None else None
            # At least one id must be fed: generate needs a new token to produce the next logits.
            if entry is not None and not (len(entry.ids) < len(prompt) and list(prompt[: len(entry.ids)]) == entry.ids):
                entry = None
            used.append(entry)
        cached = [len(e.ids) if e is not None else 0 for e in used]
        past = max(cached)
        new = max(len(p) - c for p, c in zip(prompts, cached, strict=True))
        batch = len(prompts)
        input_ids = torch.full((batch, past + new), pad_id, dtype=torch.long)
        attention = torch.zeros((batch, past + new), dtype=torch.long)
        for row, (prompt, c) in enumerate(zip(prompts, cached, strict=True)):
            tail = torch.tensor(list(prompt[c:]), dtype=torch.long)
            input_ids[row, past + new - len(tail):] = tail
            attention[row, past + new - len(tail):] = 1
            if c:
                input_ids[row, past - c: past] = torch.tensor(list(prompt[:c]), dtype=torch.long)
                attention[row, past - c: past] = 1
            self.stats.hits += bool(c)
            self.stats.misses += not c
            self.stats.reused_tokens += c
            self.stats.prefilled_tokens += len(tail)
        cache = None
        if past:
            from transformers import DynamicCache

            template = next(e for e in used if e is not None)
            layers = []
            for layer in range(len(template.keys)):
                k0, v0 = template.keys[layer], template.values[layer]
                k = k0.new_zeros((batch, k0.shape[1], past, k0.shape[3]))
                v = v0.new_zeros((batch, v0.shape[1], past, v0.shape[3]))
                for row, entry in enumerate(used):
                    if entry is not None:
                        k[row, :, past - cached[row]:] = entry.keys[layer][0]
                        v[row, :, past - cached[row]:] = entry.values[layer][0]
                layers.append((k, v))
            cache = DynamicCache(layers)
        return BatchLayout(input_ids, attention, cache, cached, past + new, past, list(keys))

    def store(self, layout: BatchLayout, cache: Any, prompts: Sequence[Sequence[int]],
              completions: Sequence[Sequence[int]]) -> None:
        """Keep, for every keyed row, the keys/values of its prompt and kept completion from the cache
        ``generate`` returned, then evict down to the budget."""
        if cache is None or self.budget_bytes == 0:
            return
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        length = layers[0][0].shape[2]  # width + generated - 1: the last sampled token was never fed
        for row, key in enumerate(layout.keys):
            if key is None:
                continue
            prompt, completion = list(prompts[row]), list(completions[row])
            c, n = layout.cached[row], len(prompt) - layout.cached[row]
            kept = min(len(completion), length - layout.width)
            index = torch.cat([
                torch.arange(layout.past - c, layout.past),
                torch.arange(layout.width - n, layout.width + kept),
            ]).to(layers[0][0].device)
            keys = [k[row: row + 1, :, index] for k, _ in layers]  # advanced indexing copies: the batch can go
            values = [v[row: row + 1, :, index] for _, v in layers]
            nbytes = sum(t.numel() * t.element_size() for t in (*keys, *values))
            if nbytes > self.budget_bytes:
                continue
            self.entries[key] = _Entry(prompt + completion[:kept], keys, values, nbytes)
        total = self.nbytes
        while total > self.budget_bytes and self.entries:
            _, evicted = self.entries.popitem(last=False)  # least recently used first
            total -= evicted.nbytes
            self.stats.evictions += 1
