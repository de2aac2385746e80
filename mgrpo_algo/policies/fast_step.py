"""A one-token decode step of a Qwen2- or Llama-style model with fewer and cheaper ops than the forward.

:class:`~mgrpo_algo.policies.lean_forward.LeanStep` is bitwise the model's forward, so it must run the
model's own ops in the model's order. On a 2-core CPU a 128 x 4 model's step is still ~1.5-3 ms of
per-op overhead (~150 small aten calls at 2-20 us each), not arithmetic. :class:`FastStep` gives up
bitwise equality for the same function computed with fewer, cheaper calls:

- weights pre-transposed once (``torch.mm`` / ``addmm`` on a contiguous ``[in, out]`` matrix costs
  half of ``F.linear`` on ``[out, in]`` at these shapes), residual adds fused into ``addmm``;
- one GEMM per layer for q, k, v *and* ``rotate_half(q)``, ``rotate_half(k)``: the rotation is a
  signed permutation of the output rows, so its rows are the same dot products with a sign flipped
  (exact), and rotary embedding becomes two multiplies and an add;
- cos / sin from a table over positions, computed as the model's rotary module computes them (one
  float32 product per entry: the same values);
- gate and up in one GEMM; the final norm and the LM head on the one new position.

The result is the model's function up to float rounding: logits within ~1e-5 of ``model(...)``,
log-probs of likely tokens within 1e-5 (tests/test_fast_step.py bounds them against the forward).
It refuses what it cannot mirror and anything but a float32 model on the CPU (:meth:`FastStep.supports`:
its pre-transposed weights are a second copy of the model, cheap for the tiny models it is for); the
decode loop then uses LeanStep or the forward. Its weights are rebuilt at the next call after any parameter moved (an optimiser step
or a weight sync), as LeanStep's are.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .lean_forward import LeanStep

__all__ = ["FastStep", "additive_mask"]

_STEPS: weakref.WeakKeyDictionary[Any, FastStep] = weakref.WeakKeyDictionary()
# Rope variants whose inverse frequencies do not depend on the sequence length (a table holds them).
_STATIC_ROPE = ("default", "linear", "llama3")
#: Largest model (parameter bytes) FastStep copies: its transposed weights are a second copy of the
#: model, free for the tiny models it is for (2-16 MB), 2 GB for a 0.5 B model (LeanStep instead).
MAX_MODEL_BYTES = 256 * 2**20


def _rotation(head_dim: int) -> Tensor:
    """``R`` with ``x @ R == rotate_half(x) == cat(-x[h:], x[:h])`` for a row ``x`` of ``head_dim``."""
    half = head_dim // 2
    rotation = torch.zeros(head_dim, head_dim)
    index = torch.arange(half)
    rotation[index + half, index] = -1.0
    rotation[index, index + half] = 1.0
    return rotation


class _Layer:
    """One decoder layer's prepared weights (see the module docstring)."""

    __slots__ = ("norm1", "proj", "proj_bias", "out", "out_bias", "norm2", "gate_up", "gate_up_bias", "down",
                 "down_bias", "eps1", "eps2")

    def __init__(self, layer: Any, heads: int, kv_heads: int, head_dim: int, rotation: Tensor) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        qk = torch.cat([attn.q_proj.weight, attn.k_proj.weight])  # [(H + KV) D, C]
        qk_bias = torch.cat([_bias(attn.q_proj), _bias(attn.k_proj)])
        rows = heads + kv_heads
        # rotate_half of each head's output: permute (and negate) the head's rows of the weight.
        qk_rot = (qk.view(rows, head_dim, -1).transpose(1, 2) @ rotation).transpose(1, 2).reshape(qk.shape)
        qk_rot_bias = (qk_bias.view(rows, head_dim) @ rotation).reshape(-1)
        weight = torch.cat([qk, qk_rot, attn.v_proj.weight])
        self.proj = weight.t().contiguous()
        self.proj_bias = torch.cat([qk_bias, qk_rot_bias, _bias(attn.v_proj)])
        self.out = attn.o_proj.weight.t().contiguous()
        self.out_bias = attn.o_proj.bias
        self.gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t().contiguous()
        self.gate_up_bias = (torch.cat([_bias(mlp.gate_proj), _bias(mlp.up_proj)])
                             if mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None else None)
        self.down = mlp.down_proj.weight.t().contiguous()
        self.down_bias = mlp.down_proj.bias
        self.norm1, self.norm2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        self.eps1 = layer.input_layernorm.variance_epsilon
        self.eps2 = layer.post_attention_layernorm.variance_epsilon


def _bias(linear: Any) -> Tensor:
    return linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.weight.shape[0])


