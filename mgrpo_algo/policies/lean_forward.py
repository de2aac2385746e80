"""One decode step of a Qwen2- or Llama-style model, written over the model's own weights.

A 128 x 4 model costs a few MFLOP per token; a decode step through the model's ``forward`` costs
several milliseconds of Python around it (the keyword plumbing and decorators of every module, the
attention-mask factory, output dataclasses). :class:`LeanStep` does the same arithmetic for a
one-token step, in the same order, with the same kernels, and nothing else:

- embedding; per layer: RMSNorm (the model's formula: float32, ``x * rsqrt(mean(x^2) + eps)``,
  weight after), the q/k/v projections with their biases, rotary embedding from the model's own
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

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["LeanStep"]

_LAYER_CLASSES = {"qwen2": "Qwen2DecoderLayer", "llama": "LlamaDecoderLayer"}


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

    The object keeps references to the model's modules, never copies of their weights: an optimiser
    step or a weight sync is seen at the next call.
    """

    def __init__(self, model: Any) -> None:
        if not self.supports(model):
            raise ValueError(f"LeanStep does not support {type(model).__name__}: call the model's forward")
        self.model = model
        self.body = model.model
        self.layers = list(self.body.layers)
        self.silu = model.config.hidden_act == "silu"

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
        if getattr(config, "hidden_act", None) not in ("silu",) or getattr(config, "quantization_config", None):
            return False
        if type(getattr(model, "lm_head", None)) is not torch.nn.Linear:
            return False
        return all(type(layer).__name__ == layer_class for layer in layers) and hasattr(body, "rotary_emb")

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                 cache: Any, mask_all_ones: bool | None = None) -> torch.Tensor:
        """Float logits ``[B, V]`` of the next token after one new token per row.

        Args:
            input_ids: ``[B, 1]`` the token fed at this step.
            attention_mask: ``[B, L]`` over the cached columns and this one (1 = attend).
            position_ids: ``[B, 1]``.
            cache: the ``DynamicCache`` holding the first ``L - 1`` columns; it is extended.
            mask_all_ones: whether ``attention_mask`` has no zero (computed when None; the decode
                loop knows it does not change while the mask grows by columns of ones).
        """
        batch = input_ids.shape[0]
        if mask_all_ones is None:
            mask_all_ones = bool(attention_mask.all())
        # The SDPA mask factory skips the mask for one query when nothing is padding.
        mask = None if mask_all_ones else attention_mask.bool()[:, None, None, :]
        # One token per row: the hidden states stay [B, C] (the model's [B, 1, C] runs the same GEMMs).
        hidden = self.body.embed_tokens(input_ids[:, 0])
        cos, sin = self.body.rotary_emb(hidden, position_ids)  # [B, 1, D]: broadcast over the heads
        for index, layer in enumerate(self.layers):
            residual = hidden
            x = _rms_norm(layer.input_layernorm, hidden)
            attn = layer.self_attn
            head_dim = attn.head_dim
            q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(batch, -1, head_dim)
            k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(batch, -1, head_dim)
            v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(batch, -1, 1, head_dim)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            k, v = cache.layers[index].update(k.unsqueeze(2), v)
            groups = attn.num_key_value_groups
            if groups > 1 and mask is None:  # as the model's SDPA integration: GQA inside the kernel
                out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, dropout_p=0.0, scale=attn.scaling,
                                                     enable_gqa=True)
            else:  # with a mask, one query: the query heads grouped under their key/value head
                out = F.scaled_dot_product_attention(q.view(batch, -1, groups, head_dim), k, v, attn_mask=mask,
                                                     dropout_p=0.0, scale=attn.scaling)
            hidden = residual + F.linear(out.reshape(batch, -1), attn.o_proj.weight, attn.o_proj.bias)
            residual = hidden
            x = _rms_norm(layer.post_attention_layernorm, hidden)
            mlp = layer.mlp
            gate = F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias)
            up = F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias)
            hidden = residual + F.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        hidden = _rms_norm(self.body.norm, hidden)
        head = self.model.lm_head
        return F.linear(hidden, head.weight, head.bias)
