"""The one place a role's LLM policy is built: in-process ``generate`` or the role's served engine.

Rollouts (a role worker), evaluation (``mgrpo compare``, ``mgrpo eval``) and the CLI all call
:func:`make_policy`, so a setting added to :class:`~mgrpo_algo.core.config.GenerationConfig` reaches
every policy at once.
"""

from __future__ import annotations

from typing import Any

__all__ = ["make_policy"]


def make_policy(
    role: str,
    model: Any,
    tokenizer: Any,
    spec: Any,
    *,
    seed: int,
    temperature: float | None = None,
    max_new_tokens: int | None = None,
    served: bool | None = None,
    evaluation: bool = False,
    engine: Any = None,
) -> Any:
    """A policy for ``role`` from its :class:`~mgrpo_algo.core.config.RoleConfig` ``spec``.

    Args:
        model: a model object (shared with the learner: rollouts see its current weights) or a path.
        tokenizer: the tokenizer or its path (the model's folder).
        seed: the sampling seed (:mod:`mgrpo_algo.core.seeding`).
        temperature, max_new_tokens: overrides of ``spec.generation`` (an evaluation's settings).
        served: use ``spec.served`` (an OpenAI-compatible engine); default ``spec.served.enabled``.
        evaluation: a held-out evaluation's policy: on ``spec.learner.device`` / ``dtype``, with the
            policy's own KV-cache and decode defaults (evaluations have always run with them).
        engine: the role's launched vLLM server (:class:`~mgrpo_algo.policies.vllm_server.VLLMServer`),
            restarted by the served policy when it dies or hangs.
    """
    g = spec.generation
    temperature = g.temperature if temperature is None else temperature
    max_new_tokens = max_new_tokens or g.max_new_tokens
    if spec.served.enabled if served is None else served:
        from .http_policy import OpenAICompatiblePolicy

        s = spec.served
        return OpenAICompatiblePolicy(
            s.base_url, s.model or str(tokenizer), role=role, tokenizer=tokenizer, max_new_tokens=max_new_tokens,
            temperature=temperature, top_p=g.top_p, max_prompt_tokens=g.max_prompt_tokens, api_key=s.api_key,
            timeout_s=s.timeout_s, wait_s=s.wait_s, engine=engine,
        )
    from .hf_policy import TransformersPolicy

    placed = {"device": spec.learner.device, "dtype": spec.learner.dtype} if evaluation else \
        {"kv_cache_mb": g.kv_cache_mb, "decode": g.decode, "sampler": g.sampler}
    return TransformersPolicy(
        model, tokenizer, role=role, max_new_tokens=max_new_tokens, temperature=temperature, top_p=g.top_p,
        max_prompt_tokens=g.max_prompt_tokens, seed=seed, fast_prefill=g.fast_prefill, compact=g.compact, **placed,
    )
