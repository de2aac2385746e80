"""A policy backed by a Hugging Face causal LM: batched ``generate``, token-in/token-out.

:class:`TransformersPolicy` implements :class:`mgrpo_env.rollout.Policy`: one call answers the
requests of many episodes with one left-padded ``generate`` (or one per ``max_batch_size`` chunk),
and attaches to each response the exact ids it conditioned on and sampled::

    extra = {"prompt_ids": [...], "completion_ids": [...], "logprobs": [...], "policy": "hf:<name>",
             "finish_reason": "stop" | "length" | "prompt_too_long"}

Prompts and stops: :mod:`mgrpo_algo.policies.chat_tokens` (shared with the HTTP policy).

KV reuse (``kv_cache_mb`` > 0, the default): each agent's keys and values are kept between its turns
and the next turn feeds only the ids after them (:mod:`mgrpo_algo.policies.kv_cache`); the sampled ids and
log-probs are those of a full re-prefill. The rollout loops call :meth:`TransformersPolicy.release`
when an agent ends.

Sampling: exactly temperature then top-p, nothing else. The checkpoint's own
``generation_config.json`` (e.g. Qwen's top_k=20, repetition_penalty=1.05) is ignored on purpose:
the learner assumes this distribution. Temperature and top-p are applied by the policy's own logits
processor (HF's warpers are switched off), which also records the log-probabilities:
``logprobs_mode="processed"`` (default) gives log p(token) under the distribution actually sampled
from - ``log_softmax(logits / T)`` renormalised over the top-p nucleus; with ``top_p=1`` this is
exactly what a learner computes as ``log_softmax(logits / T)``. ``"raw"`` gives
``log_softmax(logits)`` (vLLM's default ``raw_logprobs``). Temperature 0 is greedy decoding, whose
``logprobs`` are ``log_softmax(logits)``.

"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import torch

from mgrpo_env.rollout import PolicyRequest, PolicyResponse

from .chat_tokens import ChatPrompter, cut_at_stop, load_tokenizer, stop_spec
from .decode import SAMPLERS, STEPS, _cache_kwarg, _top_p, process_scores  # noqa: F401 - _cache_kwarg: also imported from here
from .decode import decode as lean_decode
from .kv_cache import KVCacheManager, supports_reuse

__all__ = ["TransformersPolicy"]

# --------------------------------------------------------------------------- sampling


class _Sampler:
    """A logits processor that applies temperature and top-p itself and records log-probabilities.

    HF's own warpers are off, so what HF samples from (softmax of what this returns) is exactly the
    distribution described here. At each step the log-probabilities of the step are kept; the
    token sampled from them is read at the next call (it is then ``input_ids[:, -1]``) and the last
    one from the final sequences (:meth:`finish`).
    """

    def __init__(self, temperature: float, top_p: float, mode: str) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.mode = mode
        self.pending: torch.Tensor | None = None
        self.picked: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            self.picked.append(self.pending.gather(1, input_ids[:, -1:]).squeeze(1))
        scores, self.pending = process_scores(scores.float(), self.temperature, self.top_p, self.mode)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """(B, n) log-probabilities of the generated tokens ``new_tokens`` (B, n)."""
        n = new_tokens.shape[1]
        if len(self.picked) < n and self.pending is not None:
            last = new_tokens[:, len(self.picked): len(self.picked) + 1].to(self.pending.device)  # tokens come back on the CPU
            self.picked.append(self.pending.gather(1, last).squeeze(1))
        if not self.picked:
            return torch.zeros(new_tokens.shape, dtype=torch.float32)
        return torch.stack(self.picked[:n], dim=1).cpu()


@contextmanager
def _seeded(seed: int, device: torch.device):
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


# --------------------------------------------------------------------------- the policy


class TransformersPolicy:
    """A :class:`mgrpo_env.rollout.Policy` that samples from a Hugging Face causal LM.

    Args:
        model_or_path: a model object (shared with a learner in-process: no weight sync; the policy
            switches it to eval mode under ``torch.no_grad()`` while generating and restores its
            mode after), or a hub name / local path for ``AutoModelForCausalLM.from_pretrained``.
        tokenizer: tokenizer object or name/path; default: loaded from ``model_or_path`` (or from
            the model object's ``name_or_path``).
        role: "main", "sub" or "single" (recorded; the stop tags are the same for all roles).
        max_new_tokens: tokens sampled per turn at most.
        temperature: 0 means greedy; else the softmax temperature.
        top_p: nucleus sampling threshold (1.0 = off).
        max_prompt_tokens: longer prompts are not generated for (see the module docstring).
        device: where a model loaded from a path goes ("cpu", "cuda", "cuda:1"); a model object
            stays where it is.
        dtype: torch dtype (or its name) for a model loaded from a path; default float32.
        seed: call ``i`` of this policy samples with seed ``seed + i`` in a forked RNG, so the global
            torch RNG (the learner's) is untouched and runs are reproducible.
        max_batch_size: requests per ``generate`` (None = all of a call at once); chunks are made of
            prompts of similar length.
        logprobs_mode: "processed" (the sampling distribution) or "raw" (``log_softmax(logits)``).
        name: recorded as ``extra["policy"]``; default ``"hf:<name or path>"``.
        kv_cache_mb: memory budget of the KV caches kept between an agent's turns
            (:mod:`mgrpo_algo.policies.kv_cache`: only the new ids are fed at the next turn; least recently
            used caches are evicted past the budget and re-prefilled). 0 turns reuse off. Ignored
            (always re-prefill) for models with sliding-window or linear-attention layers.
        decode: ``"fast"`` (default: :func:`mgrpo_algo.policies.decode.decode`, a sampling loop whose
            one-token steps run through :class:`~mgrpo_algo.policies.fast_step.FastStep` when it
            supports the model: its logits up to float rounding), ``"lean"`` (the same loop through
            :class:`~mgrpo_algo.policies.lean_forward.LeanStep`: bitwise the model's logits),
            ``"forward"`` (the loop over the model's forward) or ``"generate"`` (transformers'
            ``generate``, the reference). With ``sampler="multinomial"``, lean and forward give
            generate's ids and log-probs under a seed. Tokenizers whose stop tags are several tokens
            always use ``generate``.
        sampler: how the loop draws a token: ``"inverse_cdf"`` (default: one uniform per row,
            :func:`mgrpo_algo.policies.decode.inverse_cdf`) or ``"multinomial"`` (as ``generate``:
            its ids under a seed, at the cost of B x V exponentials per step). The same distribution
            either way; ``generate`` always draws with ``torch.multinomial``.
        fast_prefill: with ``decode="fast"``, run each call's prefill (a first turn, or the new ids
            after a kept cache) through :meth:`~mgrpo_algo.policies.fast_step.FastStep.prefill`
            instead of the model's forward (the same logits up to rounding; benchmarks/live_decode.py
            measures what it saves).
        compact: with ``decode="fast"`` and greedy or ``inverse_cdf`` draws, rows that stopped leave
            the decode batch (:func:`mgrpo_algo.policies.decode.decode`): the same ids up to rounding.
    """

    def __init__(
        self,
        model_or_path: Any,
        tokenizer: Any = None,
        *,
        role: str,
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_prompt_tokens: int = 2048,
        device: str | torch.device = "cpu",
        dtype: Any = None,
        seed: int = 0,
        max_batch_size: int | None = None,
        logprobs_mode: str = "processed",
        name: str | None = None,
        kv_cache_mb: float = 1024.0,
        decode: str = "fast",
        sampler: str = "inverse_cdf",
        fast_prefill: bool = True,
        compact: bool = True,
    ) -> None:
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if max_new_tokens < 1 or max_prompt_tokens < 1:
            raise ValueError("max_new_tokens and max_prompt_tokens must be >= 1")
        if logprobs_mode not in ("processed", "raw"):
            raise ValueError(f"logprobs_mode must be 'processed' or 'raw', got {logprobs_mode!r}")
        if decode not in (*STEPS, "generate"):
            raise ValueError(f"decode must be one of {(*STEPS, 'generate')}, got {decode!r}")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        if kv_cache_mb < 0:
            raise ValueError(f"kv_cache_mb must be >= 0, got {kv_cache_mb}")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
        if isinstance(model_or_path, (str, bytes)) or hasattr(model_or_path, "__fspath__"):
            from transformers import AutoModelForCausalLM

            source = str(model_or_path)
            if isinstance(dtype, str):
                dtype = getattr(torch, dtype)
            self.model = AutoModelForCausalLM.from_pretrained(source, **_dtype_kwarg(dtype or torch.float32))
            self.model.to(torch.device(device))
            self.model.eval()
        else:
            self.model = model_or_path
            source = getattr(self.model, "name_or_path", "") or getattr(self.model.config, "_name_or_path", "")
        if tokenizer is None:
            if not source:
                raise ValueError("pass a tokenizer: the model object has no name_or_path to load one from")
            tokenizer = source
        self.tokenizer = load_tokenizer(tokenizer)
        self.role = role
        self.max_new_tokens = int(max_new_tokens)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.seed = int(seed)
        self.max_batch_size = max_batch_size
        self.logprobs_mode = logprobs_mode
        self.decode = decode
        self.sampler = sampler
        self.fast_prefill = bool(fast_prefill)
        self.compact = bool(compact)
        self.name = name or f"hf:{source or type(self.model).__name__}"
        self.prompter = ChatPrompter(self.tokenizer, max_prompt_tokens)
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self.stop = stop_spec(self.tokenizer, getattr(getattr(self.model, "generation_config", None), "eos_token_id", None))
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.stop.token_ids[-1])
        self.calls = 0
        #: ``(rows, steps, width, row-steps run)`` of the last 4,096 decode batches: the shapes the
        #: decoder was fed (benchmarks/live_decode.py replays them as pure decode); row-steps < rows x
        #: steps where stopped rows left the batch (``compact``)
        self.batch_shapes: deque[tuple[int, int, int, int]] = deque(maxlen=4096)
        self._lock = threading.Lock()
        self.kv = KVCacheManager(int(kv_cache_mb * 2**20)) if kv_cache_mb > 0 and supports_reuse(self.model) else None

    def reseed(self, seed: int) -> None:
        """Sample from now on as a fresh policy with ``seed`` would: call ``i`` after this uses
        ``seed + i``, and no KV cache is kept. The loop calls it at the start of every collection
        with :func:`mgrpo_algo.core.seeding.policy_seed`, so sampling is keyed by (seed, role,
        iteration, call) and a re-collected iteration or a restarted server draws the same tokens."""
        with self._lock:
            self.seed = int(seed)
            self.calls = 0
            if self.kv is not None:  # a cache of an aborted collection must not be fed again
                self.kv.clear()

    def release(self, episode: int, agent: str) -> None:
        """Free the KV cache kept for an agent that ended (called by the rollout loop)."""
        if self.kv is not None:
            with self._lock:
                self.kv.release((episode, agent))

    def release_all(self) -> None:
        """Free every kept KV cache."""
        if self.kv is not None:
            with self._lock:
                self.kv.clear()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def prompt_limit(self) -> int:
        limit = self.prompter.max_prompt_tokens
        return min(limit, self.max_positions - 1) if self.max_positions else limit

    def __call__(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        prepared = [self.prompter.prompt(r) for r in requests]
        results: list[tuple[list[int], list[float], str] | None] = [None] * len(prepared)
        todo = [i for i, (ids, _) in enumerate(prepared) if len(ids) <= self.prompt_limit]
        for i, (ids, _) in enumerate(prepared):
            if len(ids) > self.prompt_limit:
                results[i] = ([], [], "prompt_too_long")
        if todo:
            with self._lock:
                seed = self.seed + self.calls
                self.calls += 1
                order = sorted(todo, key=lambda i: len(prepared[i][0]))
                size = self.max_batch_size or len(order)
                for start in range(0, len(order), size):
                    chunk = order[start: start + size]
                    keys = [(requests[i].episode, requests[i].agent) for i in chunk]
                    outs = self._generate([prepared[i][0] for i in chunk], seed + start, keys)
                    for i, out in zip(chunk, outs, strict=True):
                        results[i] = out
        responses = []
        for (prompt, info), out in zip(prepared, results, strict=True):
            assert out is not None
            completion, logprobs, finish = out
            text = self.tokenizer.decode(completion, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            extra = {"prompt_ids": prompt, "completion_ids": completion, "logprobs": logprobs,
                     "policy": self.name, "finish_reason": finish, **info}
            responses.append(PolicyResponse(text, extra))
        return responses

    def _generate(self, prompts: list[list[int]], seed: int,
                  keys: list[tuple[int, str]] | None = None) -> list[tuple[list[int], list[float], str]]:
        """One left-padded batch over ``prompts``: (completion ids, logprobs, finish reason) each.
        With KV reuse, rows whose ``keys`` hold a cache feed only their new ids (see :mod:`.kv_cache`)."""
        device = self.device
        layout = None
        if self.kv is not None:
            layout = self.kv.prepare(self.model, keys or [None] * len(prompts), prompts, self.pad_id)
            input_ids, attention, width = layout.input_ids, layout.attention_mask, layout.width
        else:
            width = max(len(p) for p in prompts)
            input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
            attention = torch.zeros((len(prompts), width), dtype=torch.long)
            for row, ids in enumerate(prompts):
                input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
                attention[row, width - len(ids):] = 1
        new_tokens = self.max_new_tokens
        if self.max_positions:  # from the longest prompt, not the padded width: reuse must not change it
            new_tokens = max(1, min(new_tokens, self.max_positions - max(len(p) for p in prompts)))
        cache_in = layout.cache if layout is not None else None
        model = self.model
        was_training = model.training
        try:
            model.eval()
            if self.decode in STEPS and not self.stop.strings:
                counts: dict[str, int] = {}
                with torch.no_grad(), _seeded(seed, device):
                    generated, logprobs, cache_out = lean_decode(
                        model, input_ids.to(device), attention.to(device), cache_in, max_new_tokens=new_tokens,
                        stop_ids=self.stop.token_ids, pad_id=self.pad_id, temperature=self.temperature,
                        top_p=self.top_p, logprobs_mode=self.logprobs_mode, step=self.decode,
                        sampler=self.sampler, fast_prefill=self.fast_prefill, compact=self.compact, stats=counts)
            else:
                generated, logprobs, cache_out = self._hf_generate(input_ids, attention, cache_in, width, new_tokens, seed)
                counts = {"steps": int(generated.shape[1]), "row_steps": len(prompts) * int(generated.shape[1])}
            self.batch_shapes.append((len(prompts), counts["steps"], int(width), counts["row_steps"]))
        finally:
            model.train(was_training)
        results = []
        for row in range(len(prompts)):
            ids, finish = cut_at_stop(generated[row].tolist(), self.stop, self.tokenizer)
            results.append((ids, [float(x) for x in logprobs[row, : len(ids)]], finish))
        if layout is not None and self.kv is not None:
            self.kv.store(layout, cache_out, prompts, [r[0] for r in results])
        return results

    def _hf_generate(self, input_ids: torch.Tensor, attention: torch.Tensor, cache: Any, width: int,
                     new_tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """transformers' ``generate`` (the reference path): ``(new tokens, their log-probs, cache)``."""
        from transformers import GenerationConfig, LogitsProcessorList

        device = self.device
        greedy = self.temperature == 0
        config = GenerationConfig(
            do_sample=not greedy,
            max_new_tokens=new_tokens,
            eos_token_id=list(self.stop.token_ids),
            pad_token_id=self.pad_id,
            stop_strings=list(self.stop.strings) or None,
            num_beams=1,
            **({} if greedy else {"temperature": 1.0, "top_p": 1.0, "top_k": 0}),
            use_cache=True,
            return_dict_in_generate=True,
        )
        sampler = _Sampler(self.temperature, self.top_p, self.logprobs_mode)
        model = self.model
        saved_config = getattr(model, "generation_config", None)
        try:
            model.generation_config = GenerationConfig()  # neutral defaults: no checkpoint sampling tweaks
            with torch.no_grad(), _seeded(seed, device):
                out = model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention.to(device),
                    generation_config=config,
                    logits_processor=LogitsProcessorList([sampler]),
                    **({"tokenizer": self.tokenizer} if self.stop.strings else {}),
                    **({_cache_kwarg(): cache} if cache is not None else {}),
                )
        finally:
            if saved_config is not None:
                model.generation_config = saved_config
        generated = out.sequences[:, width:].cpu()
        return generated, sampler.finish(generated), getattr(out, _cache_kwarg(), None)


def _dtype_kwarg(dtype: torch.dtype) -> dict[str, Any]:
    """``dtype=`` for transformers >= 4.56 (5.x), ``torch_dtype=`` before."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}
