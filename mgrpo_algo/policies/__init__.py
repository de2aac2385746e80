"""Rollout policies and what feeds them: the in-process ``generate`` policy with its KV cache, the
OpenAI-compatible (vLLM) policy, weight sync to a served engine, the tiny models and prebuilt starts.

Layer 1: imports only ``core``."""
