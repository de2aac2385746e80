"""Text spaces for the protocol.

Observations are ``Dict({"text": Text})`` because PettingZoo's ``api_test`` cannot handle a bare
``Text`` space. The character set is every printable character of Unicode's Basic Multilingual
Plane plus tab and newline, so web text fits without being rewritten; characters outside it are
replaced by U+FFFD (which is in the set) when an observation is built.

:class:`ProtocolText` is the action space. ``contains`` is the strict ``Text`` check (length and
characters); ``sample`` mixes random text (malformed actions, which the env must survive) with
well-formed protocol actions drawn from a small grammar, so that random play in ``api_test`` and
``check_env`` really reaches delegations, tool calls and final answers.
"""

from __future__ import annotations

import copy
import functools
import json
import unicodedata
from typing import Any

import numpy as np
from gymnasium import spaces

from .roles import ROLE_TABLE

__all__ = ["CHARSET", "sanitize", "observation_space", "action_space", "ProtocolText"]


def _charset() -> str:
    chars = ["\t", "\n"]
    for code in range(0x20, 0x10000):
        if 0xD800 <= code <= 0xDFFF:
            continue  # surrogates are not characters
        ch = chr(code)
        if unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn"):
            continue
        chars.append(ch)
    return "".join(chars)


CHARSET = _charset()
_CHARSET_SET = frozenset(CHARSET)
_REPLACEMENT = "\ufffd"


def sanitize(text: str, max_chars: int) -> str:
    """Make ``text`` a member of a Text space of ``max_chars``: foreign characters replaced, cut cleanly."""
    if any(ch not in _CHARSET_SET for ch in text):
        text = "".join(ch if ch in _CHARSET_SET else (" " if ch == "\r" else _REPLACEMENT) for ch in text)
    if len(text) > max_chars:
        note = f"\n[truncated: {len(text) - max_chars} more characters]"
        keep = max(0, max_chars - len(note))
        text = text[:keep] + note[: max_chars - keep]
    return text


class UnicodeText(spaces.Text):
    """A ``Text`` space over :data:`CHARSET` whose ``repr`` is one short line (Gymnasium's lists every
    one of the ~55,000 characters: ``print(env.action_space)`` printed ~60,000 of them)."""

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.min_length}, {self.max_length}, "
                f"charset=<{len(self.character_set)} printable Unicode characters>)")


@functools.lru_cache(maxsize=32)
def _text_prototype(max_chars: int) -> spaces.Text:
    return UnicodeText(max_length=max_chars, min_length=0, charset=CHARSET)


def observation_space(max_chars: int) -> spaces.Dict:
    """``Dict({"text": Text(max_chars)})``. Building a Text space over this charset indexes 55k
    characters (about 50 ms), so each new space is a shallow copy of a cached prototype: the
    read-only character tables are shared, the random generator is the copy's own."""
    return spaces.Dict({"text": copy.copy(_text_prototype(max_chars))})


_WORDS = ("who", "founded", "born", "year", "Velmora", "press", "river", "the", "of", "works", "where", "city")


def action_space(max_chars: int, role: str) -> ProtocolText:
    """A :class:`ProtocolText` for ``role``: a shallow copy of a cached prototype (see observation_space)."""
    return copy.copy(_action_prototype(max_chars, role))


@functools.lru_cache(maxsize=32)
def _action_prototype(max_chars: int, role: str) -> ProtocolText:
    return ProtocolText(max_chars, role)


class ProtocolText(UnicodeText):
    """A Text action space whose samples are half protocol actions for ``role``, half random text.

    Args:
        max_length: the action character limit.
        role: a role of ``mgrpo_env.roles.ROLE_TABLE`` (which grammar ``sample`` draws from: the main
            agent's, or a tool user's ending with its final tag).
        protocol_share: share of samples that are well-formed actions.
    """

    def __init__(self, max_length: int, role: str, protocol_share: float = 0.5, seed: int | None = None) -> None:
        if role not in ROLE_TABLE:
            raise ValueError(f"role must be one of {tuple(ROLE_TABLE)}, got {role!r}")
        super().__init__(max_length=max_length, min_length=0, charset=CHARSET, seed=seed)
        self.role = role
        self.protocol_share = protocol_share

    def _words(self, n: int) -> str:
        idx = self.np_random.integers(0, len(_WORDS), size=n)
        return " ".join(_WORDS[i] for i in idx)

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"<think>{self._words(3)}</think><tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is not None or probability is not None or self.np_random.random() >= self.protocol_share:
            # random text, short enough to be cheap; still a member of the space
            length = int(self.np_random.integers(0, min(self.max_length, 64) + 1))
            chars = self.np_random.choice(np.array(list(CHARSET[:200])), size=length)
            return "".join(chars.tolist())
        r = self.np_random.random()
        if self.role == "main":
            if r < 0.7:
                action = self._call("delegate", {"task": self._words(5), "context": self._words(2)})
            else:
                action = f"<think>done</think><answer>{self._words(2)}</answer>"
        else:
            if r < 0.45:
                action = self._call("search", {"queries": [self._words(2)]})
            elif r < 0.55:
                action = self._call("visit", {"url": "http://127.0.0.1:9/nowhere", "goal": self._words(2)})
            elif r < 0.65:
                action = self._call("click", {"link": int(self.np_random.integers(1, 5))})
            else:
                tag = ROLE_TABLE[self.role].final_tag
                action = f"<think>ok</think><{tag}>{self._words(2)}</{tag}>"
        return action[: self.max_length]
