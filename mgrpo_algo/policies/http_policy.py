"""A policy served by an OpenAI-compatible ``/v1/completions`` endpoint (vLLM), token-in/token-out.

:class:`OpenAICompatiblePolicy` builds the prompt ids itself (the same
:class:`mgrpo_algo.policies.chat_tokens.ChatPrompter` as the in-process policy, so turns nest), sends them
as token ids, and reads back the exact sampled ids and their log-probabilities. One HTTP request
per agent request, run concurrently in a thread pool (the server batches them).

Request body (vLLM's ``CompletionRequest``; fields other servers do not know are ignored by most):

=================================  ===========================================================
``model``                          the served model name
``prompt``                         the prompt as a list of token ids (no re-tokenisation)
``max_tokens``, ``n=1``            tokens per turn at most; one sample per request
``temperature``, ``top_p``         the sampling distribution (temperature 0 = greedy)
``top_k=-1``, ``min_p=0``,         neutralised explicitly: vLLM fills unset fields from the
``repetition_penalty=1``,          model's ``generation_config.json`` (e.g. Qwen's top_k=20) and
``presence_penalty=0``,            the learner assumes plain temperature + top-p. ``-1`` is the
``frequency_penalty=0``            "off" value old and new vLLM versions accept.
``seed``                           ``seed + call * 1_000_003 + index`` when a seed is given
``logprobs=0``                     return the sampled token's logprob (no alternatives)
``stop_token_ids``                 ids of the stop tags that are one token, ``<|im_end|>``, eos
``stop``                           stop tags that are several tokens in this tokenizer
``include_stop_str_in_output``     true: the closing tag stays in the output
``skip_special_tokens``            false, and ``spaces_between_special_tokens`` false
``return_tokens_as_token_ids``     true: ``logprobs.tokens`` are ``"token_id:N"``
``return_token_ids``               true (vLLM >= 0.10.2): ``choices[0].token_ids`` and
                                   ``prompt_token_ids`` (checked against what was sent)
=================================  ===========================================================

Response fields read: ``choices[0].token_ids`` (else the ids in ``logprobs.tokens``),
``choices[0].logprobs.token_logprobs`` and ``finish_reason``. The text given to the env is the
tokenizer's decoding of the completion ids (special tokens kept), so text and ids always agree.

Log-probabilities: vLLM reports them under its ``--logprobs-mode`` (default ``raw_logprobs``:
``log_softmax(logits)`` before temperature and top-p). Start the server with
``--logprobs-mode processed_logprobs`` to get the sampling distribution's, as
:class:`mgrpo_algo.policies.hf_policy.TransformersPolicy` does by default. vLLM clamps ``-inf`` to -9999.

Errors: connection errors, timeouts, HTTP 408/429/5xx and unparsable bodies are retried with
exponential backoff, ``max_retries`` times or for ``wait_s`` seconds, whichever lasts longer; other
HTTP statuses (a 400 for a bad field, 404 for a wrong model name) fail at once. Either way the call
raises :class:`PolicyError` with the status and the start of the body. With ``wait_s > 0`` the first
retry of a batch prints one line (what failed, how long it will wait), not one per request. With an ``engine`` (a
:class:`mgrpo_algo.policies.vllm_server.VLLMServer` this run started), a connection error or a
timeout first asks it to restart the server if it died or hung (``engine.ensure_up``), then retries:
a rollout in flight when its server is SIGKILLed resumes on the restarted server (same prompt ids,
same seed), nothing of the episode is lost.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from mgrpo_env.rollout import PolicyRequest, PolicyResponse

from .chat_tokens import ChatPrompter, load_tokenizer, stop_spec

__all__ = ["PolicyError", "OpenAICompatiblePolicy", "completions_url"]

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class PolicyError(RuntimeError):
    """A policy could not produce a response (server unreachable, HTTP error, malformed reply)."""


def completions_url(base_url: str) -> str:
    """``http://h:8000`` or ``http://h:8000/v1`` (or the full URL) -> ``http://h:8000/v1/completions``."""
    url = base_url.rstrip("/")
    if url.endswith("/completions"):
        return url
    return f"{url}/completions" if url.endswith("/v1") else f"{url}/v1/completions"