def additive_mask(mask: Tensor, extra_columns: int = 0) -> Tensor:
    """``[B, 1, 1, L + extra_columns]``: the additive float mask of a 0/1 attention mask ``[B, L]``
    (0 where it attends, -inf elsewhere), with ``extra_columns`` attended columns after it (the
    tokens a decode call will append)."""
    bias = torch.zeros((mask.shape[0], 1, 1, mask.shape[1] + extra_columns), dtype=torch.float32, device=mask.device)
    bias[:, 0, 0, : mask.shape[1]].masked_fill_(mask == 0, float("-inf"))
    return bias


def _rms_norm(hidden: Tensor, weight: Tensor, eps: float) -> Tensor:
    # The model's formula written out: F.rms_norm's fused CPU kernel is slower at these shapes.
    return weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps))


def _after_attention(layer: _Layer, hidden: Tensor, attended: Tensor) -> Tensor:
    """The rest of a decoder layer after its attention, for rows ``[N, C]`` (one token each, or every
    new token of a prefill): output projection and residual, then the MLP and its residual."""
    hidden = torch.addmm(hidden, attended, layer.out)
    if layer.out_bias is not None:
        hidden = hidden + layer.out_bias
    x = _rms_norm(hidden, layer.norm2, layer.eps2)
    y = torch.mm(x, layer.gate_up) if layer.gate_up_bias is None else torch.addmm(layer.gate_up_bias, x, layer.gate_up)
    gate, up = y.chunk(2, dim=-1)
    hidden = torch.addmm(hidden, F.silu(gate).mul_(up), layer.down)
    return hidden if layer.down_bias is None else hidden + layer.down_bias


