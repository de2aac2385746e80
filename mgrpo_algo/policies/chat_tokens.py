"""Token-in/token-out chat prompts and where a turn stops: what the Transformers and HTTP policies share.

Prompts (:class:`ChatPrompter`, shared with the HTTP policy):

- first turn: the chat template applied to ``request.messages`` with the generation prompt;
- later turns: the previous turn's ``prompt_ids + completion_ids`` followed by the tokenised
  continuation - what the chat template writes after an assistant message's content when the new
  user message(s) follow, generation prompt included (for ChatML:
  ``<|im_end|>\\n<|im_start|>user\\n{observation}<|im_end|>\\n<|im_start|>assistant\\n``). The
  continuation is derived from the template itself (rendered around a marker), so Qwen3- or
  Llama-style templates work too. When the completion already ends with the token the
  continuation starts with (the model sampled ``<|im_end|>``), it is not repeated. The ids never
  come from re-tokenising earlier text, so prompts nest exactly and
  :func:`mgrpo_algo.core.sequences.trajectory_sequence` accepts them.
- a prompt longer than ``max_prompt_tokens`` is not cut (cutting would break the nesting the
  trainer relies on, and hide the problem): the policy does not generate and answers the empty
  text, which the env counts as a malformed turn (format failure) - the agent is stopped by its
  turn limit without spending generation on it, and ``finish_reason`` says ``prompt_too_long``.

Stopping: on the ids of ``</tool_call>``, ``</answer>``, ``</result>`` when each is one token (as with
:mod:`mgrpo_algo.policies.models` tokenizers), plus ``<|im_end|>`` and the eos ids; tags that are several
tokens in a hub tokenizer become HF ``stop_strings``. The completion keeps the stop token (and its
text); everything after it (padding) is dropped.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mgrpo_env.rollout import PolicyRequest

__all__ = ["STOP_TAGS", "load_tokenizer", "ChatPrompter", "StopSpec", "stop_spec", "cut_at_stop"]

#: Closing tags that end an agent's turn (one action per turn).
STOP_TAGS = ("</tool_call>", "</answer>", "</result>")
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")
_MARKER = "\u2063MGRPO-ASSISTANT-CONTENT\u2063"


@functools.cache
def load_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer object as is; a hub name or a path through ``AutoTokenizer.from_pretrained``."""
    if isinstance(tokenizer, str) or hasattr(tokenizer, "__fspath__"):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(tokenizer))
    return tokenizer


# --------------------------------------------------------------------------- prompts


class ChatPrompter:
    """Builds token-in/token-out prompt ids for requests from a tokenizer's chat template.

    Args:
        tokenizer: a transformers tokenizer with a ``chat_template``.
        max_prompt_tokens: prompts longer than this are flagged (see :meth:`prompt`).
    """

    def __init__(self, tokenizer: Any, max_prompt_tokens: int = 2048) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat_template: token-in/token-out prompts need one")
        self.tokenizer = tokenizer
        self.max_prompt_tokens = int(max_prompt_tokens)

    def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def first_prompt(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The template over the whole chat with the generation prompt, tokenised."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def continuation(self, completion_ids: Sequence[int], new_messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The ids the template adds after an assistant turn's content for ``new_messages``.

        Rendered as ``[system, user, assistant(MARKER), *new_messages]`` with the generation prompt;
        the text after the marker is what follows any assistant content. If the completion ends
        with the continuation's first token (e.g. a sampled ``<|im_end|>``), that token is dropped.
        """
        chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": _MARKER}, *[dict(m) for m in new_messages]]
        text = self.render(chat, add_generation_prompt=True)
        if text.count(_MARKER) != 1:
            raise ValueError("the chat template does not render assistant content verbatim; cannot derive turns")
        ids = self.encode(text.split(_MARKER, 1)[1])
        if completion_ids and ids and completion_ids[-1] == ids[0]:
            ids = ids[1:]
        return ids

    def prompt(self, request: PolicyRequest) -> tuple[list[int], dict[str, Any]]:
        """``(prompt_ids, info)`` for a request; ``info["retokenized"]`` when the history had no ids
        (earlier turns came from another policy: the sequence cannot nest and is not trainable)."""
        messages = list(request.messages)
        last = request.history[-1] if request.history else None
        if last is None:
            return self.first_prompt(messages), {}
        cut = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if last.get("prompt_ids") is None or last.get("completion_ids") is None or cut is None:
            return self.first_prompt(messages), {"retokenized": True}
        completion = list(last["completion_ids"])
        return list(last["prompt_ids"]) + completion + self.continuation(completion, messages[cut + 1:]), {}


# --------------------------------------------------------------------------- stopping


@dataclass(frozen=True)
class StopSpec:
    """Stop tokens (one id each) and stop strings (tags that are several tokens)."""

    token_ids: tuple[int, ...]
    strings: tuple[str, ...]


def stop_spec(tokenizer: Any, extra_eos: Sequence[int] | int | None = None, tags: Sequence[str] = STOP_TAGS) -> StopSpec:
    """The stop ids and strings for ``tokenizer``: each tag in ``tags`` that encodes to one token is a
    stop id, the others stop strings; plus end-of-turn tokens, eos and ``extra_eos`` (e.g. the model's
    ``generation_config.eos_token_id``)."""
    ids: list[int] = []
    strings: list[str] = []
    for tag in tags:
        enc = tokenizer(tag, add_special_tokens=False)["input_ids"]
        if len(enc) == 1:
            ids.append(int(enc[0]))
        else:
            strings.append(tag)
    vocab = tokenizer.get_vocab()
    for token in (*_END_OF_TURN, tokenizer.eos_token):
        if token is not None and token in vocab:
            ids.append(int(vocab[token]))
    if isinstance(extra_eos, int):
        extra_eos = [extra_eos]
    ids.extend(int(i) for i in extra_eos or [])
    return StopSpec(tuple(dict.fromkeys(ids)), tuple(strings))


def cut_at_stop(ids: Sequence[int], spec: StopSpec, tokenizer: Any = None) -> tuple[list[int], str]:
    """``ids`` up to and including the first stop (a stop id, or the token completing a stop string);
    returns ``(kept_ids, "stop" | "length")``."""
    ids = [int(i) for i in ids]
    stops = set(spec.token_ids)
    end = next((i + 1 for i, t in enumerate(ids) if t in stops), None)
    if spec.strings and tokenizer is not None:
        head = ids[: end or len(ids)]
        if any(s in tokenizer.decode(head, skip_special_tokens=False) for s in spec.strings):
            lo, hi = 1, len(head)  # smallest prefix whose text holds a stop string
            while lo < hi:
                mid = (lo + hi) // 2
                if any(s in tokenizer.decode(head[:mid], skip_special_tokens=False) for s in spec.strings):
                    hi = mid
                else:
                    lo = mid + 1
            end = lo
    return (ids[:end], "stop") if end is not None else (ids, "length")