class OpenAICompatiblePolicy:
    """A :class:`mgrpo_env.rollout.Policy` that samples from an OpenAI-compatible completions server.

    Args:
        base_url: the server (``http://127.0.0.1:8000`` or ``.../v1``).
        model: the served model name (vLLM's ``--served-model-name`` or the model path).
        role: "main", "sub" or "single" (recorded).
        tokenizer: the served model's tokenizer (object or name/path), for the prompt ids and to
            decode completions.
        max_new_tokens, temperature, top_p: sampling (temperature 0 = greedy).
        max_prompt_tokens: longer prompts are not sent; the response is the empty text (a format
            failure for the env), ``finish_reason="prompt_too_long"`` - as in TransformersPolicy.
        api_key: sent as ``Authorization: Bearer``; default ``$OPENAI_API_KEY`` (none if unset).
        timeout_s: per HTTP request.
        max_retries: retries after the first attempt for transient failures.
        max_concurrency: HTTP requests in flight at once.
        seed: per-request seeds for reproducible sampling (None = the server's randomness).
        backoff_s: first retry delay (doubles each retry, capped at 10 s).
        extra_body: more fields for every request body (overrides the defaults above).
        name: recorded as ``extra["policy"]``; default ``"http:<model>"``.
        trust_env: let httpx read proxy settings from the environment (``HTTP_PROXY``, ``NO_PROXY``).
        transport: an ``httpx`` transport (tests); default a real connection pool.
        wait_s: keep retrying transient failures for this long (a server restarting or overloaded).
        engine: the server's supervisor (``ensure_up(problem) -> str``), asked after a connection
            error or timeout; None: an external server (the policy only waits for it).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        role: str,
        tokenizer: Any,
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_prompt_tokens: int = 2048,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        max_concurrency: int = 32,
        seed: int | None = None,
        backoff_s: float = 0.5,
        extra_body: Mapping[str, Any] | None = None,
        name: str | None = None,
        trust_env: bool = True,
        transport: httpx.BaseTransport | None = None,
        wait_s: float = 0.0,
        engine: Any = None,
    ) -> None:
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if max_retries < 0 or max_concurrency < 1 or max_new_tokens < 1:
            raise ValueError("max_retries must be >= 0, max_concurrency and max_new_tokens >= 1")
        self.url = completions_url(base_url)
        self.model = model
        self.role = role
        self.tokenizer = load_tokenizer(tokenizer)
        self.prompter = ChatPrompter(self.tokenizer, max_prompt_tokens)
        self.stop = stop_spec(self.tokenizer)
        self.max_new_tokens = int(max_new_tokens)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.max_retries = int(max_retries)
        self.max_concurrency = int(max_concurrency)
        self.seed = seed
        self.backoff_s = float(backoff_s)
        self.extra_body = dict(extra_body or {})
        self.name = name or f"http:{model}"
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(timeout=timeout_s, headers=headers, transport=transport, trust_env=trust_env)
        self._calls = itertools.count()
        self.wait_s = float(wait_s)
        self.engine = engine
        self._outage_lock = threading.Lock()
        self._outage = False  # an outage is announced once, not once per request thread
        self.outages: list[str] = []  # the one line of each outage (tests, logs)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAICompatiblePolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def body(self, prompt_ids: Sequence[int], seed: int | None = None) -> dict[str, Any]:
        """The JSON body for one prompt (see the module docstring for each field)."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": [int(i) for i in prompt_ids],
            "max_tokens": self.max_new_tokens,
            "n": 1,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "logprobs": 0,
            "stop_token_ids": list(self.stop.token_ids),
            "stop": list(self.stop.strings),
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        }
        if seed is not None:
            body["seed"] = int(seed)
        body.update(self.extra_body)
        return body

    def __call__(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        call = next(self._calls)
        self._outage = False  # one line per batch that meets an outage, whatever its number of requests
        prepared = [self.prompter.prompt(r) for r in requests]

        def one(index: int) -> tuple[list[int], list[float], str]:
            prompt = prepared[index][0]
            if len(prompt) > self.prompter.max_prompt_tokens:
                return [], [], "prompt_too_long"
            seed = None if self.seed is None else self.seed + call * 1_000_003 + index
            return self._complete(prompt, seed)

        if len(prepared) <= 1:
            outs = [one(i) for i in range(len(prepared))]
        else:
            with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(prepared))) as pool:
                outs = list(pool.map(one, range(len(prepared))))
        responses = []
        for (prompt, info), (ids, logprobs, finish) in zip(prepared, outs, strict=True):
            text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            responses.append(PolicyResponse(text, {"prompt_ids": prompt, "completion_ids": ids, "logprobs": logprobs,
                                                   "policy": self.name, "finish_reason": finish, **info}))
        return responses

    # -- one HTTP exchange -------------------------------------------------------------------

    def _complete(self, prompt: list[int], seed: int | None) -> tuple[list[int], list[float], str]:
        body = self.body(prompt, seed)
        problem = ""
        start = time.monotonic()
        attempt = 0
        recovered = False  # the engine was (re)started: retry at once, its own line said what happened
        while attempt <= self.max_retries or time.monotonic() - start < self.wait_s:
            if attempt and not recovered:
                self._announce(problem)
                time.sleep(min(10.0, self.backoff_s * 2 ** (attempt - 1)))
            attempt, recovered = attempt + 1, False
            try:
                reply = self._client.post(self.url, content=json.dumps(body))
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                if self.engine is not None:  # still starting, dead or hung: waited for or restarted
                    recovered = self.engine.ensure_up(problem) != "up"
                continue
            snippet = reply.text[:300]
            if reply.status_code != 200:
                problem = f"HTTP {reply.status_code} from {self.url}: {snippet}"
                if reply.status_code in _RETRY_STATUS:
                    continue
                raise PolicyError(problem)
            try:
                parsed = self._parse(reply.json(), prompt)
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                problem = f"malformed reply from {self.url} ({type(exc).__name__}: {exc}): {snippet}"
                continue
            return parsed
        raise PolicyError(f"{problem} (after {attempt} attempts, {time.monotonic() - start:.0f} s)")

    def _announce(self, problem: str) -> None:
        """The one line of an outage, printed by the first request thread that retries."""
        if self.wait_s <= 0:
            return
        with self._outage_lock:
            if self._outage:
                return
            self._outage = True
        line = (f"served engine {self.role}: {' '.join(problem.split())[:160]}; retrying for up to "
                f"{self.wait_s:.0f} s")
        self.outages.append(line)
        print(line, flush=True)

    @staticmethod
    def _parse(data: Any, prompt: list[int]) -> tuple[list[int], list[float], str]:
        """(completion ids, logprobs, finish reason) from a completions response body."""
        choice = data["choices"][0]
        sent = choice.get("prompt_token_ids")
        if sent is not None and list(sent) != prompt:
            raise ValueError("the server's prompt_token_ids differ from the ids sent")
        lp = choice.get("logprobs")
        if not isinstance(lp, dict) or lp.get("token_logprobs") is None:
            raise ValueError("no logprobs in the choice (the server ignored logprobs=0)")
        ids = choice.get("token_ids")
        if ids is None:
            tokens = lp.get("tokens") or []
            if not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
                raise ValueError("tokens are not 'token_id:N' strings (the server ignored return_tokens_as_token_ids)")
            ids = [int(t.split(":", 1)[1]) for t in tokens]
        ids = [int(i) for i in ids]
        logprobs = [float(x) if x is not None else float("nan") for x in lp["token_logprobs"]]
        if len(logprobs) != len(ids):
            raise ValueError(f"{len(logprobs)} logprobs for {len(ids)} tokens")
        finish = str(choice.get("finish_reason") or "stop")
        return ids, logprobs, finish