class FastStep:
    """A one-token decode step for ``model`` (a float32 ``Qwen2ForCausalLM`` / ``LlamaForCausalLM``):
    logits equal to the model's up to float rounding, with about half the ops of
    :class:`~mgrpo_algo.policies.lean_forward.LeanStep`. :meth:`for_model` keeps one per model."""

    def __init__(self, model: Any) -> None:
        if not self.supports(model):
            raise ValueError(f"FastStep does not support {type(model).__name__}: use LeanStep or the forward")
        config = model.config
        self.model = model
        self.body = model.model
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        attn = self.body.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self._layers: list[_Layer] = []
        self._version: tuple[int, ...] | None = None
        self._cos = self._sin = torch.empty(0)

    @classmethod
    def for_model(cls, model: Any) -> FastStep:
        """The step of ``model``, made once per model object (weights rebuilt only after a change)."""
        step = _STEPS.get(model)
        if step is None:
            step = _STEPS[model] = cls(model)
        return step

    @staticmethod
    def supports(model: Any) -> bool:
        """True for the models LeanStep mirrors, in float32 on the CPU, of at most
        :data:`MAX_MODEL_BYTES`, with a rope whose frequencies do not depend on the sequence length."""
        if not LeanStep.supports(model):
            return False
        rope = getattr(model.model.rotary_emb, "rope_type", "default")
        weight = model.model.embed_tokens.weight
        if rope not in _STATIC_ROPE or weight.dtype != torch.float32 or weight.device.type != "cpu":
            return False
        return sum(p.numel() * p.element_size() for p in model.parameters()) <= MAX_MODEL_BYTES

    def refresh(self, max_position: int = 0) -> None:
        """Rebuild the prepared weights now if any parameter moved since they were built, and make
        the rope table cover positions below ``max_position`` (the decode loop calls it once)."""
        if max_position > self._cos.shape[0]:
            self._grow_rope(max_position)
        version = tuple(v for p in self.model.parameters() for v in (p._version, p.data_ptr()))
        if version == self._version:
            return
        with torch.no_grad():
            rotation = _rotation(self.head_dim).to(self.body.embed_tokens.weight)
            self._layers = [_Layer(layer, self.heads, self.kv_heads, self.head_dim, rotation)
                            for layer in self.body.layers]
            self._head = self.model.lm_head.weight.t().contiguous()
            self._head_bias = self.model.lm_head.bias
        self._version = version

    def _grow_rope(self, needed: int) -> None:
        size = max(needed, 2 * self._cos.shape[0], 256)
        with torch.no_grad():  # the model's rotary module over every position: the values it computes
            probe = self.body.embed_tokens.weight[:1]
            cos, sin = self.body.rotary_emb(probe, torch.arange(size, device=probe.device)[None])
        self._cos, self._sin = cos[0], sin[0]

    @torch.no_grad()
    def __call__(self, input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor, cache: Any,
                 mask_all_ones: bool | None = None, prepared: bool = False,
                 attention_bias: Tensor | None = None) -> Tensor:
        """Float logits ``[B, V]`` of the next token after one new token per row (the arguments of
        :meth:`LeanStep.__call__`). ``prepared``: the caller ran :meth:`refresh` with a
        ``max_position`` above every position of this decode (the loop does, once per call).
        ``attention_bias``: instead of the mask, the additive float mask ``[B, 1, 1, L]`` (0 to
        attend, -inf not), which the loop keeps for the whole call (SDPA would convert a boolean
        mask at every layer)."""
        if not prepared:
            self.refresh(int(position_ids.max()) + 1)
        if attention_bias is not None:
            mask = attention_bias
        else:
            if mask_all_ones is None:
                mask_all_ones = attention_mask is None or bool(attention_mask.all())
            mask = None if mask_all_ones else additive_mask(attention_mask)
        batch, heads, kv_heads, head_dim = input_ids.shape[0], self.heads, self.kv_heads, self.head_dim
        rotated = heads + kv_heads
        hidden = self.body.embed_tokens.weight[input_ids[:, 0]]
        positions = position_ids[:, 0]
        cos, sin = self._cos[positions][:, None], self._sin[positions][:, None]
        for index, layer in enumerate(self._layers):
            x = _rms_norm(hidden, layer.norm1, layer.eps1)
            y = torch.addmm(layer.proj_bias, x, layer.proj).view(batch, -1, head_dim)
            qk = torch.addcmul(y[:, :rotated] * cos, y[:, rotated: 2 * rotated], sin)
            k, v = cache.layers[index].update(qk[:, heads:].unsqueeze(2), y[:, 2 * rotated:].unsqueeze(2))
            q = qk[:, :heads].view(batch, kv_heads, heads // kv_heads, head_dim)  # one query: heads under their kv head
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
            hidden = _after_attention(layer, hidden, out.reshape(batch, -1))
        return self._logits(hidden)

    def _logits(self, hidden: Tensor) -> Tensor:
        x = _rms_norm(hidden, self.body.norm.weight, self.body.norm.variance_epsilon)
        if self._head_bias is not None:
            return torch.addmm(self._head_bias, x, self._head)
        return torch.mm(x, self._head)

    @torch.no_grad()
    def prefill(self, input_ids: Tensor, position_ids: Tensor, cache: Any, attention_bias: Tensor | None = None,
                prepared: bool = False) -> Tensor:
        """Float logits ``[B, V]`` after the last of ``n`` new tokens per row (``input_ids``
        ``[B, n]``, left-padded), their keys and values appended to ``cache``: the prefill of a decode
        call (a first turn, or a turn's new ids after its kept cache) without the forward's overhead.

        ``attention_bias``: the additive padding mask ``[B, 1, 1, L]`` of the cached columns and the
        new ones (``L = cache length + n``; wider is cut), or None when no column is padding. The new
        tokens attend causally among themselves. Masked entries get the float minimum, not -inf, so
        a padding query with nothing to attend to stays finite (its keys and values are cached and
        masked at every later step, as the forward's are).
        """
        if not prepared:
            self.refresh(int(position_ids.max()) + 1)
        batch, new = input_ids.shape
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        groups, rotated = heads // kv_heads, heads + kv_heads
        past = cache.layers[0].get_seq_length() if cache.layers[0].is_initialized else 0
        columns = past + new
        allowed = torch.ones((new, columns), dtype=torch.bool, device=input_ids.device).tril(past)  # causal
        allowed = allowed.expand(batch, 1, new, columns)
        if attention_bias is not None:
            allowed = allowed & (attention_bias[..., :columns] == 0)
        mask = torch.zeros(allowed.shape, dtype=torch.float32, device=input_ids.device).masked_fill_(
            ~allowed, torch.finfo(torch.float32).min)
        # one query block per kv head: its query heads' rows, token-major within each head
        mask = mask.unsqueeze(2).expand(batch, 1, groups, new, columns).reshape(batch, 1, groups * new, columns)
        hidden = self.body.embed_tokens.weight[input_ids.reshape(-1)]  # [B n, C]
        cos, sin = self._cos[position_ids].unsqueeze(2), self._sin[position_ids].unsqueeze(2)  # [B, n, 1, D]
        last = len(self._layers) - 1
        for index, layer in enumerate(self._layers):
            x = _rms_norm(hidden, layer.norm1, layer.eps1)
            y = torch.addmm(layer.proj_bias, x, layer.proj).view(batch, new, -1, head_dim)
            qk = torch.addcmul(y[:, :, :rotated] * cos, y[:, :, rotated: 2 * rotated], sin)
            k, v = cache.layers[index].update(qk[:, :, heads:].transpose(1, 2), y[:, :, 2 * rotated:].transpose(1, 2))
            q = qk[:, :, :heads]
            if index == last:  # only the last position's logits are read: the rest of this layer for it alone
                q, mask, new = q[:, -1:], mask.view(batch, 1, groups, -1, columns)[:, :, :, -1], 1
                hidden = hidden.view(batch, -1, hidden.shape[-1])[:, -1]
            q = q.reshape(batch, new, kv_heads, groups, head_dim).permute(0, 2, 3, 1, 4).reshape(
                batch, kv_heads, groups * new, head_dim)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
            out = out.view(batch, kv_heads, groups, new, head_dim).permute(0, 3, 1, 2, 4).reshape(batch * new, -1)
            hidden = _after_attention(layer, hidden, out)
        return self._logits(hidden)
