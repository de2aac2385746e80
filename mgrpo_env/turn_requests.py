"""What crosses to a role worker for one turn: only what is new (the turn's new messages and an
episode key), never the whole chat nor the task with its gold answer.

The loop's side (:class:`TurnSender`) turns each :class:`~mgrpo_env.rollout.PolicyRequest` into a
:class:`TurnRequest` holding the messages the worker has not seen; the worker's side
(:class:`ChatKeeper`) keeps each agent's chat, appends them, and rebuilds the request its policy
reads (messages whole, ``task`` None: a learned policy must not read it). The worker appends the
text it answered itself, so after the first turn a request carries the tool response only: the
bytes per turn do not grow with the number of turns (``benchmarks/request_bytes.py``).

Both sides drop an agent's chat when it is released (the collection releases every agent once its
episode ends) or when a collection or evaluation begins again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .rollout import PolicyRequest

__all__ = ["ChatKeeper", "TurnRequest", "TurnSender"]


@dataclass
class TurnRequest:
    """One agent's turn as it crosses the worker boundary.

    Attributes:
        episode: index of the episode in this collection; with ``agent``, the key of the agent's chat.
        agent: "main_0", "sub_3", ...
        role: the agent's role.
        start: where ``new_messages`` begin in the agent's chat (the worker checks that it holds
            exactly that many messages: a lost or repeated turn fails loudly instead of prompting
            the model with a wrong chat).
        new_messages: the chat's messages the worker has not seen (the system prompt and the first
            user message at the first turn, then the tool response).
    """

    episode: int
    agent: str
    role: str
    start: int
    new_messages: list[dict[str, str]]


class TurnSender:
    """The loop's side: how much of each agent's chat its worker already holds."""

    def __init__(self) -> None:
        self.sent: dict[tuple[int, str], int] = {}

    def compact(self, requests: Sequence[PolicyRequest]) -> list[TurnRequest]:
        """The requests as they cross: the new messages of each, with its episode key."""
        out = []
        for request in requests:
            start = self.sent.get((request.episode, request.agent), 0)
            out.append(TurnRequest(request.episode, request.agent, request.role, start,
                                   [dict(m) for m in request.messages[start:]]))
        return out

    def answered(self, requests: Sequence[PolicyRequest]) -> None:
        """The worker answered: it holds each chat and the answer it appends (the env appends the same
        assistant message)."""
        for request in requests:
            self.sent[(request.episode, request.agent)] = len(request.messages) + 1

    def release(self, episode: int, agent: str) -> None:
        self.sent.pop((episode, agent), None)


class ChatKeeper:
    """The worker's side: each agent's chat, grown by the requests' new messages and its own answers."""

    def __init__(self) -> None:
        self.chats: dict[tuple[int, str], list[dict[str, str]]] = {}

    def expand(self, turn: TurnRequest, history: list[dict[str, Any]]) -> PolicyRequest:
        """The whole request the policy reads (``history``: the token extras this worker kept)."""
        chat = self.chats.setdefault((turn.episode, turn.agent), [])
        if turn.start != len(chat):
            raise ValueError(f"episode {turn.episode} {turn.agent}: the request's new messages start at "
                             f"{turn.start}, the worker holds {len(chat)} messages of its chat")
        chat.extend(turn.new_messages)
        observation = chat[-1]["content"] if chat else ""
        return PolicyRequest(turn.episode, turn.agent, turn.role, observation, list(chat), None, history)

    def answered(self, requests: Sequence[PolicyRequest], texts: Sequence[str]) -> None:
        """Append each answer to its chat, as the env appends it."""
        for request, text in zip(requests, texts, strict=True):
            self.chats[(request.episode, request.agent)].append({"role": "assistant", "content": text})

    def release(self, episode: int, agent: str) -> None:
        self.chats.pop((episode, agent), None)

    def clear(self) -> None:
        self.chats.clear()
