"""One decode step of a Qwen2- or Llama-style model, written over the model's own weights.

A 128 x 4 model costs a few MFLOP per token; a decode step through the model's ``forward`` costs
several milliseconds of Python around it (the keyword plumbing and decorators of every module, the
attention-mask factory, output dataclasses). :class:`LeanStep` does the same arithmetic for a
one-token step, in the same order, with the same kernels, and nothing else:

- embedding; per layer: RMSNorm (the model's formula: float32, ``x * rsqrt(mean(x^2) + eps)``,
  weight after), the q/k/v projections with their biases (as one stacked matrix; the gate and up
  projections too), rotary embedding from the model's own
  ``rotary_emb`` module (so every rope variant the model supports is computed by it),
  ``cache.layers[i].update`` (the cache object the model would use), ``scaled_dot_product_attention``
  called as the model's SDPA integration calls it for one query (grouped-query heads inside the kernel
  without a mask, packed under their key/value head with one),
  the output projection, RMSNorm, and the gated MLP; the final norm and the LM head on the last
  position;
- the attention mask as the model's SDPA mask factory builds it for one query token: ``None`` when no
  column is padding, else a boolean ``[B, 1, 1, L]`` mask.

Same inputs, same ops, same order: the logits are bitwise those of ``model(...)`` on CPU
(tests/test_lean_forward.py checks ``torch.equal`` against the model on ragged, padded and cached
batches), so :func:`mgrpo_algo.policies.decode.decode` samples the same ids as ``generate``.
Architectures it does not know (anything but plain full-attention Qwen2 / Llama decoder layers with
SDPA attention), models in training mode and configurations it cannot mirror exactly make
:meth:`LeanStep.supports` false, and the decode loop calls the model's ``forward`` instead.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["LeanStep"]

_STEPS: weakref.WeakKeyDictionary[Any, LeanStep] = weakref.WeakKeyDictionary()

_LAYER_CLASSES = {"qwen2": "Qwen2DecoderLayer", "llama": "LlamaDecoderLayer"}
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def _rms_norm(norm: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The model's RMSNorm, op for op (Qwen2RMSNorm / LlamaRMSNorm)."""
    dtype = hidden.dtype
    hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + norm.variance_epsilon)
    return norm.weight * hidden.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LeanStep:
    """A one-token decode step for ``model`` (a ``Qwen2ForCausalLM`` / ``LlamaForCausalLM``).

    The object keeps references to the model's modules; the only copies are the stacked q/k/v and
    gate/up matrices, rebuilt at the next call after any of their parameters moved (an optimiser step
    or a weight sync is seen at once). :meth:`for_model` keeps one step per model object.
    """

    def __init__(self, model: Any) -> None:
        if not self.supports(model):
            raise ValueError(f"LeanStep does not support {type(model).__name__}: call the model's forward")
        self.model = model
        self.body = model.model
        self.layers = list(self.body.layers)
        self._fused: list[tuple[Tensor, Tensor | None, Tensor, Tensor | None]] = []
        self._fused_version: tuple[int, ...] | None = None

    @classmethod
    def for_model(cls, model: Any) -> LeanStep:
        """The step of ``model``, made once per model object and kept with it (its fused weights are
        rebuilt only when a weight changed)."""
        step = _STEPS.get(model)
        if step is None:
            step = _STEPS[model] = cls(model)
        return step

    def refresh(self) -> None:
        """Rebuild the stacked matrices now if a weight moved since they were built."""
        self._weights()

    def _weights(self) -> list[tuple[Tensor, Tensor | None, Tensor, Tensor | None]]:
        """Per layer ``(qkv weight, qkv bias, gate/up weight, gate/up bias)``: the projections that read
        the same input stacked into one matrix, so a layer runs two GEMMs fewer (each output column is
        the same dot product: the logits stay bitwise the model's, tests/test_lean_forward.py). Rebuilt
        when any of their parameters changed in place (an optimiser step, a weight sync) or was replaced."""
        parts = [(a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj)
                 for a, m in ((layer.self_attn, layer.mlp) for layer in self.layers)]
        tensors = [t for mods in parts for mod in mods for t in (mod.weight, mod.bias) if t is not None]
        version = tuple(v for t in tensors for v in (t._version, t.data_ptr()))
        if version != self._fused_version:
            self._fused = []
            for q, k, v, gate, up in parts:
                qkv_b = torch.cat([q.bias, k.bias, v.bias]) if q.bias is not None else None
                gu_b = torch.cat([gate.bias, up.bias]) if gate.bias is not None else None
                self._fused.append((torch.cat([q.weight, k.weight, v.weight]), qkv_b,
                                    torch.cat([gate.weight, up.weight]), gu_b))
            self._fused_version = version
        return self._fused

    @staticmethod
    def supports(model: Any) -> bool:
        """True when :meth:`__call__` computes bitwise what ``model(...)`` computes for one token."""
        config = getattr(model, "config", None)
        body = getattr(model, "model", None)
        if config is None or body is None or getattr(model, "training", True):
            return False
        layer_class = _LAYER_CLASSES.get(getattr(config, "model_type", ""))
        layers = getattr(body, "layers", None)
        if layer_class is None or not layers or getattr(config, "_attn_implementation", None) != "sdpa":
            return False
        if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or ["full_attention"])):
            return False
        if getattr(config, "use_sliding_window", False) or getattr(config, "pretraining_tp", 1) != 1:
            return False
        if getattr(config, "hidden_act", None) != "silu" or getattr(config, "quantization_config", None):
            return False
        if type(getattr(model, "lm_head", None)) is not torch.nn.Linear:
            return False
        if not all(type(layer).__name__ == layer_class for layer in layers) or not hasattr(body, "rotary_emb"):
            return False
        # Plain projections only: a LoRA-injected Linear (the base model under a peft wrapper) adds its
        # adapters in its forward, which reading .weight would silently drop.
        return all(type(getattr(part, name, None)) is torch.nn.Linear
                   for layer in layers for part, names in ((layer.self_attn, _ATTN), (layer.mlp, _MLP)) for name in names)

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                 cache: Any, mask_all_ones: bool | None = None, fused_current: bool = False) -> torch.Tensor:
        """Float logits ``[B, V]`` of the next token after one new token per row.

        Args:
            input_ids: ``[B, 1]`` the token fed at this step.
            attention_mask: ``[B, L]`` over the cached columns and this one (1 = attend).
            position_ids: ``[B, 1]``.
            cache: the ``DynamicCache`` holding the first ``L - 1`` columns; it is extended.
            mask_all_ones: whether ``attention_mask`` has no zero (computed when None; the decode
                loop knows it does not change while the mask grows by columns of ones).
            fused_current: skip the check that the stacked matrices are current (the decode loop
                checks once per call with :meth:`refresh`: no weight moves while it decodes).
        """
        batch = input_ids.shape[0]
        if mask_all_ones is None:
            mask_all_ones = bool(attention_mask.all())
        # The SDPA mask factory skips the mask for one query when nothing is padding.
        mask = None if mask_all_ones else attention_mask.bool()[:, None, None, :]
        # One token per row: the hidden states stay [B, C] (the model's [B, 1, C] runs the same GEMMs).
        hidden = self.body.embed_tokens(input_ids[:, 0])
        cos, sin = self.body.rotary_emb(hidden, position_ids)  # [B, 1, D]: broadcast over the heads
        fused = self._fused if fused_current else self._weights()
        for index, (layer, (qkv_w, qkv_b, gu_w, gu_b)) in enumerate(zip(self.layers, fused, strict=True)):
            residual = hidden
            x = _rms_norm(layer.input_layernorm, hidden)
            attn = layer.self_attn
            head_dim = attn.head_dim
            qkv = F.linear(x, qkv_w, qkv_b).view(batch, -1, head_dim)  # [B, H + 2 KV, D]
            kv_heads = attn.k_proj.weight.shape[0] // head_dim
            rotated = qkv[:, : qkv.shape[1] - kv_heads]  # queries and keys: one rotary pass over both
            rotated = (rotated * cos) + (_rotate_half(rotated) * sin)
            q, k = rotated[:, : rotated.shape[1] - kv_heads], rotated[:, rotated.shape[1] - kv_heads:]
            v = qkv[:, qkv.shape[1] - kv_heads:]
            k, v = cache.layers[index].update(k.unsqueeze(2), v.unsqueeze(2))
            groups = attn.num_key_value_groups
            if groups > 1 and mask is None:  # as the model's SDPA integration: GQA inside the kernel
                out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, dropout_p=0.0, scale=attn.scaling,
                                                     enable_gqa=True)
            else:  # with a mask, one query: the query heads grouped under their key/value head
                out = F.scaled_dot_product_attention(q.reshape(batch, -1, groups, head_dim), k, v, attn_mask=mask,
                                                     dropout_p=0.0, scale=attn.scaling)
            hidden = residual + F.linear(out.reshape(batch, -1), attn.o_proj.weight, attn.o_proj.bias)
            residual = hidden
            x = _rms_norm(layer.post_attention_layernorm, hidden)
            mlp = layer.mlp
            gate, up = F.linear(x, gu_w, gu_b).chunk(2, dim=-1)
            hidden = residual + F.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        hidden = _rms_norm(self.body.norm, hidden)
        head = self.model.lm_head
        return F.linear(hidden, head.weight, head.bias)
